//! A `KubeletConfiguration` file (`kubelet.config.k8s.io/v1beta1`, YAML or JSON: YAML is a
//! superset of JSON, so one parser reads both) and the drop-in merge of KEP-3983, as the kubelet
//! does them: each drop-in is a JSON merge patch (RFC 7386) on the configuration so far, in the
//! order the kubelet walks the directory — objects merge key by key (`featureGates`,
//! `systemReserved`, `topologyManagerPolicyOptions`), lists are replaced whole
//! (`reservedMemory`), `null` removes. Fields this agent does not read are ignored, as the
//! kubelet's lenient decoding ignores unknown ones; a field it reads with the wrong type is an
//! error naming the file and the field. Pure: the caller reads the files ([`super::discovery`]).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde_json::{Map, Value};

use super::settings::{FIELDS, Layer, LayerError, Source, type_of};

const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
const KIND: &str = "KubeletConfiguration";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileError {
    #[error("{path}: not YAML or JSON: {detail}")]
    Syntax { path: PathBuf, detail: String },
    #[error("{path}: expected a KubeletConfiguration object, found {found}")]
    NotAnObject { path: PathBuf, found: &'static str },
    #[error("{path}: {field} is {found:?}, expected {expected:?}")]
    Kind {
        path: PathBuf,
        field: &'static str,
        found: String,
        expected: &'static str,
    },
    #[error("{path}: {source}")]
    Field {
        path: PathBuf,
        #[source]
        source: LayerError,
    },
}

/// One file, read: its fields as the kubelet would merge them.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigFile {
    /// The host path (as the kubelet names it).
    pub path: PathBuf,
    /// The object, every field kept (the merge is on the whole object).
    pub object: Map<String, Value>,
}

/// Parses one file's text; `path` is named in every error.
pub fn parse(path: &Path, text: &str) -> Result<ConfigFile, FileError> {
    let value: Value = serde_norway::from_str(text).map_err(|e| FileError::Syntax {
        path: path.to_owned(),
        detail: e.to_string(),
    })?;
    let Value::Object(object) = value else {
        return Err(FileError::NotAnObject {
            path: path.to_owned(),
            found: type_of(&value),
        });
    };
    for (field, expected) in [("apiVersion", API_VERSION), ("kind", KIND)] {
        let found = object.get(field).and_then(Value::as_str).unwrap_or("");
        if found != expected {
            return Err(FileError::Kind {
                path: path.to_owned(),
                field,
                found: found.to_owned(),
                expected,
            });
        }
    }
    // Checked on its own, so that an error names this file rather than the merge.
    Layer::from_object(&object).map_err(|source| FileError::Field {
        path: path.to_owned(),
        source,
    })?;
    Ok(ConfigFile {
        path: path.to_owned(),
        object,
    })
}

/// RFC 7386: `patch` onto `target`.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

/// The configuration file (if any) with the drop-ins merged over it in order, as one layer: each
/// field's value as merged, and as its source the last file that set it.
pub fn merge(base: Option<&ConfigFile>, drop_ins: &[ConfigFile]) -> Result<Layer, FileError> {
    let mut merged = Value::Object(Map::new());
    let mut sources: BTreeMap<&'static str, Source> = BTreeMap::new();
    let files = base
        .map(|f| (f, Source::File(f.path.clone())))
        .into_iter()
        .chain(drop_ins.iter().map(|f| (f, Source::DropIn(f.path.clone()))));
    for (file, source) in files {
        for field in FIELDS {
            match file.object.get(field) {
                Some(Value::Null) => {
                    sources.remove(field);
                }
                Some(_) => {
                    sources.insert(field, source.clone());
                }
                None => {}
            }
        }
        merge_patch(&mut merged, &Value::Object(file.object.clone()));
    }
    let last = drop_ins.last().or(base).map(|f| f.path.clone());
    let object = match merged {
        Value::Object(object) => object,
        _ => Map::new(),
    };
    let mut layer = Layer::from_object(&object).map_err(|source| FileError::Field {
        path: last.unwrap_or_default(),
        source,
    })?;
    layer.set_sources(&sources);
    Ok(layer)
}
