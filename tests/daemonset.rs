//! The DaemonSet's security context on this machine's real kernel: the binary from the image
//! (`podman save`, unpacked) runs under exactly what the rendered DaemonSet declares, read from
//! it, so that a change of the manifest changes this test:
//!
//! * its root filesystem is the image's, read-only, in a mount namespace of its own (`unshare`),
//!   with a new `/proc` (a PID namespace of its own), a read-only `/sys`, a network namespace
//!   with its loopback, an IPC namespace of its own unless the manifest asks `hostIPC`, and
//!   every volume the manifest mounts bound at the manifest's path,
//!   read-only where the manifest says so (recursively where it asks `recursiveReadOnly`);
//! * the user and group the manifest names, no supplementary groups, and exactly the added
//!   capabilities as the effective, permitted and bounding sets (a container runtime's
//!   transition for a root user; nothing inheritable or ambient), with no_new_privs
//!   (`allowPrivilegeEscalation: false`): `capsh` applies them after its `chroot`, since
//!   `setpriv` cannot change the root directory and nothing can once CAP_SYS_CHROOT is gone;
//! * the manifest's arguments and environment (`NODE_NAME` as the downward API gives it).
//!
//! Host paths are the host's, but for three stand-ins: the state directory (a fresh directory,
//! as every test's agent gets), the kubelet's directory (this machine runs no kubelet: a
//! directory holding a Memory Manager checkpoint the test writes as the kubelet does), and the
//! TLS Secret (certificates made with `openssl`). A kubepods cgroup is created for the test
//! (`kubepods.slice`, or the cgroupfs driver's `kubepods`, under this host's cgroup v2) and
//! removed after it. Every host path first passes the kubelet's `type` check; where the
//! manifest mounts the host's `/sys/fs/cgroup`, a test may bind instead a v2-only or a v1-only
//! hierarchy made of this host's real ones, to start the same DaemonSet on those node kinds.
//!
//! Under that the probes attach, a child faulting hugepages is seen, admission over mTLS (curl
//! in the agent's network namespace, with a client certificate from the same CA) answers with
//! KEP-5759's message, every PSI condition is evaluated from pressure files the manifest keeps
//! read-only (with the `psi-triggers` component, triggers armed on each), a replaced kubelet
//! checkpoint is followed, and a reservation survives a restart.
//! Then each declared capability is removed in turn: the probes are refused, the agent runs on
//! sysfs, and its warning names the capability it lacks. Seccomp is not applied here (no
//! container runtime runs on these machines); docs/security.md cites the runtimes' default profiles.
//!
//! It changes the host (hugepage pools, cgroups, the probes attached while it runs): it takes the
//! host lock and restores everything on every exit. It needs the image: `cargo xtask image`.

use std::{
    collections::BTreeSet,
    fs,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::fs::PermissionsExt,
    },
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent::quantity::format_binary;
use hugepage_agent_tests::{
    HostLock, HugepagePool, LogLines, TestCgroup, Toucher, host_lock, hugetlbfs, node0_checkpoint,
    read_u64,
    rendered::{AgentPod, Mount, Source, render},
    thread_schedules, v2, warnings_in,
};
use serde_json::{Value, json};

const TOUCHER: &str = env!("CARGO_BIN_EXE_toucher");
const NODE0_2M: &str = "/sys/devices/system/node/node0/hugepages/hugepages-2048kB";
const MI2: u64 = 2 << 20;
/// The name in the agent's serving certificate, which a client verifies (cert-manager
/// component: `dnsNames`).
const SERVER_NAME: &str = hugepage_agent::tls::SERVER_NAME;
/// Capabilities in the kernel's order (`linux/capability.h`), as Kubernetes spells them.
const CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The kernel's number for a capability as Kubernetes names it.
fn capability(name: &str) -> u32 {
    CAPABILITIES
        .iter()
        .position(|c| *c == name)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or_else(|| panic!("unknown capability {name}"))
}

/// The rendered DaemonSet, the same for every node.
fn rendered_agent() -> AgentPod {
    rendered_agent_with(&[])
}

/// [`rendered_agent`] with `components` too.
fn rendered_agent_with(components: &[&str]) -> AgentPod {
    render(components).agent()
}

/// The node's cgroup hierarchy, where the manifest mounts the host's `/sys/fs/cgroup`: this
/// host's as it is (hybrid: v1 hierarchies and v2 at `unified`), or another layout made of this
/// host's real hierarchies, so that the agent meets the kernel's own cgroup filesystems.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cgroups {
    ThisHost,
    /// cgroup v2 alone at `/sys/fs/cgroup` (EKS AL2023, GKE, AKS): this host's v2 hierarchy.
    V2Only,
    /// cgroup v1 alone (Amazon Linux 2): a directory holding this host's v1 hierarchies, each
    /// bound at its name, and no v2 hierarchy.
    V1Only,
}

impl Cgroups {
    /// The kubepods cgroup `name`, as the agent finds it on this node.
    fn kubepods(self, name: &str) -> Option<String> {
        match self {
            Cgroups::ThisHost => Some(format!("{}/{name}", v2().mount)),
            Cgroups::V2Only => Some(format!("/sys/fs/cgroup/{name}")),
            Cgroups::V1Only => None,
        }
    }
}

/// This host's cgroup v1 hierarchies: (name under `/sys/fs/cgroup`, mount point).
fn v1_hierarchies() -> Vec<(String, PathBuf)> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").expect("/proc/self/mountinfo");
    let found: Vec<(String, PathBuf)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (head, tail) = l.split_once(" - ")?;
            (tail.split_whitespace().next() == Some("cgroup")).then_some(())?;
            let point = head.split_whitespace().nth(4)?;
            let name = point.strip_prefix("/sys/fs/cgroup/")?;
            (!name.contains('/')).then(|| (name.to_owned(), PathBuf::from(point)))
        })
        .collect();
    assert!(
        !found.is_empty(),
        "this host has no cgroup v1 hierarchy under /sys/fs/cgroup to make a v1 node of"
    );
    found
}

