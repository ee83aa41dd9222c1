//! Fixtures in `testdata/` were written by the real go-spew and `encoding/json`, through
//! `tests/kubelet-checksum` (the kubelet's structs, type names and hash configuration).

use super::*;

const CURRENT: &str = include_str!("testdata/current.json");
const LEGACY: &str = include_str!("testdata/legacy.json");
const V3: &str = include_str!("testdata/v3.json");
const CURRENT_TEXT: &str = include_str!("testdata/current.text");

fn path() -> &'static Path {
    Path::new("/var/lib/kubelet/memory_manager_state")
}

#[test]
fn a_kubelet_written_checkpoint_verifies_in_either_format() {
    let current = read(path(), CURRENT.as_bytes(), Verification::Kubelet).unwrap();
    assert_eq!((current.version, current.verified), (Version::V2, true));
    let state = &current.state;
    assert_eq!(state.machine_state[&0].cells, vec![0, 1]);
    assert_eq!(
        state.machine_state[&1].memory_map["hugepages-1Gi"].free,
        3 << 30
    );
    let uid = "fa9bdd38-6df9-4cf2-b2b7-2e3a0fbb1fe0";
    assert_eq!(state.container_blocks(uid, "dpdk").unwrap().len(), 2);
    assert_eq!(state.pod_blocks(uid).unwrap()[0].size, 2 << 30);
    let legacy = read(path(), LEGACY.as_bytes(), Verification::Kubelet).unwrap();
    assert_eq!((legacy.version, legacy.verified), (Version::V1, true));
    assert_eq!(legacy.state.machine_state, state.machine_state);
    let v3 = read(path(), V3.as_bytes(), Verification::Kubelet).unwrap();
    assert_eq!((v3.version, v3.verified), (Version::V3, true));
    assert_eq!(&v3.state, state);
}

#[test]
fn v3_data_that_does_not_verify_is_refused_not_read_as_an_older_version() {
    // The inline V1 fields still verify; the kubelet refuses the file all the same.
    let mut value: Value = serde_json::from_str(V3).unwrap();
    let data = value["data"]
        .as_str()
        .unwrap()
        .replacen("3221225472", "3221225473", 1);
    assert!(data.contains("3221225473"));
    value["data"] = Value::String(data);
    let edited = value.to_string();
    assert!(read(path(), V3.as_bytes(), Verification::Kubelet).is_ok());
    assert!(matches!(
        read(path(), edited.as_bytes(), Verification::Kubelet),
        Err(CheckpointError::Mismatch { .. })
    ));
}

#[test]
fn the_hashed_text_is_go_spews() {
    let value: Value = serde_json::from_str(CURRENT).unwrap();
    let text = spew::text(value.as_object().unwrap(), Format::Current, spew::TYPE).unwrap();
    assert_eq!(text, CURRENT_TEXT.trim_end());
}

#[test]
fn one_changed_byte_is_refused_whole_with_what_to_do() {
    let edited = CURRENT.replacen("\"free\":3221225472", "\"free\":3221225473", 1);
    assert_ne!(edited, CURRENT);
    let err = read(path(), edited.as_bytes(), Verification::Kubelet).unwrap_err();
    let message = err.to_string();
    assert!(
        matches!(
            err,
            CheckpointError::Mismatch {
                stored: 3740143566,
                ..
            }
        ),
        "{message}"
    );
    assert!(
        message.contains("drain this node and delete the file before restarting the kubelet"),
        "{message}"
    );
    // A legacy file given pod entries still verifies as V1, which does not see them.
    let grown = LEGACY.replacen(
        "\"checksum\"",
        "\"podEntries\":{\"p\":{\"memoryBlocks\":[]}},\"checksum\"",
        1,
    );
    let read_back = read(path(), grown.as_bytes(), Verification::Kubelet).unwrap();
    assert_eq!((read_back.version, read_back.verified), (Version::V1, true));
    assert!(read_back.state.pod_entries.is_empty());
}

