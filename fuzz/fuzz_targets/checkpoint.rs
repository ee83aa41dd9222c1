//! The kubelet's Memory Manager checkpoint (`memorymanager/checkpoint.rs`), every version, any
//! bytes. A checkpoint that verifies, written again as the newest kubelet writes it, verifies as
//! V3 with the same state; a refused file's error names the file. When the first byte is odd the
//! rest, if it is a JSON object, first gets its checksum computed (V2's, the V3 fields dropped),
//! so that mutated content reaches the verified path and the round trip.
#![no_main]

use std::path::Path;

use hugepage_agent::memorymanager::checkpoint::{
    Format, Verification, Version, kubelet_checksum, read, to_kubelet_json,
};
use libfuzzer_sys::fuzz_target;

const PATH: &str = "/var/lib/kubelet/memory_manager_state";

fn check(bytes: &[u8], verification: Verification) -> Option<Version> {
    let path = Path::new(PATH);
    match read(path, bytes, verification) {
        Ok(checkpoint) => {
            if checkpoint.verified {
                let written = to_kubelet_json(&checkpoint.state);
                let again = read(path, &written, Verification::Kubelet).unwrap_or_else(|e| {
                    panic!(
                        "what we wrote does not read back: {e}\n{}",
                        String::from_utf8_lossy(&written)
                    )
                });
                assert!(again.verified && again.version == Version::V3);
                assert_eq!(
                    again.state, checkpoint.state,
                    "the state changed when written"
                );
            }
            Some(checkpoint.version)
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains(PATH), "{message:?} does not name the file");
            None
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first & 1 == 0 {
        check(rest, Verification::Kubelet);
        check(rest, Verification::UnlessAbsent);
        return;
    }
    let Ok(serde_json::Value::Object(mut object)) = serde_json::from_slice(rest) else {
        return;
    };
    object.remove("data");
    object.remove("dataChecksum");
    let Ok(unsummed) = serde_json::to_vec(&object) else {
        return;
    };
    let Ok(sum) = kubelet_checksum(Path::new(PATH), &unsummed, Format::Current) else {
        return;
    };
    object.insert("checksum".to_owned(), sum.into());
    let Ok(summed) = serde_json::to_vec(&object) else {
        return;
    };
    if let Some(version) = check(&summed, Verification::Kubelet) {
        assert_eq!(version, Version::V2, "a V2 checksum read as {version:?}");
    }
});
