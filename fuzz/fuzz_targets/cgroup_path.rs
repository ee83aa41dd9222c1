//! Cgroup paths (`kubelet/cgroup_path.rs`), both drivers (cgroupfs `kubepods/...`, systemd
//! `kubepods.slice/...`), any text. The classification ignores empty components (leading,
//! trailing or doubled slashes), and a pod's UID and container ID are never empty and come from
//! the path (case aside).
#![no_main]

use hugepage_agent::kubelet::cgroup_path::{Owner, classify};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };
    let owner = classify(path);
    assert_eq!(
        classify(&format!("/{path}/")),
        owner,
        "{path:?} with slashes around"
    );
    assert_eq!(
        classify(&path.replace('/', "//")),
        owner,
        "{path:?} with doubled slashes"
    );
    if let Owner::Pod { uid, container, .. } = &owner {
        assert!(!uid.0.is_empty());
        let dashed = path.replace('_', "-").to_ascii_lowercase();
        assert!(
            dashed.contains(&uid.0.to_ascii_lowercase()),
            "uid {:?} is not in {path:?}",
            uid.0
        );
        if let Some(c) = container {
            assert!(
                !c.id.is_empty() && dashed.contains(&c.id.to_ascii_lowercase()),
                "{c:?} is not in {path:?}"
            );
        }
    }
});
