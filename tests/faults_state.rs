//! Faults of the state on disk, injected on the real kernel under the real agent binary: its
//! state directory turning read-only or full under an admission that reserves (a tmpfs
//! remounted read-only, or filled), `kill -9` at random moments while reservations are written,
//! and the kubelet's Memory Manager checkpoint rewritten in place or torn while the agent reads
//! it. Each test says what it injects, what the agent must do, and what is lost: nothing.

use std::{
    collections::BTreeMap,
    fs,
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use hugepage_agent::admission::reservations::{self, Reservation};
use hugepage_agent_tests::{
    Agent, HostLock, HugepagePool, agent_bin, fresh_state_dir, host_lock, http, node0_checkpoint,
    rng::Rng,
};
use serde_json::{Value, json};

const FILE: &str = "reservations.json";
const TMP: &str = "reservations.json.tmp";
const MI2: u64 = 2 << 20;

/// A tmpfs of `size` mounted on a fresh directory; unmounted (lazily if something still holds
/// it) and the directory removed when dropped, whatever state the test left it in.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(_lock: &HostLock, size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("hugepage-agent-faults-")
            .tempdir()
            .expect("a directory to mount on");
        let options = format!("size={size},mode=0755");
        mount(
            &["-t", "tmpfs", "-o", &options, "hugepage-agent-test"],
            dir.path(),
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `mount -o remount,<options>`: `ro` or `rw`.
    fn remount(&self, options: &str) {
        mount(&["-o", &format!("remount,{options}")], self.path());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let umount = |args: &[&str]| {
            Command::new("umount")
                .args(args)
                .arg(self.path())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !umount(&[]) && !umount(&["-l"]) {
            eprintln!("could not unmount {}", self.path().display());
        }
    }
}

fn mount(args: &[&str], target: &Path) {
    let out = Command::new("mount")
        .args(args)
        .arg(target)
        .output()
        .expect("run mount");
    assert!(
        out.status.success(),
        "mount {args:?} {}: {}",
        target.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The agent with eBPF off (the faults here are in the state files; the probes add time to
/// every start and nothing to what is tested) and no reservation ending by its TTL while a test
/// runs; on `state_dir` when given (else [`Agent::start`] makes a fresh one).
fn agent(state_dir: Option<&Path>, extra: &[&str]) -> Command {
    let mut cmd = Command::new(agent_bin());
    cmd.args(["run", "--ebpf", "off", "--reservation-ttl", "1h"]);
    if let Some(dir) = state_dir {
        cmd.arg("--state-dir").arg(dir);
    }
    cmd.args(extra);
    cmd
}

/// Messages of the agent's log lines so far that start with `start`.
fn logged(running: &mut Agent, start: &str) -> Vec<String> {
    running.log.drain(Duration::from_millis(50));
    running
        .log
        .seen
        .iter()
        .filter_map(|l| l["message"].as_str())
        .filter(|m| m.starts_with(start))
        .map(str::to_owned)
        .collect()
}

/// The `n`th test pod's UID.
fn uid(n: u32) -> String {
    format!("fa0175{n:02x}-0000-4000-8000-{n:012x}")
}

/// A request that reserves one 2 MiB page on node 0 for pod `uid`.
fn reserving(uid: &str) -> String {
    json!({
        "pod": {"namespace": "faults", "name": format!("pod-{}", &uid[..8]), "uid": uid},
        "containers": [{"name": "app", "resources": {"hugepages-2Mi": "2Mi"}}],
        "numaNodes": [0]
    })
    .to_string()
}

/// Admits pod `uid`, which must be admitted with a reservation: the answer.
fn admitted(port: u16, uid: &str) -> Value {
    let (status, body) = http(
        port,
        "POST",
        "/v1/admit",
        Some("application/json"),
        &reserving(uid),
    );
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(answer["allowed"], true, "{answer:#}");
    assert!(answer["reservation"]["id"].is_string(), "{answer:#}");
    answer
}

/// The reservations the agent lists, by id → pod UID.
fn listed(port: u16) -> BTreeMap<String, String> {
    let (status, body) = http(port, "GET", "/v1/reservations", None, "");
    assert_eq!(status, 200, "{body}");
    let value: Value = serde_json::from_str(&body).expect("JSON");
    by_id(
        &serde_json::from_value::<Vec<Reservation>>(value["reservations"].clone())
            .expect("reservations"),
    )
}

fn by_id(list: &[Reservation]) -> BTreeMap<String, String> {
    list.iter()
        .map(|r| (r.id.clone(), r.pod_uid.clone()))
        .collect()
}

/// The reservations file in `dir`, which must parse with a valid checksum (none: no file yet).
fn on_disk(dir: &Path) -> Vec<Reservation> {
    match fs::read(dir.join(FILE)) {
        Ok(text) => reservations::parse(&text).unwrap_or_else(|why| {
            panic!(
                "{FILE} is torn or corrupt: {why}\n{}",
                String::from_utf8_lossy(&text)
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => panic!("reading {FILE}: {e}"),
    }
}

/// The names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read the state directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Bytes of 2 MiB pages the agent holds for its reservations on node 0.
fn held_on_node0(port: u16) -> u64 {
    let (_, body) = http(port, "GET", "/v1/hugepages", None, "");
    let value: Value = serde_json::from_str(&body).expect("JSON");
    value["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == 0))
        .and_then(|n| n["sizes"].as_array())
        .and_then(|sizes| sizes.iter().find(|s| s["pageSizeBytes"] == MI2))
        .and_then(|s| s["reservedByAgent"].as_u64())
        .unwrap_or_else(|| panic!("no node 0 2 MiB pool in {value:#}"))
}

/// Injects `fault` into the agent's state directory (a tmpfs) between two reserving admissions,
/// then `clear`s it. What the agent must do: refuse the admission made during the fault with
/// 500 `state-write-failed` naming the file and `errno`, hold nothing for it in memory or on
/// disk (the file stays byte for byte as it was, no temporary file is left), and, once the
/// fault clears, admit and save the next reservation. What is lost: nothing (pod A's reservation,
/// saved before the fault, stays in memory and on disk throughout, also when A asks again
/// during the fault and its replacing reservation cannot be saved).
fn fault_then_recover(
    size: &str,
    fault: impl FnOnce(&Tmpfs),
    clear: impl FnOnce(&Tmpfs),
    errno: &str,
) {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let state = Tmpfs::mount(&lock, size);
    let file = state.path().join(FILE);
    let mut running = Agent::start(agent(Some(state.path()), &["--reconcile-interval", "1h"]));
    running.wait_for("agent running", Duration::from_secs(20), |_| true);
    let (pod_a, pod_b) = (uid(0xa), uid(0xb));

    let a = admitted(running.port, &pod_a);
    let a_id = a["reservation"]["id"].as_str().expect("id").to_owned();
    let before = fs::read(&file).expect("A's reservation is on disk");

    fault(&state);
    let (status, body) = http(
        running.port,
        "POST",
        "/v1/admit",
        Some("application/json"),
        &reserving(&pod_b),
    );
    assert_eq!(status, 500, "{body}");
    let problem: Value = serde_json::from_str(&body).expect("a problem document");
    assert_eq!(problem["type"], "state-write-failed", "{problem:#}");
    let detail = problem["detail"].as_str().expect("detail");
    assert!(
        detail.contains(&file.display().to_string()) && detail.contains(errno),
        "the answer names the file and the error: {detail}"
    );
    // Not half there: not listed, not held, not on disk; the file is the old one, whole.
    assert_eq!(
        listed(running.port),
        BTreeMap::from([(a_id.clone(), pod_a.clone())])
    );
    assert_eq!(held_on_node0(running.port), MI2, "only A's page is held");
    assert_eq!(
        fs::read(&file).expect("the file"),
        before,
        "the file changed"
    );
    let left: Vec<String> = names(state.path())
        .into_iter()
        .filter(|n| n != "filler")
        .collect();
    assert_eq!(left, [FILE], "a temporary file is left");
    let said = logged(
        &mut running,
        "the reservation could not be saved, so the admission failed: ",
    );
    assert!(said.len() == 1 && said[0].contains(errno), "{said:#?}");
    // Pod A asks again during the fault: its new reservation would replace the saved one, the
    // write fails, and A keeps the reservation it had (in memory as on disk).
    let (status, body) = http(
        running.port,
        "POST",
        "/v1/admit",
        Some("application/json"),
        &reserving(&pod_a),
    );
    assert_eq!(status, 500, "{body}");
    assert_eq!(
        listed(running.port),
        BTreeMap::from([(a_id.clone(), pod_a.clone())]),
        "A lost the reservation it had"
    );
    assert_eq!(held_on_node0(running.port), MI2, "A's page is held again");
    assert_eq!(fs::read(&file).expect("the file"), before);

    clear(&state);
    let b = admitted(running.port, &pod_b);
    let b_id = b["reservation"]["id"].as_str().expect("id").to_owned();
    assert_eq!(
        b["checks"][0]["reservedByAgentBytes"].as_u64(),
        Some(MI2),
        "B sees A's page held: {b:#}"
    );
    let both = BTreeMap::from([(a_id, pod_a), (b_id, pod_b)]);
    assert_eq!(listed(running.port), both);
    assert_eq!(by_id(&on_disk(state.path())), both, "B is saved");
    assert_eq!(names(state.path()), [FILE]);
    drop(running);
}

/// Injected: the agent's state directory (a tmpfs) is remounted read-only while the agent
/// runs, between two reserving admissions; then read-write again.
#[test]
fn a_state_dir_turned_read_only_fails_the_reserving_admission_naming_the_file_and_loses_nothing() {
    fault_then_recover(
        "1m",
        |state| state.remount("ro"),
        |state| state.remount("rw"),
        "Read-only file system",
    );
}

/// Injected: the agent's state directory (a 64 KiB tmpfs) is filled to ENOSPC by another file
/// between two reserving admissions; then that file is deleted.
#[test]
fn a_full_state_dir_fails_the_reserving_admission_naming_the_file_and_loses_nothing() {
    fault_then_recover(
        "64k",
        |state| {
            let mut filler = fs::File::create(state.path().join("filler")).expect("filler");
            let block = [0x5a_u8; 4096];
            loop {
                match filler.write(&block) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => panic!("filling the tmpfs: {e}"),
                }
            }
        },
        |state| fs::remove_file(state.path().join("filler")).expect("remove the filler"),
        "No space left on device",
    );
}

/// A request the agent did not answer whole.
#[derive(Debug, PartialEq, Eq)]
enum Unanswered {
    /// No connection: the agent never saw it.
    NotSent,
    /// Sent, and the agent died before its answer was whole: it may have been saved.
    Cut,
}

/// One request that must not panic when the agent dies under it: (status, body).
fn try_http(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, String), Unanswered> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).map_err(|_| Unanswered::NotSent)?;
    answer(&mut stream, method, path, body).ok_or(Unanswered::Cut)
}

fn answer(stream: &mut TcpStream, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let length: usize = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })?;
    (body.len() == length).then(|| (status, body.to_owned()))
}

/// Waits until the agent on `port` is ready, polling every 5 ms.
fn ready(port: u16, within: Duration) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if try_http(port, "GET", "/readyz", "").is_ok_and(|(status, _)| status == 200) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("the agent on port {port} was not ready within {within:?}");
}

/// What one firing thread saw before the kill: the reservation of its last admission answered
/// (its id), and whether a request of its was cut off (it may or may not have been saved).
struct Fired {
    acked: Option<String>,
    admitted: usize,
    cut: bool,
}

/// Admits pod `uid` again and again until the agent dies or `stop` is set.
fn fire(port: u16, uid: &str, stop: &AtomicBool) -> Fired {
    let body = reserving(uid);
    let mut fired = Fired {
        acked: None,
        admitted: 0,
        cut: false,
    };
    while !stop.load(Ordering::Relaxed) {
        match try_http(port, "POST", "/v1/admit", &body) {
            Ok((200, answer)) => {
                let answer: Value = serde_json::from_str(&answer).expect("a whole answer is JSON");
                assert_eq!(answer["allowed"], true, "{answer:#}");
                let id = answer["reservation"]["id"].as_str().expect("reserved");
                fired.acked = Some(id.to_owned());
                fired.admitted += 1;
            }
            Ok((status, answer)) => panic!("HTTP {status}: {answer}"),
            Err(unanswered) => {
                fired.cut = unanswered == Unanswered::Cut;
                break;
            }
        }
    }
    fired
}

/// The time a reservation id was made (its first part: microseconds since the epoch).
fn made_at(id: &str) -> u128 {
    id.split('-')
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("reservation id {id:?}"))
}

/// Agents started, each killed with SIGKILL at a random moment of its reservation writes.
const KILLS: usize = 200;
/// Threads (one pod each) admitting while the agent is killed.
const FIRING: u32 = 4;

/// Injected: `kill -9` of the agent at a random moment (0–40 ms) after it is ready, while four
/// threads admit their pods (each admission reserves and rewrites the file: temporary file,
/// fsync, rename), KILLS times on one state directory. What the agent must do: the file on disk
/// always parses with a valid checksum (the old or the new content, never torn; nothing is ever
/// set aside as corrupt), every reservation answered as admitted before the kill is in it (the
/// answer goes out only after the rename), a temporary file a kill left is removed on start, and
/// the restarted agent lists exactly what the file holds. What is lost: nothing acknowledged.
#[test]
fn kill_9_during_reservation_writes_never_tears_the_file_nor_loses_an_acknowledged_reservation() {
    let lock = host_lock();
    let _pool = HugepagePool::reserve(&lock, 8);
    let state = fresh_state_dir(0);
    let dir = state.path().to_path_buf();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1);
    eprintln!("kill delays seeded with {seed:#x}");
    let mut rng = Rng(seed);
    let pods: Vec<String> = (0..FIRING).map(|t| uid(0x10 + t)).collect();
    // The newest reservation of each pod answered as admitted, over every run so far.
    let mut acked: Vec<Option<String>> = vec![None; pods.len()];
    let (mut admitted, mut cut, mut temporary_left) = (0, 0, 0);
    let started = Instant::now();
    for kill in 0..KILLS {
        let running = Agent::start(agent(Some(&dir), &["--reconcile-interval", "1h"]));
        ready(running.port, Duration::from_secs(20));
        // The restarted agent loaded the file, and a temporary file a kill left is gone.
        let file = on_disk(&dir);
        assert_eq!(listed(running.port), by_id(&file), "run {kill}");
        let names_now = names(&dir);
        assert!(
            names_now.iter().all(|n| n == FILE),
            "run {kill}: only the file (nothing set aside, no temporary file): {names_now:?}"
        );

        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = pods
            .iter()
            .map(|pod| {
                let (pod, stop, port) = (pod.clone(), stop.clone(), running.port);
                std::thread::spawn(move || fire(port, &pod, &stop))
            })
            .collect();
        std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(running.pid() as i32, libc::SIGKILL) };
        drop(running);
        stop.store(true, Ordering::Relaxed);
        let fired: Vec<Fired> = threads
            .into_iter()
            .map(|t| t.join().expect("a firing thread panicked"))
            .collect();

        temporary_left += usize::from(dir.join(TMP).exists());
        let names_now = names(&dir);
        assert!(
            names_now.iter().all(|n| n == FILE || n == TMP),
            "run {kill}: {names_now:?}"
        );
        let file = on_disk(&dir);
        for ((pod, fired), acked) in pods.iter().zip(&fired).zip(acked.iter_mut()) {
            admitted += fired.admitted;
            cut += usize::from(fired.cut);
            if fired.acked.is_some() {
                acked.clone_from(&fired.acked);
            }
            let Some(want) = acked.as_deref() else {
                continue;
            };
            let saved: Vec<&Reservation> = file.iter().filter(|r| &r.pod_uid == pod).collect();
            let [saved] = saved[..] else {
                panic!(
                    "run {kill}: pod {pod} has {} reservations in the file, acknowledged {want}",
                    saved.len()
                );
            };
            // The acknowledged one, or (a request was cut by the kill) a newer one it made.
            assert!(
                saved.id == want || (fired.cut && made_at(&saved.id) >= made_at(want)),
                "run {kill}: pod {pod}'s acknowledged reservation {want} is lost; the file holds {}",
                saved.id
            );
        }
    }
    let took = started.elapsed();
    println!(
        "{KILLS} kills in {took:.1?}: {admitted} admissions answered, {cut} sent and cut by the kill, a temporary file left by {temporary_left} kills; nothing torn, nothing acknowledged lost"
    );
    assert!(
        admitted > 0 && temporary_left > 0,
        "no kill fell during a write: {admitted} admissions, {temporary_left} temporary files left"
    );
    drop(lock);
}

