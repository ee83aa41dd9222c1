use std::{fs, path::Path};

use super::*;
use crate::{
    kubeletconfig::settings::{KubeletSettings, MemoryManagerPolicy, Source},
    sysfs::fake,
    topologymanager::Policy,
};

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/kubeletconfig/testdata")
        .join(name);
    fs::read_to_string(path).expect("fixture")
}

/// pid 1's root mount, which a host process shares.
const HOST_ROOT: &str = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";

/// A process `pid` under the fake `/proc`: its `comm`, argv and working directory, in the
/// host's cgroups, PID namespace and root (pid 1's mounts written too).
fn process(root: &Path, pid: u32, comm: &str, argv: &[&str], cwd: &str, start: u64) {
    process_in(root, pid, comm, argv, cwd, start, Place::HOST);
}

/// Where a fake process runs: its cgroup file, its `NSpid` and its `mountinfo`.
#[derive(Clone, Copy)]
struct Place {
    cgroup: &'static str,
    nspid: &'static str,
    mountinfo: &'static str,
}

impl Place {
    const HOST: Place = Place {
        cgroup: "0::/system.slice/kubelet.service\n",
        nspid: "4242",
        mountinfo: HOST_ROOT,
    };
}

fn process_in(
    root: &Path,
    pid: u32,
    comm: &str,
    argv: &[&str],
    cwd: &str,
    start: u64,
    place: Place,
) {
    fake::write(root, "/proc/1/mountinfo", HOST_ROOT);
    fake::write(root, &format!("/proc/{pid}/cgroup"), place.cgroup);
    fake::write(
        root,
        &format!("/proc/{pid}/status"),
        &format!("Name:\t{comm}\nNSpid:\t{}\n", place.nspid),
    );
    fake::write(root, &format!("/proc/{pid}/mountinfo"), place.mountinfo);
    fake::write(root, &format!("/proc/{pid}/comm"), &format!("{comm}\n"));
    fake::write(
        root,
        &format!("/proc/{pid}/cmdline"),
        &(argv.join("\0") + "\0"),
    );
    let fields: Vec<String> = (4..=21).map(|i| i.to_string()).collect();
    fake::write(
        root,
        &format!("/proc/{pid}/stat"),
        &format!("{pid} ({comm}) S {} {start} 0 0\n", fields.join(" ")),
    );
    std::os::unix::fs::symlink(cwd, root.join(format!("proc/{pid}/cwd"))).expect("cwd link");
}

fn settings(reading: Reading) -> (String, KubeletSettings) {
    let found = reading.outcome.expect("found");
    let layers: Vec<&Layer> = found.layers.iter().collect();
    (found.origin, KubeletSettings::resolve(&layers))
}

#[test]
fn the_running_kubelets_command_line_and_files_are_read_relative_to_its_directory() {
    let (dir, host) = fake::tree(&[
        ("/proc/1/comm", "systemd\n"),
        ("/proc/1/cmdline", "/sbin/init\0"),
        (
            "/var/lib/kubelet/config.yaml",
            &fixture("kubeadm-config.yaml"),
        ),
        (
            "/etc/kubernetes/kubelet.conf.d/20-scope.conf",
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerScope: container\n",
        ),
        ("/etc/kubernetes/kubelet.conf.d/README", "not a drop-in"),
    ]);
    process(
        dir.path(),
        4242,
        "kubelet",
        &[
            "/usr/bin/kubelet",
            "--config",
            "config.yaml",
            "--config-dir=/etc/kubernetes/kubelet.conf.d",
            "--topology-manager-policy=restricted",
        ],
        "/var/lib/kubelet",
        900,
    );
    let reading = read(&host, None);
    assert_eq!(
        reading.stamp.kubelet,
        Some(KubeletProcess {
            pid: 4242,
            start_time: 900
        })
    );
    let (origin, s) = settings(reading);
    assert_eq!(
        origin,
        "the kubelet, pid 4242, /var/lib/kubelet/config.yaml, drop-ins /etc/kubernetes/kubelet.conf.d"
    );
    assert_eq!(s.policy.value, Policy::Restricted);
    assert_eq!(s.policy.source, Source::KubeletCmdline { pid: 4242 });
    assert_eq!(
        s.scope.source,
        Source::DropIn("/etc/kubernetes/kubelet.conf.d/20-scope.conf".into())
    );
    assert_eq!(
        s.memory_manager_policy.source,
        Source::File("/var/lib/kubelet/config.yaml".into())
    );
}

