//! Pressure stall information (PSI) turned into node conditions, as KEP-5394 describes.
//!
//! [`parse`] reads pressure files; [`source`] finds them for the two scopes (the system,
//! `/proc/pressure/*`, and the kubepods cgroup's `*.pressure`); [`condition`] is the KEP's logic,
//! a pure state machine over readings; [`trigger`] arms kernel PSI triggers (on real pressure
//! files only: the one write the agent makes under `--host-root`) so that crossing a threshold
//! wakes the evaluation at once; [`monitor`] runs it all and publishes what the API shows. CPU
//! pressure is read and reported but is not a condition (the KEP: CPU is compressible).

pub mod condition;
pub mod flags;
pub mod monitor;
pub mod parse;
pub mod source;
pub mod trigger;

use std::{fmt, path::PathBuf};

use serde::Serialize;

/// A resource PSI reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Resource {
    Memory,
    Io,
    Cpu,
}

impl Resource {
    pub const ALL: [Resource; 3] = [Resource::Memory, Resource::Io, Resource::Cpu];

    /// The file name under `/proc/pressure` and the prefix of the cgroup file.
    pub fn file(self) -> &'static str {
        match self {
            Resource::Memory => "memory",
            Resource::Io => "io",
            Resource::Cpu => "cpu",
        }
    }
}

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file())
    }
}

/// Whose pressure: the whole system, or the pods under the kubepods cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    System,
    Kubepods,
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scope::System => "system",
            Scope::Kubepods => "kubepods",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PsiError {
    #[error("{path} line {line}: {content:?}: {why}")]
    Malformed {
        path: PathBuf,
        line: usize,
        content: String,
        why: String,
    },
    #[error(transparent)]
    Sysfs(#[from] crate::sysfs::SysfsError),
    #[error("{path}: {why}")]
    Trigger { path: PathBuf, why: String },
    #[error(
        "{path}: not a kernel pressure file: it is on {filesystem}, and PSI triggers are taken on procfs (0x00009fa0) and cgroup2 (0x63677270) only; nothing is written to it"
    )]
    NotKernelPressure { path: PathBuf, filesystem: String },
    #[error(
        "{path}: mounted read-only, so no trigger can be written into it; it is read every --psi-interval (a writable mount of it arms a trigger)"
    )]
    ReadOnlyMount { path: PathBuf },
}
