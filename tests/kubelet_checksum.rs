//! The kubelet's Memory Manager checkpoint checksum, checked against an independent peer: the
//! real go-spew (Debian's `golang-github-davecgh-go-spew-dev`) and Go's `encoding/json`, through
//! the kubelet's own structs, type names and hash configuration (`tests/kubelet-checksum`).
//! Hundreds of generated checkpoints — nil and empty maps and lists, absent fields, pointers to
//! nothing, both formats — must hash alike, and each side must accept what the other writes.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use hugepage_agent::memorymanager::checkpoint::{self, Format, Verification, Version};
use hugepage_agent_tests::rng::Rng;
use serde_json::{Map, Value, json};

/// Builds the Go peer once into `dir`.
fn peer(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("kubelet-checksum");
    let binary = dir.join("kubeletchecksum");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg("kubeletchecksum")
        .env("GO111MODULE", "off")
        .env("GOPATH", format!("/usr/share/gocode:{}", source.display()))
        .env("GOCACHE", dir.join("gocache"))
        .status()
        .unwrap_or_else(|e| panic!("running go (installed by `cargo xtask setup`): {e}"));
    assert!(status.success(), "building the Go peer failed");
    binary
}

fn run(peer: &Path, args: &[&str], files: &[PathBuf]) -> Vec<String> {
    let out = Command::new(peer)
        .args(args)
        .args(files)
        .output()
        .expect("run the Go peer");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Absent (None), null, or the value.
fn maybe(rng: &mut Rng, value: Value) -> Option<Value> {
    match rng.below(6) {
        0 => None,
        1 => Some(Value::Null),
        _ => Some(value),
    }
}

fn ints(rng: &mut Rng) -> Value {
    let n = rng.below(4);
    Value::Array((0..n).map(|_| json!(rng.below(8))).collect())
}

fn blocks(rng: &mut Rng) -> Value {
    let n = rng.below(3);
    let kinds = ["memory", "hugepages-2Mi", "hugepages-1Gi"];
    Value::Array(
        (0..n)
            .map(|_| {
                let mut b = Map::new();
                let affinity = ints(rng);
                if let Some(v) = maybe(rng, affinity) {
                    b.insert("numaAffinity".into(), v);
                }
                b.insert("type".into(), json!(kinds[rng.below(3) as usize]));
                b.insert("size".into(), json!(rng.below(1 << 40)));
                Value::Object(b)
            })
            .collect(),
    )
}

fn state(rng: &mut Rng, pod_entries: bool) -> Value {
    let mut machine = Map::new();
    for node in 0..rng.below(12) {
        let mut tables = Map::new();
        for resource in ["memory", "hugepages-2Mi", "hugepages-1Gi"] {
            if rng.below(4) == 0 {
                continue;
            }
            let t = json!({"total": rng.next_u64() >> 4, "systemReserved": rng.below(1 << 30),
                "allocatable": rng.next_u64() >> 4, "reserved": rng.below(1 << 35), "free": rng.next_u64() >> 4});
            tables.insert(
                resource.into(),
                if rng.below(10) == 0 { Value::Null } else { t },
            );
        }
        let mut n = Map::new();
        n.insert("numberOfAssignments".into(), json!(rng.below(5)));
        if let Some(v) = maybe(rng, Value::Object(tables)) {
            n.insert("memoryMap".into(), v);
        }
        let cells = ints(rng);
        if let Some(v) = maybe(rng, cells) {
            n.insert("cells".into(), v);
        }
        machine.insert(node.to_string(), Value::Object(n));
    }
    let mut entries = Map::new();
    for pod in 0..rng.below(3) {
        let mut containers = Map::new();
        for c in 0..rng.below(3) {
            let value = if rng.below(8) == 0 {
                Value::Null
            } else {
                blocks(rng)
            };
            containers.insert(format!("c{c}"), value);
        }
        entries.insert(format!("pod-{pod}"), Value::Object(containers));
    }
    let mut top = Map::new();
    top.insert("policyName".into(), json!("Static"));
    top.insert("machineState".into(), Value::Object(machine));
    if let Some(v) = maybe(rng, Value::Object(entries)) {
        top.insert("entries".into(), v);
    }
    if pod_entries {
        let mut pods = Map::new();
        for pod in 0..rng.below(3) {
            let mut e = Map::new();
            let memory_blocks = blocks(rng);
            if let Some(v) = maybe(rng, memory_blocks) {
                e.insert("memoryBlocks".into(), v);
            }
            pods.insert(format!("pod-{pod}"), Value::Object(e));
        }
        if let Some(v) = maybe(rng, Value::Object(pods)) {
            top.insert("podEntries".into(), v);
        }
    }
    Value::Object(top)
}

#[test]
fn generated_checkpoints_hash_as_go_spew_hashes_them_and_each_side_reads_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peer = peer(dir.path());
    let mut rng = Rng(0x6b75_6265_6c65_7421);
    for (format, name, pods) in [
        (Format::Current, "current", true),
        (Format::Legacy, "legacy", false),
    ] {
        let mut files = Vec::new();
        let mut ours = Vec::new();
        for i in 0..300 {
            let path = dir.path().join(format!("{name}-{i}.json"));
            let body = state(&mut rng, pods).to_string();
            fs::write(&path, &body).expect("write");
            ours.push(
                checkpoint::kubelet_checksum(&path, body.as_bytes(), format)
                    .unwrap_or_else(|e| panic!("{e}")),
            );
            files.push(path);
        }
        let theirs = run(&peer, &["sum", name], &files);
        assert_eq!(theirs.len(), files.len());
        for ((path, ours), theirs) in files.iter().zip(&ours).zip(&theirs) {
            assert_eq!(
                ours.to_string(),
                *theirs,
                "{}: {}",
                path.display(),
                fs::read_to_string(path).unwrap_or_default()
            );
        }
        // What the Go side writes (the kubelet's encoder and checksum), the agent accepts
        // exactly when the kubelet does: some it refuses itself (a nil map that omitempty drops
        // hashes differently once read back).
        let mut written_files = Vec::new();
        for (i, path) in files.iter().enumerate().take(100) {
            let written = run(&peer, &["write", name], std::slice::from_ref(path)).join("\n");
            let again = dir.path().join(format!("{name}-written-{i}.json"));
            fs::write(&again, &written).expect("write");
            written_files.push(again);
        }
        let verdicts = run(&peer, &["verify", name], &written_files);
        let mut accepted = 0;
        for (path, verdict) in written_files.iter().zip(&verdicts) {
            let bytes = fs::read(path).expect("read");
            let ours = checkpoint::read(path, &bytes, Verification::Kubelet);
            assert_eq!(
                ours.is_ok(),
                verdict == "ok",
                "{}: kubelet says {verdict}, agent {ours:?}",
                path.display()
            );
            accepted += usize::from(ours.is_ok());
        }
        assert!(
            accepted > 50,
            "only {accepted} of 100 written files verified"
        );
    }
}