#[test]
fn a_kubelet_is_known_by_argv0_too_and_two_on_the_host_are_followed_by_none() {
    let (dir, host) = fake::tree(&[]);
    process(
        dir.path(),
        10,
        "kubelet-1.35",
        &["/opt/bin/kubelet"],
        "/",
        300,
    );
    process(dir.path(), 12, "sh", &["sh", "-c", "kubelet"], "/", 100);
    assert_eq!(
        find_kubelet(&host).expect("proc"),
        Some(KubeletProcess {
            pid: 10,
            start_time: 300
        })
    );
    process(dir.path(), 11, "kubelet", &["kubelet"], "/", 200);
    assert_eq!(find_kubelet(&host).expect("proc"), None);
    let reading = read(&host, None);
    assert_eq!(reading.stamp.kubelet, None);
    assert_eq!(
        reading.outcome.expect_err("ambiguous").to_string(),
        "2 processes that look like the host's kubelet run (pids 11, 10): the agent follows none of them; name the kubelet's configuration file with --kubelet-config"
    );
    // Named by the operator, the file is read.
    fake::write(
        dir.path(),
        "/etc/kubelet.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: restricted\n",
    );
    let (origin, s) = settings(read(&host, Some(Path::new("/etc/kubelet.yaml"))));
    assert_eq!(
        origin,
        "2 processes look like the host's kubelet (pids 11, 10), so none is followed; --kubelet-config /etc/kubelet.yaml"
    );
    assert_eq!(s.policy.value, Policy::Restricted);
    assert_eq!(
        start_time("1 (a b) c) S 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 77 0"),
        Some(77)
    );
}

#[test]
fn without_a_kubelet_the_usual_places_are_tried_and_else_the_kubelets_defaults() {
    let (dir, host) = fake::tree(&[("/proc/1/comm", "systemd\n"), ("/proc/1/cmdline", "init\0")]);
    let reading = read(&host, None);
    let (origin, s) = settings(reading);
    assert!(origin.contains("the kubelet's defaults"), "{origin}");
    assert_eq!(s.policy.source, Source::KubeletDefault);
    // EKS AL2023: the file and its drop-ins.
    fake::write(
        dir.path(),
        "/etc/kubernetes/kubelet/config.json",
        &fixture("eks-al2023/config.json"),
    );
    for name in ["40-nodeadm.conf", "50-numa.conf"] {
        fake::write(
            dir.path(),
            &format!("/etc/kubernetes/kubelet/config.json.d/{name}"),
            &fixture(&format!("eks-al2023/config.json.d/{name}")),
        );
    }
    let (origin, s) = settings(read(&host, None));
    assert_eq!(
        origin,
        "no kubelet process; /etc/kubernetes/kubelet/config.json, /etc/kubernetes/kubelet/config.json.d"
    );
    assert_eq!(s.policy.value, Policy::SingleNumaNode);
    // kubeadm's place comes first.
    fake::write(
        dir.path(),
        "/var/lib/kubelet/config.yaml",
        &fixture("kubeadm-config.yaml"),
    );
    let (_, s) = settings(read(&host, None));
    assert_eq!(s.memory_manager_policy.value, MemoryManagerPolicy::Static);
    // --kubelet-config names one file, whatever else there is.
    let (origin, s) = settings(read(
        &host,
        Some(Path::new("/etc/kubernetes/kubelet/config.json")),
    ));
    assert!(
        origin.ends_with("--kubelet-config /etc/kubernetes/kubelet/config.json"),
        "{origin}"
    );
    assert_eq!(s.policy.value, Policy::None);
}