/// The kubelet's check of a hostPath volume's `type` before it starts the pod
/// (pkg/volume/hostpath, "hostPath type check failed"), against what stands for the path here.
fn kubelet_type_check(kind: &str, source: &Path) -> Result<(), String> {
    let ok = match kind {
        "" | "DirectoryOrCreate" => true,
        "Directory" => source.is_dir(),
        "File" => source.is_file(),
        other => panic!("hostPath type {other}: not checked here"),
    };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hostPath type check failed: {} is not a {kind}",
            source.display()
        ))
    }
}

/// A kubepods cgroup standing in for the kubelet's (the systemd driver's, `kubepods.slice`, or
/// the cgroupfs driver's, `kubepods`, in this host's v2 hierarchy), removed on drop.
struct Kubepods(PathBuf);

/// The kubepods cgroup of the kubelet's systemd cgroup driver.
const SYSTEMD_DRIVER: &str = "kubepods.slice";

impl Kubepods {
    fn create(_lock: &HostLock, name: &str) -> Kubepods {
        let dir = PathBuf::from(format!("{}/{name}", v2().mount));
        assert!(
            !dir.exists(),
            "{} exists: this host runs a kubelet, whose cgroups this test must not touch",
            dir.display()
        );
        fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Kubepods(dir)
    }
}

impl Drop for Kubepods {
    fn drop(&mut self) {
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("could not remove {}", self.0.display());
    }
}

/// Writes a checkpoint as the kubelet does: a temporary file in the same directory, renamed over.
fn kubelet_writes(dir: &Path, contents: &[u8]) {
    let temp = dir.join(".memory_manager_state-tmp");
    fs::write(&temp, contents).expect("the checkpoint's temporary file");
    fs::rename(&temp, dir.join("memory_manager_state")).expect("rename over the checkpoint");
}

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (Debian's openssl; cargo xtask setup installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, the agent's serving certificate (the Secret's `tls.crt`, `tls.key`, `ca.crt`, in
/// `secret/`) and a client certificate from the same CA (`client.crt`, `client.key`).
fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "1",
                "-subj",
                "/CN=hugepage-agent test CA",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        ]
        .concat(),
    );
    for (name, subject, usage) in [
        ("tls", "/CN=hugepage-agent", "serverAuth"),
        ("client", "/CN=hugepage-agent-webhook", "clientAuth"),
    ] {
        let extensions = format!("{name}.ext");
        let san = if usage == "serverAuth" {
            format!("subjectAltName=DNS:{SERVER_NAME}\n")
        } else {
            String::new()
        };
        fs::write(
            dir.join(&extensions),
            format!("{san}extendedKeyUsage={usage}\nkeyUsage=critical,digitalSignature\n"),
        )
        .expect("extensions");
        let (key, csr, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
        );
        openssl(
            dir,
            &[
                &["req"][..],
                &ec,
                &["-keyout", &key, "-out", &csr, "-subj", subject],
            ]
            .concat(),
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                &extensions,
                "-out",
                &crt,
            ],
        );
    }
    let secret = dir.join("secret");
    fs::create_dir(&secret).expect("the Secret's directory");
    for file in ["tls.crt", "tls.key", "ca.crt"] {
        fs::copy(dir.join(file), secret.join(file)).expect("a Secret file");
        fs::set_permissions(secret.join(file), fs::Permissions::from_mode(0o400))
            .expect("the Secret's defaultMode 0400");
    }
}

/// The image the manifest names, unpacked: its root filesystem.
fn unpack_image(image: &str, into: &Path) -> PathBuf {
    let archive = into.join("image.tar");
    let out = Command::new("podman")
        .args(["save", "--format", "docker-archive", "--output"])
        .arg(&archive)
        .arg(image)
        .output()
        .expect("run podman (cargo xtask image installs it)");
    assert!(
        out.status.success(),
        "podman save {image}: {} (build it first: cargo xtask image)",
        String::from_utf8_lossy(&out.stderr)
    );
    let unpacked = into.join("archive");
    fs::create_dir(&unpacked).expect("mkdir");
    untar(&archive, &unpacked);
    let manifest: Value = serde_json::from_slice(
        &fs::read(unpacked.join("manifest.json")).expect("the archive's manifest.json"),
    )
    .expect("JSON");
    let rootfs = into.join("rootfs");
    fs::create_dir(&rootfs).expect("mkdir rootfs");
    for layer in manifest[0]["Layers"].as_array().expect("layers") {
        untar(&unpacked.join(layer.as_str().expect("a layer")), &rootfs);
    }
    rootfs
}

fn untar(archive: &Path, into: &Path) {
    let status = Command::new("tar")
        .arg("-xf")
        .arg(archive)
        .arg("-C")
        .arg(into)
        .status()
        .expect("run tar");
    assert!(status.success(), "tar -xf {}", archive.display());
}

/// What the sandbox binds at one of the manifest's mount paths.
struct Bind {
    mount: Mount,
    source: PathBuf,
}

/// The pod on this machine: the image's root filesystem, what each volume is here, and the
/// manifest's container.
struct Pod {
    agent: AgentPod,
    rootfs: PathBuf,
    binds: Vec<Bind>,
    /// The stand-in for the kubelet's directory.
    kubelet: PathBuf,
    /// The client's certificate and key, and the CA.
    client: PathBuf,
    _dir: tempfile::TempDir,
}

impl Pod {
    fn new(agent: AgentPod) -> Pod {
        Pod::on(agent, Cgroups::ThisHost)
    }