#[test]
fn the_newest_format_both_ways() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peer = peer(dir.path());
    let mut rng = Rng(0x7633_7633_7633_7633);
    let mut theirs = Vec::new();
    for i in 0..100 {
        let path = dir.path().join(format!("source-{i}.json"));
        fs::write(&path, state(&mut rng, true).to_string()).expect("write");
        let written = run(&peer, &["write", "v3"], std::slice::from_ref(&path)).join("\n");
        let v3 = dir.path().join(format!("v3-{i}.json"));
        fs::write(&v3, &written).expect("write");
        theirs.push(v3);
    }
    // What the newest kubelet writes, the agent reads as V3, verified.
    let mut ours = Vec::new();
    for (i, path) in theirs.iter().enumerate() {
        let bytes = fs::read(path).expect("read");
        let read =
            checkpoint::read(path, &bytes, Verification::Kubelet).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((read.version, read.verified), (Version::V3, true));
        // What the agent writes, the Go side verifies as V3 and (inline) as the legacy format, and
        // it holds the same state (nil lists and maps read as empty ones: the bytes differ there;
        // byte equality of a state without them is a unit test).
        let written = checkpoint::to_kubelet_json(&read.state);
        let back = checkpoint::read(path, &written, Verification::Kubelet).expect("ours");
        assert_eq!(back.state, read.state);
        let again = dir.path().join(format!("ours-{i}.json"));
        fs::write(&again, &written).expect("write");
        ours.push(again);
    }
    for format in ["v3", "legacy"] {
        let verdicts = run(&peer, &["verify", format], &ours);
        assert!(verdicts.iter().all(|v| v == "ok"), "{format}: {verdicts:?}");
    }
}