/// A second process that looks like the host's kubelet, started while one is followed: the
/// followed one's own `stat` does not show it, the periodic scan does, and the reading then
/// follows neither.
#[test]
fn a_second_host_kubelet_appearing_is_seen_at_the_next_scan_and_then_none_is_followed() {
    let (dir, host) = fake::tree(&[(
        "/etc/kubelet.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
    )]);
    process(
        dir.path(),
        77,
        "kubelet",
        &["kubelet", "--config=/etc/kubelet.yaml"],
        "/",
        5,
    );
    let reading = read(&host, None);
    assert!(reading.outcome.is_ok());
    let stamp = reading.stamp;
    assert_eq!(stamp.hosts.len(), 1);
    process(
        dir.path(),
        90,
        "kubelet",
        &[
            "kubelet",
            "--feature-gates=MemoryManagerHugepagesVerification=false",
        ],
        "/",
        9,
    );
    assert_eq!(
        restamp(&host, &stamp, false),
        stamp,
        "between scans only the followed kubelet is looked at"
    );
    let scanned = restamp(&host, &stamp, true);
    assert_ne!(scanned, stamp, "the scan sees the second one");
    assert_eq!(scanned.kubelet, None);
    assert_eq!(
        scanned.hosts.iter().map(|k| k.pid).collect::<Vec<_>>(),
        [77, 90]
    );
    let err = read(&host, None)
        .outcome
        .expect_err("ambiguous")
        .to_string();
    assert!(err.contains("77") && err.contains("90"), "{err}");
}

#[test]
fn bad_input_is_one_error_naming_the_file_and_a_change_is_seen_in_the_stamp() {
    let (dir, host) = fake::tree(&[(
        "/etc/kubelet.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: none\n",
    )]);
    process(
        dir.path(),
        77,
        "kubelet",
        &["kubelet", "--config=/etc/missing.yaml"],
        "/",
        5,
    );
    let reading = read(&host, None);
    let err = reading.outcome.expect_err("missing").to_string();
    assert_eq!(
        err,
        "/etc/missing.yaml (--config of the kubelet, pid 77): no such file"
    );
    // The file appearing is a change.
    let stamp = reading.stamp;
    assert_eq!(restamp(&host, &stamp, false), stamp);
    assert_eq!(restamp(&host, &stamp, true), stamp);
    fake::write(
        dir.path(),
        "/etc/missing.yaml",
        "topologyManagerPolicy: [\n",
    );
    assert_ne!(restamp(&host, &stamp, false), stamp);
    let err = read(&host, None).outcome.expect_err("syntax").to_string();
    assert!(
        err.starts_with("/etc/missing.yaml: not YAML or JSON"),
        "{err}"
    );
    // A missing --config-dir stops the kubelet: an error here too.
    fs::remove_dir_all(dir.path().join("proc/77")).expect("rm");
    process(
        dir.path(),
        78,
        "kubelet",
        &["kubelet", "--config-dir", "/etc/kubelet.d"],
        "/",
        6,
    );
    let err = read(&host, None).outcome.expect_err("no dir").to_string();
    assert_eq!(
        err,
        "/etc/kubelet.d (--config-dir of the kubelet, pid 78): no such file"
    );
    // An unreadable working directory, when a path is relative, names the /proc entry.
    fs::remove_dir_all(dir.path().join("proc/78")).expect("rm");
    fake::write(dir.path(), "/proc/79/comm", "kubelet\n");
    fake::write(
        dir.path(),
        "/proc/79/cmdline",
        "kubelet\0--config\0k.yaml\0",
    );
    fake::write(
        dir.path(),
        "/proc/79/stat",
        "79 (kubelet) S 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 7 0\n",
    );
    fake::write(dir.path(), "/proc/79/cgroup", Place::HOST.cgroup);
    fake::write(dir.path(), "/proc/79/status", "NSpid:\t79\n");
    fake::write(dir.path(), "/proc/79/mountinfo", HOST_ROOT);
    let err = read(&host, None).outcome.expect_err("no cwd").to_string();
    assert!(
        err.starts_with(&format!(
            "reading {}",
            dir.path().join("proc/79/cwd").display()
        )),
        "{err}"
    );
}

