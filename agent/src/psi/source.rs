//! Where the pressure files are, per scope, read through the one seam ([`HostFs`]).
//!
//! System scope: `/proc/pressure/{memory,io,cpu}`. Kubepods scope: the kubepods cgroup of the
//! cgroup v2 hierarchy (pure, or hybrid at `/sys/fs/cgroup/unified`): `kubepods.slice` under the
//! systemd cgroup driver, `kubepods` under cgroupfs. Cgroup v1 has no pressure files, so without
//! a v2 hierarchy the kubepods scope is unavailable, and [`Scopes`] says why.

use serde::Serialize;

use super::{PsiError, Resource, Scope, parse::Pressure};
use crate::{probes::watch::CgroupV2, sysfs::HostFs};

/// Kubepods cgroup names, systemd driver first.
const KUBEPODS: [&str; 2] = ["kubepods.slice", "kubepods"];

/// The pressure files of one scope, or why there are none.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopeFiles {
    pub scope: Scope,
    /// The directory holding the files (host path), when the scope is available.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

impl ScopeFiles {
    /// Host path of `resource`'s pressure file in this scope.
    pub fn file(&self, resource: Resource) -> Option<String> {
        let dir = self.dir.as_ref()?;
        Some(match self.scope {
            Scope::System => format!("{dir}/{}", resource.file()),
            Scope::Kubepods => format!("{dir}/{}.pressure", resource.file()),
        })
    }
}

/// Both scopes. The monitor locates them at start and again while one is unavailable (the kubelet
/// may create the kubepods cgroup after the agent started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scopes {
    pub system: ScopeFiles,
    pub kubepods: ScopeFiles,
}

impl Scopes {
    pub fn locate(host: &HostFs) -> Scopes {
        let system = if host.exists("/proc/pressure/memory") {
            ScopeFiles {
                scope: Scope::System,
                dir: Some("/proc/pressure".to_owned()),
                unavailable: None,
            }
        } else {
            ScopeFiles {
                scope: Scope::System,
                dir: None,
                unavailable: Some(
                    "/proc/pressure does not exist: the kernel has no PSI (CONFIG_PSI) or it is off (boot with psi=1)"
                        .to_owned(),
                ),
            }
        };
        let kubepods = match CgroupV2::find(host) {
            None => ScopeFiles {
                scope: Scope::Kubepods,
                dir: None,
                unavailable: Some(
                    "no cgroup v2 hierarchy (cgroup v1 only): cgroup pressure files exist on cgroup v2 alone"
                        .to_owned(),
                ),
            },
            Some(v2) => match KUBEPODS
                .iter()
                .map(|name| format!("{}/{name}", v2.mount))
                .find(|dir| host.exists(format!("{dir}/memory.pressure")))
            {
                Some(dir) => ScopeFiles {
                    scope: Scope::Kubepods,
                    dir: Some(dir),
                    unavailable: None,
                },
                None => ScopeFiles {
                    scope: Scope::Kubepods,
                    dir: None,
                    unavailable: Some(format!(
                        "no kubepods cgroup with pressure files under {} (looked for {})",
                        v2.mount,
                        KUBEPODS.join(" and ")
                    )),
                },
            },
        };
        Scopes { system, kubepods }
    }

    pub fn all(&self) -> [&ScopeFiles; 2] {
        [&self.system, &self.kubepods]
    }
}

/// Reads and parses one pressure file (a host path).
pub fn read(host: &HostFs, file: &str) -> Result<Pressure, PsiError> {
    let text = host.read_string(file)?;
    super::parse::parse(&text, &host.path(file))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysfs::fake::tree;

    const LINE: &str = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";

    #[test]
    fn systemd_and_cgroupfs_kubepods_are_found_on_pure_and_hybrid_v2() {
        for (mount, name) in [
            ("/sys/fs/cgroup", "kubepods.slice"),
            ("/sys/fs/cgroup/unified", "kubepods"),
        ] {
            let (_d, host) = tree(&[
                ("/proc/pressure/memory", LINE),
                (&format!("{mount}/cgroup.controllers"), "cpu memory\n"),
                (&format!("{mount}/{name}/memory.pressure"), LINE),
            ]);
            let scopes = Scopes::locate(&host);
            assert_eq!(
                scopes.system.file(Resource::Io).as_deref(),
                Some("/proc/pressure/io")
            );
            assert_eq!(
                scopes.kubepods.file(Resource::Memory),
                Some(format!("{mount}/{name}/memory.pressure"))
            );
        }
    }

    #[test]
    fn unavailable_scopes_say_why() {
        let (_d, host) = tree(&[("/sys/fs/cgroup/memory/tasks", "")]);
        let scopes = Scopes::locate(&host);
        assert!(
            scopes
                .system
                .unavailable
                .as_deref()
                .is_some_and(|w| w.contains("psi=1"))
        );
        assert!(
            scopes
                .kubepods
                .unavailable
                .as_deref()
                .is_some_and(|w| w.contains("cgroup v1 only")),
            "{scopes:?}"
        );
        let (_d, host) = tree(&[("/sys/fs/cgroup/unified/cgroup.controllers", "\n")]);
        let why = Scopes::locate(&host)
            .kubepods
            .unavailable
            .unwrap_or_default();
        assert_eq!(
            why,
            "no kubepods cgroup with pressure files under /sys/fs/cgroup/unified (looked for kubepods.slice and kubepods)"
        );
    }

    #[test]
    fn this_hosts_system_pressure_is_live() {
        let host = HostFs::new("/");
        let scopes = Scopes::locate(&host);
        for resource in Resource::ALL {
            let file = scopes
                .system
                .file(resource)
                .expect("PSI is on here (psi=1)");
            let first = read(&host, &file).expect("parses");
            let direct = std::fs::read_to_string(&file).expect("read directly");
            let later = super::super::parse::parse(&direct, file.as_ref()).expect("parses");
            assert!(
                later.some.total >= first.some.total,
                "{resource}: totals only grow"
            );
        }
    }
}
