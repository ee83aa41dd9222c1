//! `--host-root`: where the host's `/sys` and `/proc` are read (the DaemonSet mounts the host at
//! `/host`), the one seam of [`super::HostFs`].

use std::path::PathBuf;

use clap::Args;

use super::HostFs;
use crate::flags::FlagError;

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Host")]
pub struct HostArgs {
    /// Prefix for /sys and /proc (the DaemonSet mounts the host at /host).
    #[arg(long, env = "HUGEPAGE_AGENT_HOST_ROOT", default_value = "/")]
    pub host_root: PathBuf,
}

impl HostArgs {
    /// The host, if `--host-root` is a directory.
    pub fn host(self) -> Result<HostFs, FlagError> {
        if self.host_root.is_dir() {
            Ok(HostFs::new(self.host_root))
        } else {
            Err(FlagError::HostRoot(self.host_root))
        }
    }
}
