//! Fake host trees for unit tests of parsing and edge cases: files written under a temporary
//! root that a [`HostFs`] then reads. (Features are tested on the real kernel in `tests/`.)

use std::{fs, path::Path};

use super::HostFs;

/// Writes `content` at the host path `path` (e.g. `/sys/kernel/mm/hugepages/…`) under `root`.
pub fn write(root: &Path, path: &str, content: &str) {
    let full = root.join(path.trim_start_matches('/'));
    fs::create_dir_all(full.parent().expect("a parent directory")).expect("mkdir");
    fs::write(full, content).expect("write");
}

/// A fresh root holding `files` (host path → content); keep the directory alive while reading.
pub fn tree(files: &[(&str, &str)]) -> (tempfile::TempDir, HostFs) {
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, content) in files {
        write(dir.path(), path, content);
    }
    let host = HostFs::new(dir.path());
    (dir, host)
}