/// The Memory Manager view the agent selects with, as `GET /v1/discrepancy` shows it.
fn view(port: u16) -> Value {
    let (status, body) = http(port, "GET", "/v1/discrepancy", None, "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

/// Waits until the view satisfies `pred`; the view.
fn view_until(port: u16, within: Duration, pred: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let v = view(port);
        if pred(&v) {
            return v;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {v:#}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The agent reading `checkpoint` as the kubelet's Memory Manager state, re-reading it on every
/// reconcile (every 50 ms) while it is refused.
fn checkpoint_reader(checkpoint: &Path) -> Agent {
    let mut cmd = agent(None, &["--reconcile-interval", "50ms", "--kubelet-state"]);
    cmd.arg(checkpoint);
    let mut running = Agent::start(cmd);
    running.wait_for("agent running", Duration::from_secs(20), |_| true);
    running
}

/// Puts `content` at `path` at once (written beside it, then renamed), as a whole torn or
/// corrupt file a kubelet could leave: the agent never sees it half-written.
fn install(path: &Path, content: &[u8]) {
    let beside = path.with_extension("new");
    fs::write(&beside, content).expect("write beside");
    fs::rename(&beside, path).expect("rename into place");
}

/// Two valid checkpoints the agent tells apart: node 0's 2 MiB pool with 16 or 10 pages free.
fn checkpoints() -> (Vec<u8>, Vec<u8>) {
    (
        node0_checkpoint(16 * MI2, 16 * MI2),
        node0_checkpoint(16 * MI2, 10 * MI2),
    )
}

fn is_checkpoint(v: &Value, machine_state: &Value) -> bool {
    v["source"] == "checkpoint"
        && v.get("checkpointError").is_none()
        && v["machineState"] == *machine_state
}

fn is_fallback(v: &Value) -> bool {
    v["source"] == "sysfs" && v["checkpointError"].as_str().is_some_and(|e| !e.is_empty())
}

/// How long the in-place writer runs.
const REWRITING: Duration = Duration::from_secs(8);

/// Injected: a writer that rewrites the kubelet's checkpoint in place as a non-atomic writer
/// would (truncate, then the content in four pieces with 0–4 ms between them), alternating two
/// valid states A and B for REWRITING, while the agent re-reads it (on each change, and on
/// every reconcile while it refuses it) and the test reads the agent's view without pause. What
/// the agent must do: every view is exactly A, exactly B, or the state built from sysfs with the
/// reason the file was refused (a prefix of a file, caught as not JSON or by the checksum);
/// never a mixture; and when the writer stops, the view is the file's. What is lost: nothing.
#[test]
fn a_checkpoint_rewritten_in_place_is_read_whole_or_refused_never_mixed() {
    let lock = host_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memory_manager_state");
    let (a, b) = checkpoints();
    install(&path, &a);
    let running = checkpoint_reader(&path);
    let state_a = view_until(running.port, Duration::from_secs(5), |v| {
        v["source"] == "checkpoint"
    })["machineState"]
        .clone();
    install(&path, &b);
    let state_b = view_until(running.port, Duration::from_secs(5), |v| {
        v["source"] == "checkpoint" && v["machineState"] != state_a
    })["machineState"]
        .clone();

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, path, a, b) = (stop.clone(), path.clone(), a.clone(), b.clone());
        std::thread::spawn(move || {
            let mut rng = Rng(0x6b75_6265_6c65_7421);
            let mut rewrites = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let content = if rewrites.is_multiple_of(2) { &a } else { &b };
                let mut file = fs::OpenOptions::new()
                    .write(true)
                    .truncate(true)
                    .open(&path)
                    .expect("open the checkpoint");
                for piece in content.chunks(content.len().div_ceil(4)) {
                    file.write_all(piece).expect("write a piece");
                    std::thread::sleep(Duration::from_micros(rng.below(4_000)));
                }
                rewrites += 1;
            }
            // Left as B or A, whole.
            rewrites
        })
    };
    let (mut seen_a, mut seen_b, mut refused) = (0, 0, 0);
    let mut loads = std::collections::BTreeSet::new();
    let started = Instant::now();
    // At least REWRITING; longer (up to four times) until A, B and a refusal have all been seen:
    // which whole version a load lands on is chance (once, 31 loads in 8 s saw no whole A).
    let seen_all = |a: usize, b: usize, r: usize| a > 0 && b > 0 && r > 0;
    while started.elapsed() < REWRITING
        || (!seen_all(seen_a, seen_b, refused) && started.elapsed() < 4 * REWRITING)
    {
        let v = view(running.port);
        if is_checkpoint(&v, &state_a) {
            seen_a += 1;
        } else if is_checkpoint(&v, &state_b) {
            seen_b += 1;
        } else if is_fallback(&v) {
            refused += 1;
        } else {
            panic!("a view that is neither A, B nor the fallback: {v:#}");
        }
        loads.insert(v["loadedAt"].as_str().unwrap_or_default().to_owned());
    }
    stop.store(true, Ordering::Relaxed);
    let took = started.elapsed();
    let rewrites = writer.join().expect("the writer panicked");
    println!(
        "{rewrites} in-place rewrites in {took:.1?}; the agent loaded the state {} times; views: {seen_a} A, {seen_b} B, {refused} refused",
        loads.len()
    );
    assert!(seen_a > 0 && seen_b > 0, "the agent followed the rewrites");
    assert!(
        refused > 0,
        "the agent never read the file mid-write: the test proved nothing"
    );
    // The writer stopped after a whole write: the agent settles on it.
    let last = if rewrites.is_multiple_of(2) {
        &state_b
    } else {
        &state_a
    };
    view_until(running.port, Duration::from_secs(3), |v| {
        is_checkpoint(v, last)
    });
    drop(running);
    drop(lock);
}

/// Lines of the agent's log that say the checkpoint is refused, and why.
fn refusals(running: &mut Agent) -> Vec<String> {
    logged(running, "the kubelet's checkpoint is refused")
}

/// Waits until the agent has loaded the view at least `times` more times (each reconcile
/// re-reads a refused checkpoint); the last view.
fn reloaded(port: u16, times: usize) -> Value {
    let mut loads = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = view(port);
        loads.insert(v["loadedAt"].as_str().unwrap_or_default().to_owned());
        if loads.len() > times {
            return v;
        }
        assert!(Instant::now() < deadline, "{} loads: {v:#}", loads.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Injected: a torn checkpoint (the first half of a valid one), then one with a flipped byte
/// in its data, then a valid one. What the agent must do: refuse each bad file whole, naming the
/// file and why (not JSON; the checksum), fall back to the state built from sysfs, say so once
/// in the log however often it re-reads the file (here every 50 ms), and use the valid one again
/// as soon as it appears, the error gone. What is lost: nothing (the fallback is the kubelet's
/// own starting state).
#[test]
fn a_torn_checkpoint_is_refused_and_reported_once_then_a_valid_one_is_used_again() {
    let lock = host_lock();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("memory_manager_state");
    let (a, b) = checkpoints();
    install(&path, &a);
    let mut running = checkpoint_reader(&path);
    let state_a = view_until(running.port, Duration::from_secs(5), |v| {
        v["source"] == "checkpoint"
    })["machineState"]
        .clone();
    let shown = path.display().to_string();

    // Torn: the first half.
    install(&path, &a[..a.len() / 2]);
    let v = view_until(running.port, Duration::from_secs(5), is_fallback);
    let why = v["checkpointError"].as_str().expect("why").to_owned();
    assert!(why.starts_with(&format!("{shown}: not JSON: EOF")), "{why}");
    let v = reloaded(running.port, 10);
    assert_eq!(v["checkpointError"], why.as_str(), "{v:#}");
    let said = refusals(&mut running);
    assert_eq!(said.len(), 1, "reported once, read 10 times: {said:#?}");
    assert!(said[0].contains(&why), "{said:#?}");

    // A flipped byte in the state's data: the checksum refuses it.
    let mut flipped = a.clone();
    let data = flipped
        .windows(8)
        .position(|w| w == b"\"data\":\"")
        .expect("the V3 data");
    let at = data
        + flipped[data..]
            .iter()
            .position(u8::is_ascii_digit)
            .expect("a digit in the data");
    flipped[at] = if flipped[at] == b'1' { b'2' } else { b'1' };
    install(&path, &flipped);
    let v = view_until(running.port, Duration::from_secs(5), |v| {
        is_fallback(v) && v["checkpointError"] != why.as_str()
    });
    let why = v["checkpointError"].as_str().expect("why").to_owned();
    assert!(
        why.starts_with(&format!("{shown}: ")) && why.contains("checksum"),
        "{why}"
    );
    reloaded(running.port, 10);
    let said = refusals(&mut running);
    assert_eq!(said.len(), 2, "one more, read 10 times: {said:#?}");
    assert!(said[1].contains(&why), "{said:#?}");

    // Valid again: used, the error gone.
    install(&path, &b);
    let v = view_until(running.port, Duration::from_secs(5), |v| {
        v["source"] == "checkpoint"
    });
    assert!(v.get("checkpointError").is_none(), "{v:#}");
    assert_ne!(v["machineState"], state_a, "B, not A");
    assert_eq!(refusals(&mut running).len(), 2);
    drop(running);
    drop(lock);
}