#[test]
fn a_process_named_kubelet_in_a_pod_a_container_or_namespaces_of_its_own_is_never_followed() {
    let (dir, host) = fake::tree(&[(
        "/var/lib/kubelet/config.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: best-effort\n",
    )]);
    let off = [
        "kubelet",
        "--feature-gates=MemoryManagerHugepagesVerification=false",
        "--config=/tmp/not-a-kubelet.yaml",
    ];
    let places = [
        (
            20,
            Place {
                cgroup: "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-ab.scope\n",
                ..Place::HOST
            },
            "its cgroup /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice/cri-containerd-ab.scope is a pod's",
        ),
        (
            21,
            Place {
                cgroup: "12:memory:/kubepods/besteffort/pod1234/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n0::/\n",
                ..Place::HOST
            },
            "its cgroup /kubepods/besteffort/pod1234/0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef is a pod's",
        ),
        (
            22,
            Place {
                cgroup: "0::/system.slice/docker-0123.scope\n",
                ..Place::HOST
            },
            "its cgroup /system.slice/docker-0123.scope is a container's",
        ),
        (
            23,
            Place {
                nspid: "23 1",
                ..Place::HOST
            },
            "it runs in a PID namespace of its own (NSpid 23 1)",
        ),
        (
            24,
            Place {
                mountinfo: "1021 980 0:310 / / rw - overlay overlay rw\n",
                ..Place::HOST
            },
            "its root or mount namespace is not the host's: its / is mount 1021 of device 0:310 at /, pid 1's is mount 27 of 254:0 at /",
        ),
    ];
    for (pid, place, _) in places {
        process_in(dir.path(), pid, "kubelet", &off, "/", u64::from(pid), place);
    }
    let reading = read(&host, None);
    let refused: Vec<(u32, String)> = reading
        .candidates
        .iter()
        .map(|c| (c.pid, c.refused.clone().unwrap_or_default()))
        .collect();
    let expected: Vec<(u32, String)> = places
        .iter()
        .map(|(pid, _, why)| (*pid, (*why).to_owned()))
        .collect();
    assert_eq!(refused, expected);
    assert_eq!(reading.stamp.kubelet, None);
    // The settings are the host's file's, and the origin says others were passed over.
    let (origin, s) = settings(reading);
    assert_eq!(
        origin,
        "no kubelet process; /var/lib/kubelet/config.yaml (5 other process(es) named kubelet are not the host's: GET /v1/kubelet says why)"
    );
    assert_eq!(s.policy.value, Policy::BestEffort);
    assert!(s.verification());
    // A file the process cannot be judged by is not taken either.
    fs::remove_file(dir.path().join("proc/1/mountinfo")).expect("rm");
    process_in(dir.path(), 30, "kubelet", &["kubelet"], "/", 1, Place::HOST);
    fs::remove_file(dir.path().join("proc/1/mountinfo")).expect("rm");
    let last = candidates(&host).expect("proc").remove(0);
    assert_eq!(
        last.refused.as_deref(),
        Some("pid 1's mounts cannot be read, so no process can be shown to share the host's root")
    );
}

#[test]
fn the_hosts_root_mount_is_the_last_mount_on_slash() {
    let text = "22 27 0:21 / /proc rw - proc proc rw\n27 1 254:0 / / rw - ext4 /dev/vda rw\n90 27 0:50 / / rw - tmpfs tmpfs rw\n";
    assert_eq!(
        root_mount(text),
        Some(RootMount {
            id: "90".into(),
            device: "0:50".into(),
            root: "/".into()
        })
    );
    assert_eq!(root_mount("22 27 0:21 / /proc rw - proc proc rw\n"), None);
    assert_eq!(pid_namespace_not_the_hosts("Name:\tkubelet\n"), None);
    assert_eq!(
        cgroup_not_the_hosts("0::/system.slice/kubelet.service\n1:name=systemd:/\n"),
        None
    );
}
