//! Issue #22: the agent answers with its own node's kubelet's settings. A real process named
//! `kubelet` (the system shell copied under that name, waiting on its standard input, with the
//! kubelet's `--config` and overriding flags after its script) runs in a host tree whose `proc`
//! is this machine's `/proc` and whose sysfs is two NUMA nodes with a 1 GiB pool of 2 MiB pages
//! each. The agent, given nothing but `--host-root`, finds it, reads its command line and the
//! file it names, and its answer for a Guaranteed pod asking 1536Mi of 2 MiB pages and 1Gi of
//! memory follows the policy: admitted on `[0,1]` under `none` and `best-effort`,
//! `TopologyAffinityError` under `single-numa-node`. A kubelet restarted with other flags is
//! noticed within seconds; a configuration that does not parse keeps the last good settings and
//! says why; once no kubelet runs, the agent falls back to the kubelet's defaults and says so.
//!
//! Issue #45: a process a pod could run under the name `kubelet`, with flags that would turn
//! verification off and a `--config` of its choosing, is never followed: one in a pod-shaped
//! cgroup, one in a mount namespace of its own, one in a PID namespace of its own. The agent
//! names each in `GET /v1/kubelet` with why, keeps the file the operator named, and follows the
//! host's kubelet once one starts.
//!
//! This machine runs no kubelet of its own (checked first: the agent would find it too). Every
//! process started is killed and every directory removed on every exit path (drop guards).

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use hugepage_agent_tests::{Agent, Nested, TestCgroup, agent_bin, host_lock, http};

/// Where the stand-in's `--config` points, as a host path (under the tree).
const CONFIG: &str = "/etc/kubernetes/kubelet-config.yaml";
/// The pod of the issue.
const POD: &str = r#"{"pod": {"namespace": "dpdk", "name": "fwd", "qosClass": "Guaranteed"}, "containers": [{"name": "fwd", "resources": {"hugepages-2Mi": "1536Mi", "memory": "1Gi"}}]}"#;

fn put(root: &Path, path: &str, content: &str) {
    let full = root.join(path.trim_start_matches('/'));
    fs::create_dir_all(full.parent().expect("a parent")).expect("mkdir");
    fs::write(&full, content).expect("write");
}

/// Two NUMA nodes, each with a 1 GiB pool of 2 MiB pages, all free, and 16 GiB of memory; the
/// real `/proc`; the kubelet's configuration file (the static Memory Manager policy, so NUMA
/// nodes are selected; `single-numa-node` unless the command line says otherwise).
fn host_tree(root: &Path) {
    std::os::unix::fs::symlink("/proc", root.join("proc")).expect("proc");
    put(root, "/sys/devices/system/node/online", "0-1\n");
    for node in 0..2 {
        let n = format!("/sys/devices/system/node/node{node}");
        put(root, &format!("{n}/cpulist"), &format!("{node}\n"));
        let distance = if node == 0 { "10 20\n" } else { "20 10\n" };
        put(root, &format!("{n}/distance"), distance);
        put(
            root,
            &format!("{n}/meminfo"),
            &format!("Node {node} MemTotal:       16777216 kB\n"),
        );
        for (file, v) in [
            ("nr_hugepages", "512\n"),
            ("free_hugepages", "512\n"),
            ("surplus_hugepages", "0\n"),
        ] {
            put(root, &format!("{n}/hugepages/hugepages-2048kB/{file}"), v);
        }
    }
    for (file, v) in [
        ("nr_hugepages", "1024\n"),
        ("free_hugepages", "1024\n"),
        ("resv_hugepages", "0\n"),
        ("surplus_hugepages", "0\n"),
    ] {
        put(
            root,
            &format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{file}"),
            v,
        );
    }
    put(
        root,
        CONFIG,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nmemoryManagerPolicy: Static\ntopologyManagerPolicy: single-numa-node\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 100Mi\n",
    );
}

/// A process named `kubelet` with the kubelet's arguments, killed and reaped on drop.
struct Kubelet {
    child: Child,
}

impl Kubelet {
    /// `exe` (the shell copied as `kubelet`) waiting on its standard input, with `args` after
    /// its script as the kubelet's own.
    fn start(exe: &Path, args: &[&str]) -> Kubelet {
        Kubelet::start_under(&[], exe, args)
    }