    /// The pod on a node whose cgroup hierarchy is `cgroups`.
    fn on(agent: AgentPod, cgroups: Cgroups) -> Pod {
        let dir = tempfile::Builder::new()
            .prefix("hugepage-agent-pod-")
            .tempdir()
            .expect("a temporary directory");
        let rootfs = unpack_image(&agent.image, dir.path());
        let files: Vec<String> = fs::read_dir(&rootfs)
            .expect("the rootfs")
            .map(|e| {
                e.expect("an entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        assert_eq!(
            files,
            ["hugepage-agent"],
            "the image holds the binary alone"
        );
        let state = dir.path().join("state");
        let kubelet = dir.path().join("kubelet");
        let tls = dir.path().join("tls");
        for d in [&state, &kubelet, &tls] {
            fs::create_dir(d).expect("a stand-in directory");
        }
        certificates(&tls);
        let state_dir = agent.arg("--state-dir").expect("--state-dir").to_owned();
        let mut beneath = Vec::new();
        let mut binds: Vec<Bind> = agent
            .mounts
            .iter()
            .map(|m| {
                let source = match &m.source {
                    Source::HostPath { path, .. } if path == "/sys/fs/cgroup" => match cgroups {
                        Cgroups::ThisHost => PathBuf::from(path),
                        Cgroups::V2Only => PathBuf::from(v2().mount),
                        Cgroups::V1Only => {
                            let v1 = dir.path().join("cgroup-v1");
                            for (name, point) in v1_hierarchies() {
                                fs::create_dir_all(v1.join(&name)).expect("a mount point");
                                let mut at = m.clone();
                                at.path = format!("{}/{name}", m.path);
                                beneath.push(Bind {
                                    mount: at,
                                    source: point,
                                });
                            }
                            v1
                        }
                    },
                    Source::HostPath { .. } if m.path == state_dir => state.clone(),
                    Source::HostPath { path, .. } if path == "/var/lib/kubelet" => kubelet.clone(),
                    // DirectoryOrCreate: the empty directory the kubelet would make, made here
                    // instead of on this host (which has no hugetlbfs mounted there).
                    Source::HostPath { path, .. }
                        if path == "/dev/hugepages" && !Path::new(path).exists() =>
                    {
                        let empty = dir.path().join("dev-hugepages");
                        fs::create_dir(&empty).expect("a stand-in /dev/hugepages");
                        empty
                    }
                    Source::HostPath { path, .. } => PathBuf::from(path),
                    Source::Secret { .. } => tls.join("secret"),
                };
                if let Source::HostPath { kind, .. } = &m.source
                    && let Err(why) = kubelet_type_check(kind, &source)
                {
                    panic!("the kubelet would not start the pod, {}: {why}", m.name);
                }
                assert!(
                    source.exists(),
                    "{} (for {}) does not exist on this host",
                    source.display(),
                    m.path
                );
                Bind {
                    mount: m.clone(),
                    source,
                }
            })
            .collect();
        binds.extend(beneath);
        let pod = Pod {
            agent,
            rootfs,
            binds,
            kubelet,
            client: tls,
            _dir: dir,
        };
        pod.make_mount_points();
        pod
    }

    /// What a runtime creates in the root filesystem before making it read-only: the mount
    /// points that are not inside another mount.
    fn make_mount_points(&self) {
        let mut inside_mounts = vec!["/proc".to_owned(), "/sys".to_owned(), "/dev".to_owned()];
        for dir in &inside_mounts {
            fs::create_dir(self.rootfs.join(&dir[1..])).expect("a mount point");
        }
        let mut binds: Vec<&Bind> = self.binds.iter().collect();
        binds.sort_by_key(|b| b.mount.path.matches('/').count());
        for bind in binds {
            let path = &bind.mount.path;
            let covered = inside_mounts
                .iter()
                .any(|m| path.starts_with(&format!("{m}/")));
            if !covered {
                let target = self.rootfs.join(&path[1..]);
                if bind.source.is_dir() {
                    fs::create_dir_all(&target).expect("a directory mount point");
                } else {
                    fs::create_dir_all(target.parent().expect("a parent")).expect("its parent");
                    fs::write(&target, "").expect("a file mount point");
                }
            }
            inside_mounts.push(path.clone());
        }
    }

    /// The shell script that builds the pod's mount namespace, then `capsh` into it.
    fn script(&self, capabilities: &[String]) -> String {
        let root = self.rootfs.display().to_string();
        let q = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
        let mut script = vec![
            "set -eu".to_owned(),
            format!("R={}", q(&root)),
            r#"mount --bind "$R" "$R""#.to_owned(),
            r#"mount -t proc -o nosuid,nodev,noexec proc "$R/proc""#.to_owned(),
            r#"mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$R/sys""#.to_owned(),
            r#"mount -t tmpfs -o nosuid,mode=755 tmpfs "$R/dev""#.to_owned(),
            r#"for d in null zero full random urandom; do : > "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"; done"#.to_owned(),
        ];
        let mut binds: Vec<&Bind> = self.binds.iter().collect();
        binds.sort_by_key(|b| b.mount.path.matches('/').count());
        for bind in binds {
            let target = format!("\"$R\"{}", q(&bind.mount.path));
            script.push(format!(
                "mount --rbind {} {target}",
                q(&bind.source.display().to_string())
            ));
            if bind.mount.read_only {
                script.push(format!("mount -o remount,bind,ro {target}"));
            }
            if bind.mount.read_only && bind.mount.recursive_read_only.is_some() {
                // Every mount below it too (recursiveReadOnly on a runtime that supports it).
                script.push(format!(
                    r#"awk -v t="$R"{} '$5 != t && index($5, t "/") == 1 {{ print $5 }}' /proc/self/mountinfo | while read -r m; do mount -o remount,bind,ro "$m"; done"#,
                    q(&bind.mount.path)
                ));
            }
        }
        script.push(r#"mount -o remount,bind,ro "$R""#.to_owned());
        script.push("ip link set lo up".to_owned());
        let last = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .expect("/proc/sys/kernel/cap_last_cap");
        let kept: BTreeSet<u32> = capabilities.iter().map(|c| capability(c)).collect();
        let dropped: Vec<String> = (0..=last)
            .filter(|c| !kept.contains(c))
            .map(|c| c.to_string())
            .collect();
        let caps = if kept.is_empty() {
            "=".to_owned()
        } else {
            let names: Vec<String> = capabilities
                .iter()
                .map(|c| format!("cap_{}", c.to_lowercase()))
                .collect();
            format!("{}+ep", names.join(","))
        };
        let args: Vec<String> = self.agent.args.iter().map(|a| q(a)).collect();
        script.push(format!(
            "exec capsh --chroot=\"$R\" --gid={gid} --groups= --uid={uid} --drop={drop} --caps={caps} --noamb --no-new-privs --shell=/hugepage-agent -- {args}",
            gid = self.agent.run_as_group,
            uid = self.agent.run_as_user,
            drop = dropped.join(","),
            caps = q(&caps),
            args = args.join(" "),
        ));
        script.join("\n")
    }

    /// Starts the agent with `capabilities` (the manifest's, or fewer).
    fn start(&self, capabilities: &[String]) -> Running {
        let node = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .expect("the host name")
            .trim()
            .to_owned();
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--net"]);
        // A PID namespace of its own, as every pod has, unless the manifest asks the host's.
        if self.agent.pod["hostPID"] != true {
            cmd.arg("--pid");
        }
        // An IPC namespace of its own, as every pod has, unless the manifest asks the host's.
        if self.agent.pod["hostIPC"] != true {
            cmd.arg("--ipc");
        }
        cmd.args([
            "--fork",
            "--propagation",
            "private",
            "--kill-child",
            "--",
            "/bin/sh",
            "-c",
            &self.script(capabilities),
        ])
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("NODE_NAME", node)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start unshare (util-linux)");
        let log = LogLines::follow(child.stderr.take().expect("stderr"));
        let mut running = Running { child, pid: 0, log };
        running.pid = running.find_agent();
        running
    }

    /// `curl` in the agent's network namespace: (HTTP status, body), or the curl error.
    fn curl(&self, running: &Running, args: &[&str]) -> Result<(u16, String), String> {
        let out = Command::new("nsenter")
            .args(["--target", &running.pid.to_string(), "--net", "--", "curl"])
            .args(["--silent", "--show-error", "--max-time", "10"])
            .args(["--write-out", "\n%{http_code}"])
            .args(args)
            .output()
            .expect("run nsenter and curl");
        if !out.status.success() {
            return Err(format!(
                "curl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
    }

    /// A plain-HTTP GET on the metrics listener, as the kubelet's probes and Prometheus do.
    fn probe(&self, running: &Running, path: &str) -> (u16, String) {
        let url = format!("http://127.0.0.1:{}{path}", self.agent.port("metrics"));
        self.curl(running, &[&url])
            .unwrap_or_else(|e| panic!("{e}; the agent logged:\n{:#?}", running.log.seen))
    }

    /// Waits until the readiness probe passes; its body.
    fn ready(&self, running: &Running) -> String {
        let path = self.agent.container["readinessProbe"]["httpGet"]["path"]
            .as_str()
            .expect("the readiness probe's path");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok((200, body)) = self.curl(
                running,
                &[&format!(
                    "http://127.0.0.1:{}{path}",
                    self.agent.port("metrics")
                )],
            ) {
                return body;
            }
            assert!(
                Instant::now() < deadline,
                "not ready within 10 s; the agent logged:\n{:#?}",
                running.log.seen
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A request to the mTLS API, as the webhook makes it: the agent's name verified against
    /// the CA, the client's certificate presented.
    fn api(&self, running: &Running, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let port = self.agent.port("api");
        let resolve = format!("{SERVER_NAME}:{port}:127.0.0.1");
        let url = format!("https://{SERVER_NAME}:{port}{path}");
        let dir = &self.client;
        let (ca, crt, key) = (
            dir.join("ca.crt").display().to_string(),
            dir.join("client.crt").display().to_string(),
            dir.join("client.key").display().to_string(),
        );
        let mut args = vec![
            "--resolve",
            &resolve,
            "--cacert",
            &ca,
            "--cert",
            &crt,
            "--key",
            &key,
            "--request",
            method,
        ];
        if let Some(body) = body {
            args.extend([
                "--header",
                "content-type: application/json",
                "--data-raw",
                body,
            ]);
        }
        args.push(&url);
        let (status, text) = self
            .curl(running, &args)
            .unwrap_or_else(|e| panic!("{e}; the agent logged:\n{:#?}", running.log.seen));
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    /// `GET /v1/conditions`: the PSI conditions and triggers.
    fn conditions(&self, running: &Running) -> Value {
        let (status, psi) = self.api(running, "GET", "/v1/conditions", None);
        assert_eq!(status, 200, "{psi}");
        psi
    }

    /// The same request without a client certificate: refused (handshake, 401 or 403).
    fn api_without_certificate(
        &self,
        running: &Running,
        path: &str,
    ) -> Result<(u16, String), String> {
        let port = self.agent.port("api");
        let resolve = format!("{SERVER_NAME}:{port}:127.0.0.1");
        let ca = self.client.join("ca.crt").display().to_string();
        let url = format!("https://{SERVER_NAME}:{port}{path}");
        self.curl(running, &["--resolve", &resolve, "--cacert", &ca, &url])
    }
}

/// The agent running in its sandbox.
struct Running {
    /// `unshare`, whose child is the agent (PID 1 of its namespace).
    child: Child,
    /// The agent's process id on the host.
    pid: u32,
    log: LogLines,
}

impl Running {
    /// The agent's host pid, once `sh` and `capsh` have become it; panics with the log if the
    /// sandbox exits first (a flag this agent does not know, a mount that failed).
    fn find_agent(&mut self) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        let parent = self.child.id();
        loop {
            let children = fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                .unwrap_or_default();
            if let Some(pid) = children
                .split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                && fs::read_to_string(format!("/proc/{pid}/comm"))
                    .is_ok_and(|c| c.trim() == "hugepage-agent")
            {
                return pid;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                self.log.drain(Duration::from_millis(500));
                let text = format!("{:#?}", self.log.seen);
                let tls = ["--tls-cert-file", "--metrics-listen", "--client-ca-file"]
                    .iter()
                    .any(|flag| text.contains(&format!("unexpected argument '{flag}'")));
                assert!(
                    !tls,
                    "this agent has no TLS flags: the manifest's --tls-cert-file, --tls-private-key-file, --client-ca-file and --metrics-listen come with issue #16's TLS work; the sandbox printed:\n{text}"
                );
                panic!("the sandbox exited ({status}) before the agent ran:\n{text}");
            }
            assert!(
                Instant::now() < deadline,
                "no agent within 20 s: {:#?}",
                self.log.seen
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for a log line with `message` satisfying `pred`.
    fn wait_for(
        &mut self,
        message: &str,
        within: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        self.log.wait_for(message, within, pred)
    }

    /// A field of `/proc/<agent>/status`.
    fn status(&self, field: &str) -> String {
        let text = fs::read_to_string(format!("/proc/{}/status", self.pid)).expect("status");
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("no {field} in /proc/{}/status", self.pid))
    }

    /// SIGTERM, as the kubelet stops a container; the exit status within `grace` and the log.
    fn terminate(mut self, grace: Duration) -> (ExitStatus, Vec<Value>) {
        // SAFETY: signalling the agent this test started.
        unsafe { libc::kill(self.pid as i32, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the agent did not stop within the grace period ({grace:?}): {:#?}",
                self.log.seen
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.log.drain(Duration::from_millis(300));
        (status, std::mem::take(&mut self.log.seen))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // unshare --kill-child takes the agent with it.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The manifest's grace period.
fn grace(agent: &AgentPod) -> Duration {
    Duration::from_secs(
        agent.pod["terminationGracePeriodSeconds"]
            .as_u64()
            .expect("terminationGracePeriodSeconds"),
    )
}

/// The manifest's memory quantity (`40Mi`) at `path` in the container's resources, in bytes.
fn memory(agent: &AgentPod, which: &str) -> u64 {
    let text = agent.container["resources"][which]["memory"]
        .as_str()
        .unwrap_or_else(|| panic!("resources.{which}.memory"));
    let mi: u64 = text
        .strip_suffix("Mi")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{which} memory {text:?} is not in Mi"));
    mi << 20
}

/// The memory and io pressure files of both scopes, as `/v1/conditions` names them.
fn pressure_files(kubepods: &str) -> Vec<String> {
    vec![
        "/proc/pressure/memory".to_owned(),
        "/proc/pressure/io".to_owned(),
        format!("{kubepods}/memory.pressure"),
        format!("{kubepods}/io.pressure"),
    ]
}

/// The files of `/v1/conditions`'s triggers that are (or are not) `armed`.
fn triggers(psi: &Value, armed: bool) -> Vec<String> {
    psi["triggers"]
        .as_array()
        .expect("triggers")
        .iter()
        .filter(|t| t["armed"] == armed)
        .filter_map(|t| t["file"].as_str().map(str::to_owned))
        .collect()
}

/// A capability set as `/proc/<pid>/status` prints it.
fn mask(capabilities: &[String]) -> String {
    let bits = capabilities
        .iter()
        .fold(0u64, |m, c| m | (1u64 << capability(c)));
    format!("{bits:016x}")
}

#[test]
fn the_agent_does_everything_under_exactly_what_the_daemonset_declares() {
    let lock = host_lock();
    let agent = rendered_agent();
    let _kubepods = Kubepods::create(&lock, SYSTEMD_DRIVER);
    let _pool = HugepagePool::reserve(&lock, 8);
    let pod = Pod::new(agent);
    let declared = pod.agent.capabilities.clone();
    let total = read_u64(&format!("{NODE0_2M}/nr_hugepages")) * MI2;
    kubelet_writes(&pod.kubelet, &node0_checkpoint(total, total));

    let mut running = pod.start(&declared);
    running.wait_for("agent running", Duration::from_secs(20), |l| {
        l["source"] == "ebpf+sysfs"
    });

    // Exactly the declared privileges, as the kernel holds them.
    let declared_mask = mask(&declared);
    for set in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(running.status(set), declared_mask, "{set}");
    }
    for set in ["CapInh", "CapAmb"] {
        assert_eq!(running.status(set), mask(&[]), "{set}");
    }
    assert_eq!(running.status("NoNewPrivs"), "1");
    let uid = pod.agent.run_as_user.to_string();
    let gid = pod.agent.run_as_group.to_string();
    assert_eq!(
        running.status("Uid").split_whitespace().collect::<Vec<_>>(),
        [uid.as_str(); 4]
    );
    assert_eq!(
        running.status("Gid").split_whitespace().collect::<Vec<_>>(),
        [gid.as_str(); 4]
    );
    assert_eq!(running.status("Groups"), "");
    // Its root is the image, read-only; it mounted nothing itself.
    let root = fs::read_link(format!("/proc/{}/root", running.pid)).expect("its root");
    assert_eq!(root, pod.rootfs);
    let mounts = fs::read_to_string(format!("/proc/{}/mountinfo", running.pid)).expect("mountinfo");
    // What the manifest mounts read-only is, and recursively where it asks: no mount beneath
    // (a pod's volume, binfmt_misc under /proc) is writable to it.
    let read_only = |mount_point: &str| {
        mounts
            .lines()
            .rfind(|l| l.split_whitespace().nth(4) == Some(mount_point))
            .and_then(|l| l.split_whitespace().nth(5))
            .is_some_and(|o| o.split(',').any(|f| f == "ro"))
    };
    assert!(read_only("/"), "its root is writable: {mounts}");
    for mount in pod.agent.mounts.iter().filter(|m| m.read_only) {
        assert!(read_only(&mount.path), "{} is writable", mount.path);
        if mount.recursive_read_only.is_some() {
            let beneath = format!("{}/", mount.path);
            for point in mounts
                .lines()
                .filter_map(|l| l.split_whitespace().nth(4))
                .filter(|p| p.starts_with(&beneath))
                .filter(|p| !pod.agent.mounts.iter().any(|m| m.path == *p))
            {
                assert!(
                    read_only(point),
                    "{point}, beneath {}, is writable",
                    mount.path
                );
            }
        }
    }

    // The kubelet's probes, on the plain metrics listener.
    let body = pod.ready(&running);
    assert!(body.contains("\"probes\":\"attached\""), "{body}");
    let (status, _) = pod.probe(&running, "/healthz");
    assert_eq!(status, 200);
    let (status, metrics) = pod.probe(&running, "/metrics");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("hugepage_agent_probes_attached 1"),
        "{metrics}"
    );

    // A child faulting hugepages is seen.
    let cgroup = TestCgroup::create(&lock, "daemonset");
    let rel = cgroup.rel.clone();
    running.wait_for("cgroup event", Duration::from_secs(5), |l| {
        l["change"] == "mkdir" && l["path"] == rel.as_str()
    });
    let toucher = Toucher::run(TOUCHER, Some(&cgroup.dir), 2, 0);
    let pid = toucher.pid;
    running.wait_for("hugetlb fault", Duration::from_secs(5), |l| {
        l["tgid"] == pid
    });
    // The hugetlbfs programs too, where the kernel has them, under the same privileges.
    if hugepage_agent_tests::kernel_has_hugetlbfs_tracepoints().expect("this kernel has BTF") {
        running.wait_for("hugetlbfs probes attached", Duration::from_secs(5), |_| {
            true
        });
    }

    // Admission over mTLS, with KEP-5759's message; a reservation; no certificate, no answer.
    let free = read_u64(&format!("{NODE0_2M}/free_hugepages"));
    assert!(free >= 4, "{free} pages free");
    let asks = |uid: &str, pages: u64| {
        format!(
            r#"{{"pod":{{"namespace":"t","name":"p","uid":"{uid}"}},"containers":[{{"name":"c","resources":{{"hugepages-2Mi":"{}"}}}}],"numaNodes":[0]}}"#,
            format_binary(pages * MI2)
        )
    };
    let (status, refused) = pod.api(
        &running,
        "POST",
        "/v1/admit",
        Some(&asks("7f3c9a1e-2b4d-4c6e-8f0a-1b2c3d4e5f60", free + 1)),
    );
    assert_eq!(status, 200, "{refused}");
    assert_eq!(
        refused["message"],
        format!(
            "insufficient hugepages-2Mi on NUMA node(s) [0]: requested {}, available {}",
            format_binary((free + 1) * MI2),
            format_binary(free * MI2)
        ),
        "{refused}"
    );
    const UID: &str = "16000000-0000-4000-8000-000000000016";
    let (status, admitted) = pod.api(&running, "POST", "/v1/admit", Some(&asks(UID, 2)));
    assert_eq!(
        (status, &admitted["allowed"]),
        (200, &json!(true)),
        "{admitted}"
    );
    let reservation = admitted["reservation"]["id"]
        .as_str()
        .expect("a reservation")
        .to_owned();
    match pod.api_without_certificate(&running, "/v1/reservations") {
        Err(_) => {}
        Ok((status, body)) => assert!(
            status == 401 || status == 403,
            "a client without a certificate was answered {status}: {body}"
        ),
    }

    // PSI: the pressure files are read-only to the agent, so no trigger is armed and each says
    // why; every condition is evaluated from the files read every --psi-interval.
    let psi = pod.conditions(&running);
    let kubepods = Cgroups::ThisHost
        .kubepods(SYSTEMD_DRIVER)
        .expect("a kubepods cgroup");
    assert_eq!(triggers(&psi, true), Vec::<String>::new(), "{psi}");
    assert_eq!(triggers(&psi, false), pressure_files(&kubepods), "{psi}");
    for t in psi["triggers"].as_array().expect("triggers") {
        let why = t["why"].as_str().unwrap_or_default();
        assert!(why.contains("mounted read-only"), "{t}");
    }
    for condition in psi["conditions"].as_array().expect("conditions") {
        assert_ne!(condition["status"], "Unknown", "{condition}");
    }

    // The kubelet's checkpoint, replaced by a rename as the kubelet writes it, is followed.
    let (_, before) = pod.api(&running, "GET", "/v1/discrepancy", None);
    assert_eq!(before["source"], "checkpoint", "{before}");
    let believed = |answer: &Value| {
        answer["nodes"]
            .as_array()
            .and_then(|n| n.iter().find(|d| d["resource"] == "hugepages-2Mi"))
            .map(|d| d["memoryManagerFreeBytes"].clone())
    };
    assert_eq!(believed(&before), Some(json!(total)), "{before}");
    kubelet_writes(&pod.kubelet, &node0_checkpoint(total, total - 2 * MI2));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, after) = pod.api(&running, "GET", "/v1/discrepancy", None);
        if believed(&after) == Some(json!(total - 2 * MI2)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replaced checkpoint was not read: {after}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // Its memory, measured against what the manifest requests.
    let peak_kib: u64 = running
        .status("VmHWM")
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("VmHWM");
    let request = memory(&pod.agent, "requests");
    eprintln!(
        "agent peak RSS {:.1} MiB; the manifest requests {} MiB and limits {} MiB",
        peak_kib as f64 / 1024.0,
        request >> 20,
        memory(&pod.agent, "limits") >> 20
    );
    assert!(
        peak_kib * 1024 <= request,
        "peak {peak_kib} KiB over the request"
    );

    // The kubelet stops it; it comes back with the reservation.
    drop(toucher);
    let (status, log) = running.terminate(grace(&pod.agent));
    assert!(status.success(), "{status:?}: {log:#?}");
    assert!(
        log.iter()
            .all(|l| l["message"] != "mounted tracefs for tracepoint attachment"),
        "the agent mounted tracefs itself: {log:#?}"
    );
    let warnings = warnings_in(&log);
    assert!(warnings.is_empty(), "{warnings:#?}");
    let mut running = pod.start(&declared);
    running.wait_for("agent running", Duration::from_secs(20), |_| true);
    pod.ready(&running);
    let (status, listed) = pod.api(&running, "GET", "/v1/reservations", None);
    assert_eq!(status, 200);
    assert!(listed.to_string().contains(&reservation), "{listed}");
    let (status, log) = running.terminate(grace(&pod.agent));
    assert!(status.success(), "{status:?}: {log:#?}");
    drop(cgroup);
}

#[test]
fn each_declared_capability_is_needed_and_its_absence_is_named() {
    let lock = host_lock();
    let agent = rendered_agent();
    let _kubepods = Kubepods::create(&lock, SYSTEMD_DRIVER);
    let pod = Pod::new(agent);
    let declared = pod.agent.capabilities.clone();
    assert!(!declared.is_empty(), "the manifest adds capabilities");
    for missing in &declared {
        let fewer: Vec<String> = declared.iter().filter(|c| *c != missing).cloned().collect();
        let mut running = pod.start(&fewer);
        running.wait_for("agent running", Duration::from_secs(20), |l| {
            l["source"] == "sysfs"
        });
        assert_eq!(running.status("CapEff"), mask(&fewer));
        let body = pod.ready(&running);
        assert!(body.contains("refused"), "without CAP_{missing}: {body}");
        let (_, log) = running.terminate(grace(&pod.agent));
        let warning = log
            .iter()
            .filter(|l| l["level"] == "WARN")
            .filter_map(|l| l["message"].as_str())
            .find(|m| m.starts_with("eBPF unavailable, running on sysfs only"))
            .unwrap_or_else(|| panic!("without CAP_{missing}, no warning: {log:#?}"));
        eprintln!("without CAP_{missing}: {warning}");
        assert!(warning.contains("[EPERM]"), "{warning}");
        assert!(
            warning.contains(&format!("the agent lacks CAP_{missing} ")),
            "the warning names CAP_{missing}: {warning}"
        );
    }
}

#[test]
fn the_realtime_map_thread_component_runs_the_map_thread_under_sched_fifo_with_sys_nice_added() {
    let lock = host_lock();
    let agent = rendered_agent_with(&["realtime-map-thread"]);
    assert_eq!(agent.arg("--map-thread-priority"), Some("1"));
    let _kubepods = Kubepods::create(&lock, SYSTEMD_DRIVER);
    let pod = Pod::new(agent);
    let declared = pod.agent.capabilities.clone();
    assert_eq!(declared, ["BPF", "PERFMON", "SYS_NICE"]);
    let mut running = pod.start(&declared);
    running.wait_for("agent running", Duration::from_secs(20), |l| {
        l["source"] == "ebpf+sysfs" && l["map_thread_priority"] == "SCHED_FIFO 1"
    });
    assert_eq!(running.status("CapEff"), mask(&declared));
    // The map thread alone under SCHED_FIFO (policy 1), at priority 1 (fields 41 and 40 of a
    // thread's stat); the heavy lane is SCHED_IDLE, the others SCHED_OTHER.
    // (It drops to the default policy for each reconcile, the first as the loop starts: looked
    // at until seen real-time.)
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let policies = thread_schedules(running.pid);
        let realtime: Vec<_> = policies
            .iter()
            .filter(|(_, policy, _)| *policy == 1)
            .collect();
        if realtime == [&("map".to_owned(), 1, 1)] {
            break;
        }
        assert!(
            realtime.is_empty() && Instant::now() < deadline,
            "every thread: {policies:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, _) = running.terminate(grace(&pod.agent));
    assert!(status.success(), "{status:?}");
}

/// The `holders` component: `hostIPC`, `hostPID` and `/dev/hugepages`, no capability added.
/// Under exactly those the agent names a segment nothing attaches in the host's IPC namespace,
/// and a memfd this test holds open (this process has capabilities the agent lacks, so its
/// descriptors are closed to the agent: the task iterators, which see the host's processes
/// from its PID namespace, name it). Under the base DaemonSet neither is named, and the walk
/// says what it could not read.
#[test]
fn the_holders_component_sees_the_host_s_segments_and_the_task_iterators_other_processes_descriptors()
 {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let mut segment = hugetlbfs::Segment::touched(2, 2, None);
    segment.detach();
    // SAFETY: a NUL-terminated name; the descriptor is checked and owned.
    let memfd = unsafe {
        let fd = libc::memfd_create(c"daemonset-holders".as_ptr(), libc::MFD_HUGETLB);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        std::os::fd::OwnedFd::from_raw_fd(fd)
    };
    hugetlbfs::fault_file(&memfd, 1, MI2, None);
    let seen = |components: &[&str]| {
        let agent = rendered_agent_with(components);
        let _kubepods = Kubepods::create(&lock, SYSTEMD_DRIVER);
        let pod = Pod::new(agent);
        let declared = pod.agent.capabilities.clone();
        let mut running = pod.start(&declared);
        running.wait_for("agent running", Duration::from_secs(20), |_| true);
        assert_eq!(running.status("CapEff"), mask(&declared));
        let (status, answer) = pod.api(&running, "GET", "/v1/consumers", None);
        assert_eq!(status, 200, "{answer:#}");
        let (status, _) = running.terminate(grace(&pod.agent));
        assert!(status.success(), "{status:?}");
        (declared, answer)
    };

    let (declared, with) = seen(&["holders"]);
    assert_eq!(declared, ["BPF", "PERFMON"]);
    let holders = with["holders"].as_array().expect("holders");
    let s = holders
        .iter()
        .find(|h| h["shmid"] == segment.id)
        .unwrap_or_else(|| panic!("the segment in {with:#}"));
    assert_eq!(s["heldBytes"], 2 * MI2);
    assert_eq!(s["heldByNothingThatRuns"], true);
    let m = holders
        .iter()
        .find(|h| h["path"] == "/memfd:daemonset-holders")
        .unwrap_or_else(|| panic!("the memfd in {with:#}"));
    assert_eq!(m["users"][0]["pid"], std::process::id());
    assert_eq!(m["users"][0]["openFds"][0], memfd.as_raw_fd());

    let (_, without) = seen(&[]);
    let holders = without["holders"].as_array().expect("holders");
    assert!(
        holders
            .iter()
            .all(|h| h["shmid"] != segment.id && h["kind"] != "memfd"),
        "{without:#}"
    );
    let unread = without["unread"].to_string();
    assert!(
        unread.contains(
            "the task iterators, which would read them, are not loaded: the agent runs in a PID namespace of its own"
        ) && unread.contains("Permission denied"),
        "{without:#}"
    );
}

/// A node of cgroup v2 alone (this host's v2 hierarchy at `/sys/fs/cgroup`) with the
/// `psi-triggers` component: the same DaemonSet finds the kubepods cgroup of either kubelet
/// cgroup driver at that layout's place and arms a kernel trigger on each memory and io pressure
/// file, the host's cgroup hierarchy and `/proc/pressure` being writable to it, and nothing else
/// more.
#[test]
fn the_psi_triggers_component_arms_a_trigger_on_every_pressure_file_of_a_cgroup_v2_node() {
    let lock = host_lock();
    let base = rendered_agent();
    let agent = rendered_agent_with(&["psi-triggers"]);
    let writable = |a: &AgentPod| -> BTreeSet<String> {
        a.mounts
            .iter()
            .filter(|m| !m.read_only)
            .map(|m| m.path.clone())
            .collect()
    };
    let added: Vec<String> = writable(&agent)
        .difference(&writable(&base))
        .cloned()
        .collect();
    assert_eq!(added, ["/host/proc/pressure", "/host/sys/fs/cgroup"]);
    assert_eq!(agent.capabilities, base.capabilities);
    let pod = Pod::on(agent, Cgroups::V2Only);
    let declared = pod.agent.capabilities.clone();
    for driver in [SYSTEMD_DRIVER, "kubepods"] {
        let _kubepods = Kubepods::create(&lock, driver);
        let mut running = pod.start(&declared);
        running.wait_for("agent running", Duration::from_secs(20), |l| {
            l["source"] == "ebpf+sysfs"
        });
        pod.ready(&running);
        let psi = pod.conditions(&running);
        let kubepods = Cgroups::V2Only.kubepods(driver).expect("a kubepods cgroup");
        assert_eq!(triggers(&psi, true), pressure_files(&kubepods), "{psi}");
        for condition in psi["conditions"].as_array().expect("conditions") {
            assert_ne!(condition["status"], "Unknown", "{condition}");
        }
        let (status, log) = running.terminate(grace(&pod.agent));
        assert!(status.success(), "{status:?}: {log:#?}");
        let warnings = warnings_in(&log);
        assert!(warnings.is_empty(), "{driver}: {warnings:#?}");
    }
}

/// A cgroup v1 node (Amazon Linux 2's layout, made of this host's v1 hierarchies): the same
/// DaemonSet starts (no host path it mounts is missing there), the probes attach, admission is
/// verified, and the two kubepods conditions are Unknown saying that cgroup v1 has no pressure
/// files, while the system's are evaluated; its one warning is the fault probe's, which cannot
/// filter by cgroup there.
#[test]
fn on_a_cgroup_v1_node_the_same_daemonset_starts_and_names_what_it_cannot_read() {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 4);
    let pod = Pod::on(rendered_agent(), Cgroups::V1Only);
    let declared = pod.agent.capabilities.clone();
    let mut running = pod.start(&declared);
    running.wait_for("agent running", Duration::from_secs(20), |l| {
        l["source"] == "ebpf+sysfs"
    });
    let body = pod.ready(&running);
    assert!(body.contains("\"probes\":\"attached\""), "{body}");
    let asks = format!(
        r#"{{"pod":{{"namespace":"t","name":"p","uid":"17000000-0000-4000-8000-000000000017"}},"containers":[{{"name":"c","resources":{{"hugepages-2Mi":"{}"}}}}],"numaNodes":[0]}}"#,
        format_binary(2 * MI2)
    );
    let (status, admitted) = pod.api(&running, "POST", "/v1/admit", Some(&asks));
    assert_eq!(
        (status, &admitted["allowed"]),
        (200, &json!(true)),
        "{admitted}"
    );
    let psi = pod.conditions(&running);
    let conditions = psi["conditions"].as_array().expect("conditions");
    let kubepods = conditions
        .iter()
        .filter(|c| {
            c["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("Kubepods"))
        })
        .count();
    assert_eq!((conditions.len(), kubepods), (4, 2), "{psi}");
    for condition in conditions {
        let kind = condition["type"].as_str().expect("a type");
        if kind.starts_with("Kubepods") {
            assert_eq!(condition["status"], "Unknown", "{condition}");
            let message = condition["message"].as_str().unwrap_or_default();
            assert!(message.contains("cgroup v1"), "{condition}");
        } else {
            assert_ne!(condition["status"], "Unknown", "{condition}");
        }
    }
    let (status, log) = running.terminate(grace(&pod.agent));
    assert!(status.success(), "{status:?}: {log:#?}");
    // What it warns of is what a v1 node lacks, and nothing else.
    assert_eq!(
        warnings_in(&log),
        [
            "no cgroup v2 hierarchy: the fault probe cannot filter by cgroup and inspects every process"
        ],
        "{log:#?}"
    );
}