#[test]
fn foreign_and_malformed_files_say_what_they_are() {
    let cpu = r#"{"policyName":"static","defaultCpuSet":"0-3","checksum":1}"#;
    assert!(matches!(
        read(path(), cpu.as_bytes(), Verification::Kubelet),
        Err(CheckpointError::Foreign { .. })
    ));
    assert!(matches!(
        read(path(), b"{\"machineState\":", Verification::Kubelet),
        Err(CheckpointError::Json { .. })
    ));
    let wrong = r#"{"policyName":"Static","machineState":{"0":{"cells":"zero"}}}"#;
    let err = read(path(), wrong.as_bytes(), Verification::UnlessAbsent).unwrap_err();
    assert!(matches!(err, CheckpointError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("machineState.0.cells"), "{err}");
    let none = r#"{"policyName":"None","machineState":{},"checksum":0}"#;
    assert!(matches!(
        read(path(), none.as_bytes(), Verification::Kubelet),
        Err(CheckpointError::Policy { .. })
    ));
}

#[test]
fn without_a_checksum_the_kubelets_compatibility_rule_reads_v1_and_the_what_if_command_any() {
    let hand = r#"{"policyName":"Static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{},"cells":[0]}}}"#;
    // The kubelet accepts a legacy file with no (zero) checksum.
    let read_back = read(path(), hand.as_bytes(), Verification::Kubelet).unwrap();
    assert_eq!(
        (read_back.version, read_back.verified),
        (Version::V1, false)
    );
    // With pod entries too (as V1, without them), as the kubelet reads a V2 file with checksum 0.
    let with_pods = hand.replacen("}}}", "}},\"podEntries\":{}}", 1);
    let read_back = read(path(), with_pods.as_bytes(), Verification::Kubelet).unwrap();
    assert_eq!(
        (read_back.version, read_back.verified),
        (Version::V1, false)
    );
    let read_back = read(path(), with_pods.as_bytes(), Verification::UnlessAbsent).unwrap();
    assert_eq!(
        (read_back.version, read_back.verified),
        (Version::V2, false)
    );
}

#[test]
fn what_we_write_is_what_the_newest_kubelet_writes() {
    let state = read(path(), CURRENT.as_bytes(), Verification::Kubelet)
        .unwrap()
        .state;
    let written = to_kubelet_json(&state);
    let again = read(path(), &written, Verification::Kubelet).unwrap();
    assert_eq!((again.version, again.verified), (Version::V3, true));
    assert_eq!(again.state, state);
    // The same bytes the Go peer wrote for this state.
    let ours: Value = serde_json::from_slice(&written).unwrap();
    let theirs: Value = serde_json::from_str(V3).unwrap();
    assert_eq!(ours["dataChecksum"], theirs["dataChecksum"]);
    assert_eq!(ours["checksum"], theirs["checksum"]);
    assert_eq!(ours["data"], theirs["data"]);
}

/// The kubelet's own restore cases (`state_checkpoint_test.go`, newest version with V3), with
/// the checksums the kubelet's tests expect.
mod upstream {
    use super::*;

    const MACHINE: &str = r#""machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}}"#;
    const ENTRIES: &str =
        r#""entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}}"#;
    const POD_ENTRIES: &str = r#""podEntries":{"pod":{"memoryBlocks":[{"numaAffinity":[0],"type":"memory","size":512}]}}"#;
    /// V1 members that do not match `data`: V3 files are read from `data` alone.
    const STALE_V1: &str = r#""policyName":"other","machineState":{"0":{"numberOfAssignments":5,"memoryMap":{"memory":{"total":1024,"systemReserved":256,"allocatable":768,"reserved":256,"free":512}},"cells":[]}},"entries":{"pod":{"containerX":[{"numaAffinity":[0],"type":"memory","size":128}]}},"checksum":1234"#;
    const DATA: &str = r#""{\"policyName\":\"static\",\"machineState\":{\"0\":{\"numberOfAssignments\":0,\"memoryMap\":{\"memory\":{\"total\":2048,\"systemReserved\":512,\"allocatable\":1536,\"reserved\":512,\"free\":1024}},\"cells\":[]}},\"entries\":{\"pod\":{\"container1\":[{\"numaAffinity\":[0],\"type\":\"memory\",\"size\":512}]}}}""#;
    const DATA_WITH_PODS: &str = r#""{\"policyName\":\"static\",\"machineState\":{\"0\":{\"numberOfAssignments\":0,\"memoryMap\":{\"memory\":{\"total\":2048,\"systemReserved\":512,\"allocatable\":1536,\"reserved\":512,\"free\":1024}},\"cells\":[]}},\"entries\":{\"pod\":{\"container1\":[{\"numaAffinity\":[0],\"type\":\"memory\",\"size\":512}]}},\"podEntries\":{\"pod\":{\"memoryBlocks\":[{\"numaAffinity\":[0],\"type\":\"memory\",\"size\":512}]}}}""#;
    const DATA_UNKNOWN_FIELD: &str = r#""{\"unknownField\":\"value\",\"policyName\":\"static\",\"machineState\":{\"0\":{\"numberOfAssignments\":0,\"memoryMap\":{\"memory\":{\"total\":2048,\"systemReserved\":512,\"allocatable\":1536,\"reserved\":512,\"free\":1024}},\"cells\":[]}},\"entries\":{\"pod\":{\"container1\":[{\"numaAffinity\":[0],\"type\":\"memory\",\"size\":512}]}}}""#;

    /// `Ok((version, verified, pod entries kept))` or the refusal.
    fn restore(content: &str) -> Result<(Version, bool, bool), CheckpointError> {
        read(path(), content.as_bytes(), Verification::Kubelet).map(|c| {
            let pods = !c.state.pod_entries.is_empty();
            let container = c.state.container_blocks("pod", "container1");
            assert_eq!(container.map(<[_]>::len), Some(1), "{content}");
            (c.version, c.verified, pods)
        })
    }

    fn mismatch(content: &str, stored: u64) {
        match restore(content) {
            Err(CheckpointError::Mismatch { stored: s, .. }) => assert_eq!(s, stored),
            other => panic!("{content}: {other:?}"),
        }
    }

    #[test]
    fn every_version_the_kubelet_restores_with_its_checksums() {
        let v1 = format!(r#"{{"policyName":"static",{MACHINE},{ENTRIES},"checksum":4215593881}}"#);
        assert_eq!(restore(&v1).unwrap(), (Version::V1, true, false));
        let zero = format!(r#"{{"policyName":"static",{MACHINE},{ENTRIES},"checksum":0}}"#);
        assert_eq!(restore(&zero).unwrap(), (Version::V1, false, false));
        let v2 = format!(
            r#"{{"policyName":"static",{MACHINE},{ENTRIES},{POD_ENTRIES},"checksum":1278640530}}"#
        );
        assert_eq!(restore(&v2).unwrap(), (Version::V2, true, true));
        // A V2 file with a zero checksum reads as V1: without its pod entries.
        let v2_zero =
            format!(r#"{{"policyName":"static",{MACHINE},{ENTRIES},{POD_ENTRIES},"checksum":0}}"#);
        assert_eq!(restore(&v2_zero).unwrap(), (Version::V1, false, false));
        let v3 = format!(r#"{{{STALE_V1},"data":{DATA},"dataChecksum":1849615440}}"#);
        assert_eq!(restore(&v3).unwrap(), (Version::V3, true, false));
        let v3_unknown =
            format!(r#"{{{STALE_V1},"data":{DATA_UNKNOWN_FIELD},"dataChecksum":2100279793}}"#);
        assert_eq!(restore(&v3_unknown).unwrap(), (Version::V3, true, false));
        let v3_pods = format!(
            r#"{{{STALE_V1},{POD_ENTRIES},"data":{DATA_WITH_PODS},"dataChecksum":637296054}}"#
        );
        assert_eq!(restore(&v3_pods).unwrap(), (Version::V3, true, true));
    }

    #[test]
    fn what_the_kubelet_refuses() {
        let wrong_v1 = format!(
            r#"{{"policyName":"static",{MACHINE},"entries":{{"pod":{{"container1":[{{"affinity":[0],"type":"memory","size":512}}]}}}},"checksum":101010}}"#
        );
        mismatch(&wrong_v1, 101010);
        let wrong_v2 = format!(
            r#"{{"policyName":"static",{MACHINE},{ENTRIES},{POD_ENTRIES},"checksum":101010}}"#
        );
        mismatch(&wrong_v2, 101010);
        let wrong_v3 = format!(
            r#"{{"policyName":"static",{MACHINE},{ENTRIES},"checksum":4215593881,"data":{DATA},"dataChecksum":1234}}"#
        );
        mismatch(&wrong_v3, 1234);
        // V3 markers without what they mark: no fallback to the valid V1 members.
        let no_data = format!(
            r#"{{"policyName":"static",{MACHINE},{ENTRIES},"checksum":4215593881,"dataChecksum":1234}}"#
        );
        mismatch(&no_data, 1234);
        let no_data_checksum = format!(
            r#"{{"policyName":"static",{MACHINE},{ENTRIES},"checksum":4215593881,"data":{DATA}}}"#
        );
        mismatch(&no_data_checksum, 0);
        let not_json = format!(
            r#"{{"policyName":"static",{MACHINE},{ENTRIES},"checksum":4215593881,"data":"{{","dataChecksum":{}}}"#,
            fnv32a("(string){")
        );
        assert!(matches!(
            restore(&not_json),
            Err(CheckpointError::Shape { .. })
        ));
        assert!(matches!(restore("{"), Err(CheckpointError::Json { .. })));
    }
}