    /// The same, run by `wrapper` (e.g. `unshare --mount`), which execs or forks it.
    fn start_under(wrapper: &[&str], exe: &Path, args: &[&str]) -> Kubelet {
        let mut command = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut command = Command::new(program);
                command.args(rest).arg(exe);
                command
            }
            None => Command::new(exe),
        };
        let child = command
            .args(["-c", "read line", "kubelet"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the stand-in kubelet");
        Kubelet { child }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// No process of this machine is named `kubelet`: the test's stand-in must be the only one.
fn no_kubelet_runs() {
    for entry in fs::read_dir("/proc").expect("/proc").flatten() {
        let comm = fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        assert_ne!(
            comm.trim_end(),
            "kubelet",
            "a kubelet runs here ({}): the agent would read it",
            entry.path().display()
        );
    }
}

fn get(port: u16, path: &str) -> serde_json::Value {
    let (status, body) = http(port, "GET", path, None, "");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

fn admit(port: u16) -> serde_json::Value {
    let (status, body) = http(port, "POST", "/v1/admit", Some("application/json"), POD);
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Waits until `GET /v1/kubelet` satisfies `pred` (the agent checks at the checkpoint's pace).
fn settings_until(
    port: u16,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let answer = get(port, "/v1/kubelet");
        if pred(&answer) {
            return answer;
        }
        assert!(Instant::now() < deadline, "{what}: {answer:#}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn setting<'a>(answer: &'a serde_json::Value, name: &str) -> (&'a str, &'a str) {
    let s = &answer["settings"][name];
    (
        s["value"].as_str().unwrap_or_default(),
        s["source"].as_str().unwrap_or_default(),
    )
}

#[test]
fn the_agent_answers_with_the_running_kubelets_policy_follows_its_restarts_and_falls_back() {
    // Processes named kubelet are the host's: no other test may run one meanwhile.
    let _lock = host_lock();
    no_kubelet_runs();
    let tree = tempfile::tempdir().expect("a host tree");
    host_tree(tree.path());
    let bin = tempfile::tempdir().expect("a directory for the stand-in");
    let exe: PathBuf = bin.path().join("kubelet");
    fs::copy("/bin/sh", &exe).expect("copy the shell as kubelet");

    let kubelet = Kubelet::start(
        &exe,
        &["--config", CONFIG, "--topology-manager-policy=none"],
    );
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree.path())
        .args(["--ebpf", "off"]);
    let mut agent = Agent::start(cmd);
    let port = agent.port;
    let line = agent.wait_for("kubelet settings", Duration::from_secs(20), |_| true);
    let origin = format!("the kubelet, pid {}, {CONFIG}", kubelet.pid());
    assert_eq!(line["origin"], origin.as_str(), "{line:#}");
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);

    // `none`, from the kubelet's command line over its file: admitted across both nodes.
    let answer = get(port, "/v1/kubelet");
    let cmdline = format!("kubelet command line (pid {})", kubelet.pid());
    assert_eq!(
        setting(&answer, "topologyManagerPolicy"),
        ("none", cmdline.as_str())
    );
    let file = format!("file {CONFIG}");
    assert_eq!(
        setting(&answer, "memoryManagerPolicy"),
        ("Static", file.as_str())
    );
    let admitted = admit(port);
    assert_eq!(admitted["allowed"], true, "{admitted:#}");
    assert_eq!(admitted["numaNodes"], serde_json::json!([0, 1]));
    assert_eq!(admitted["selection"]["basis"], "static-policy");
    let (_, metrics) = http(port, "GET", "/metrics", None, "");
    let info = format!(
        "hugepage_agent_kubelet_setting_info{{setting=\"topologyManagerPolicy\",value=\"none\",source=\"{cmdline}\"}} 1"
    );
    assert!(metrics.lines().any(|l| l == info), "{info} in\n{metrics}");

    // The kubelet restarts with `best-effort`: noticed, and the answer is the same.
    drop(kubelet);
    let kubelet = Kubelet::start(
        &exe,
        &[
            "--config",
            CONFIG,
            "--topology-manager-policy",
            "best-effort",
        ],
    );
    let cmdline = format!("kubelet command line (pid {})", kubelet.pid());
    settings_until(port, "best-effort", |a| {
        setting(a, "topologyManagerPolicy") == ("best-effort", cmdline.as_str())
    });
    let changed = agent.wait_for("kubelet settings", Duration::from_secs(10), |l| {
        l["changed"]
            .as_str()
            .is_some_and(|c| c.contains("topologyManagerPolicy: none -> best-effort"))
    });
    assert!(
        changed["origin"]
            .as_str()
            .is_some_and(|o| o.contains(&kubelet.pid().to_string()))
    );
    let admitted = admit(port);
    assert_eq!(admitted["allowed"], true, "{admitted:#}");
    assert_eq!(admitted["numaNodes"], serde_json::json!([0, 1]));

    // Restarted without the flag: its file's `single-numa-node`, under which no node alone has
    // 1536Mi of 2 MiB pages.
    drop(kubelet);
    let kubelet = Kubelet::start(&exe, &["--config", CONFIG]);
    settings_until(port, "single-numa-node", |a| {
        setting(a, "topologyManagerPolicy") == ("single-numa-node", file.as_str())
    });
    let refused = admit(port);
    assert_eq!(refused["allowed"], false, "{refused:#}");
    assert_eq!(refused["reason"], "TopologyAffinityError", "{refused:#}");
    assert_eq!(
        refused["message"],
        "Resources cannot be allocated with Topology locality"
    );

    // A file that does not parse: one error naming it, the last good settings kept.
    put(
        tree.path(),
        CONFIG,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: [none\n",
    );
    let kept = settings_until(port, "the error", |a| a["error"].is_string());
    let error = kept["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(&format!("{}: not YAML or JSON", CONFIG)),
        "{error}"
    );
    let (value, source) = setting(&kept, "topologyManagerPolicy");
    assert_eq!(value, "single-numa-node");
    assert!(
        source.ends_with("(kept: the latest reading failed)"),
        "{source}"
    );
    assert_eq!(admit(port)["reason"], "TopologyAffinityError");
    agent.lines_with("");
    let warnings: Vec<&str> = agent
        .log
        .seen
        .iter()
        .filter_map(|l| l["message"].as_str())
        .filter(|m| m.starts_with("reading the kubelet's settings"))
        .collect();
    assert!(warnings.len() <= 1, "said once: {warnings:#?}");

    // The kubelet stops: the agent falls back to the kubelet's defaults, and says so.
    drop(kubelet);
    let fallback = settings_until(port, "the fallback", |a| {
        a["origin"]
            .as_str()
            .is_some_and(|o| o.starts_with("no kubelet process"))
    });
    assert!(fallback["error"].is_null(), "{fallback:#}");
    assert_eq!(
        setting(&fallback, "memoryManagerPolicy"),
        ("None", "kubelet default")
    );
    agent.wait_for("kubelet settings", Duration::from_secs(10), |l| {
        l["origin"]
            .as_str()
            .is_some_and(|o| o.starts_with("no kubelet process"))
    });
    // Memory Manager policy None pins nothing: verified on every node, and the answer says so.
    let answer = admit(port);
    assert_eq!(answer["allowed"], true, "{answer:#}");
    assert_eq!(answer["numaNodes"], serde_json::json!([0, 1]));
    assert_eq!(answer["selection"]["basis"], "node-wide", "{answer:#}");

    let (status, _) = agent.terminate();
    assert!(status.success(), "{status:?}");
}

/// The pid of the process named `kubelet` that `parent` is or forked (`unshare --fork`).
fn kubelet_pid(parent: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let comm = |pid: u32| fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm(parent).trim_end() == "kubelet" {
            return parent;
        }
        let children = fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
            .unwrap_or_default();
        if let Some(child) = children
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
            .find(|&c| comm(c).trim_end() == "kubelet")
        {
            return child;
        }
        assert!(Instant::now() < deadline, "no kubelet under pid {parent}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn processes_named_kubelet_that_are_not_the_hosts_are_named_and_never_followed() {
    let lock = host_lock();
    no_kubelet_runs();
    let tree = tempfile::tempdir().expect("a host tree");
    host_tree(tree.path());
    let bin = tempfile::tempdir().expect("a directory for the stand-in");
    let exe: PathBuf = bin.path().join("kubelet");
    fs::copy("/bin/sh", &exe).expect("copy the shell as kubelet");
    put(
        tree.path(),
        "/tmp/not-a-kubelet.yaml",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ntopologyManagerPolicy: none\n",
    );
    let off = [
        "--config=/tmp/not-a-kubelet.yaml",
        "--feature-gates=MemoryManagerHugepagesVerification=false",
    ];
    // A pod's: the cgroup v2 group a kubelet of the systemd driver makes for a pod.
    let root = TestCgroup::create(&lock, "kubelet-impostor");
    let slice = root.dir.join("kubepods.slice");
    let pod = slice.join("kubepods-pod1b4e28ba_2fa1_11d2_883f_0016d3cca427.slice");
    let _nested = Nested(vec![slice, pod.clone()]);
    fs::create_dir_all(&pod).expect("the pod's cgroup");
    let in_pod = Kubelet::start(&exe, &off);
    fs::write(pod.join("cgroup.procs"), in_pod.pid().to_string()).expect("move into the pod");
    let in_mounts = Kubelet::start_under(
        &["unshare", "--mount", "--propagation", "private"],
        &exe,
        &off,
    );
    let in_pids = Kubelet::start_under(&["unshare", "--pid", "--fork", "--kill-child"], &exe, &off);
    let impostors = [
        (in_pod.pid(), "is a pod's"),
        (
            kubelet_pid(in_mounts.pid()),
            "its root or mount namespace is not the host's",
        ),
        (
            kubelet_pid(in_pids.pid()),
            "it runs in a PID namespace of its own",
        ),
    ];

    let mut cmd = Command::new(agent_bin());
    cmd.arg("run").arg("--host-root").arg(tree.path()).args([
        "--kubelet-config",
        CONFIG,
        "--ebpf",
        "off",
    ]);
    let mut agent = Agent::start(cmd);
    let port = agent.port;
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    let answer = get(port, "/v1/kubelet");
    assert_eq!(
        answer["origin"],
        format!(
            "no kubelet process; --kubelet-config {CONFIG} (3 other process(es) named kubelet are not the host's: GET /v1/kubelet says why)"
        )
        .as_str(),
        "{answer:#}"
    );
    let candidates = answer["candidates"].as_array().expect("candidates");
    for (pid, why) in impostors {
        let named = candidates
            .iter()
            .find(|c| c["pid"] == pid)
            .unwrap_or_else(|| panic!("pid {pid} not named: {answer:#}"));
        let refused = named["refused"].as_str().unwrap_or_default();
        assert!(refused.contains(why), "pid {pid}: {refused}");
    }
    // Verification stays on and the policy is the operator's file's, not the impostors'.
    assert_eq!(
        setting(&answer, "featureGates.MemoryManagerHugepagesVerification").0,
        "true",
        "{answer:#}"
    );
    let file = format!("file {CONFIG}");
    assert_eq!(
        setting(&answer, "topologyManagerPolicy"),
        ("single-numa-node", file.as_str())
    );

    // The host's kubelet, once it starts, is followed beside them.
    let kubelet = Kubelet::start(
        &exe,
        &["--config", CONFIG, "--topology-manager-policy=restricted"],
    );
    let pid = kubelet.pid();
    let answer = settings_until(port, "the host's kubelet followed", |a| {
        a["origin"]
            .as_str()
            .is_some_and(|o| o.starts_with(&format!("the kubelet, pid {pid}, ")))
    });
    let cmdline = format!("kubelet command line (pid {pid})");
    assert_eq!(
        setting(&answer, "topologyManagerPolicy"),
        ("restricted", cmdline.as_str())
    );
    assert_eq!(
        setting(&answer, "featureGates.MemoryManagerHugepagesVerification").0,
        "true"
    );
    drop(agent);
    drop((kubelet, in_pod, in_mounts, in_pids));
    // The forked one (a PID namespace's first process) ends when its standard input closes,
    // after its parent: gone before the lock is let go, so the next test finds no kubelet.
    for (pid, _) in impostors {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < deadline, "pid {pid} still runs");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    drop(lock);
}
