//! `KubeletConfiguration` files and their drop-ins (`kubeletconfig/file.rs`), YAML or JSON, any
//! text: the input split at 0xff bytes (which UTF-8 text never holds) into up to four files,
//! the first the configuration file when the first byte is even, else every one a drop-in. Each
//! file's refusal starts with its path and, for a field, names one the agent reads
//! (`reservedMemory[0].limits.memory`, `featureGates.X`, …); merged, a field's source is a file
//! given, a refusal names the last file; settings that resolve, printed as the agent shows them
//! and read back as the kubelet's flags, are the same.
#![no_main]

#[path = "common/kubelet_settings.rs"]
mod kubelet_settings;

use std::path::{Path, PathBuf};

use hugepage_agent::kubeletconfig::{
    file::{self, ConfigFile, FileError},
    settings::{FIELDS, KubeletSettings, LayerError, Source},
};
use libfuzzer_sys::fuzz_target;

const BASE: &str = "/var/lib/kubelet/config.yaml";
const MAX_FILES: usize = 4;

/// A field error names a field the agent reads, or a part of one.
fn names_a_field(e: &LayerError) {
    let known = FIELDS.iter().any(|f| {
        e.field == *f
            || e.field.starts_with(&format!("{f}."))
            || e.field.starts_with(&format!("{f}["))
    });
    assert!(known, "{e}: {:?} is not a field read", e.field);
}

fn parse(path: &Path, text: &str) -> Option<ConfigFile> {
    match file::parse(path, text) {
        Ok(file) => {
            assert_eq!(file.path, path);
            Some(file)
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                message.starts_with(&format!("{}: ", path.display())),
                "{message:?} does not start with the file"
            );
            if let FileError::Field { source, .. } = &e {
                names_a_field(source);
            }
            None
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let mut texts = Vec::new();
    for part in rest.split(|&b| b == 0xff).take(MAX_FILES) {
        let Ok(text) = std::str::from_utf8(part) else {
            return;
        };
        texts.push(text);
    }
    let with_base = first & 1 == 0;
    let paths: Vec<PathBuf> = (0..texts.len())
        .map(|i| match i {
            0 if with_base => PathBuf::from(BASE),
            _ => PathBuf::from(format!(
                "/etc/kubernetes/kubelet.conf.d/{i:02}-drop-in.conf"
            )),
        })
        .collect();
    let mut files = Vec::new();
    for (path, text) in paths.iter().zip(&texts) {
        // Every file is parsed (each refusal checked); the merge needs them all.
        files.push(parse(path, text));
    }
    let Some(files) = files.into_iter().collect::<Option<Vec<ConfigFile>>>() else {
        return;
    };
    let (base, drop_ins) = match files.split_first() {
        Some((base, drop_ins)) if with_base => (Some(base), drop_ins),
        _ => (None, files.as_slice()),
    };
    let layer = match file::merge(base, drop_ins) {
        Ok(layer) => layer,
        Err(e) => {
            let FileError::Field { path, source } = &e else {
                panic!("a merge of files that parse refused as {e}");
            };
            assert_eq!(Some(path), paths.last(), "{e}: not the last file");
            names_a_field(source);
            return;
        }
    };
    let given = |source: &Source| match source {
        Source::File(path) => with_base && path == &paths[0],
        Source::DropIn(path) => paths.contains(path) && !(with_base && path == &paths[0]),
        _ => false,
    };
    let sources = [
        layer.policy.as_ref().map(|s| &s.source),
        layer.scope.as_ref().map(|s| &s.source),
        layer.options.as_ref().map(|s| &s.source),
        layer.memory_manager_policy.as_ref().map(|s| &s.source),
        layer.reserved_memory.as_ref().map(|s| &s.source),
        layer.system_reserved.as_ref().map(|s| &s.source),
        layer.kube_reserved.as_ref().map(|s| &s.source),
    ];
    for source in sources.into_iter().flatten() {
        assert!(given(source), "a field set by {source}, not a file given");
    }
    for gate in layer.gates.values() {
        assert!(given(&gate.source), "a gate set by {}", gate.source);
    }
    kubelet_settings::round_trip(&KubeletSettings::resolve(&[&layer]));
});
