use super::*;
use crate::admission::verify::{Check, Mode};

/// Pod UIDs as the API server writes them (RFC 4122 text).
const POD_A: &str = "0000000a-0000-4000-8000-00000000000a";
const POD_B: &str = "0000000b-0000-4000-8000-00000000000b";
const POD_C: &str = "0000000c-0000-4000-8000-00000000000c";
const POD_D: &str = "0000000d-0000-4000-8000-00000000000d";

const MI2: PageSize = PageSize(2 << 20);
const GI: u64 = 1 << 30;

fn check(nodes: &[u32], requested: u64, available: u64) -> Check {
    Check {
        resource: "hugepages-2Mi".to_owned(),
        page_size: MI2,
        numa_nodes: nodes.iter().map(|&n| NumaNode(n)).collect(),
        requested_bytes: requested,
        available_bytes: available,
        free_bytes: available,
        unreserved_bytes: available,
        reserved_by_agent_bytes: 0,
        ok: available >= requested,
        unverified: None,
    }
}

fn verdict(nodes: &[u32], requested: u64, available: u64) -> Verdict {
    let c = check(nodes, requested, available);
    Verdict {
        allowed: c.ok,
        reason: None,
        message: None,
        numa_nodes: c.numa_nodes.clone(),
        mode: Mode::Kep,
        checks: vec![c],
        reservation: None,
    }
}

fn t0() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// Reserves for pod `uid` (batch/job) at `t0()` and writes the file, as an admission does
/// before it answers.
fn saved(store: &mut Store, verdict: &Verdict, uid: &str) -> ReservationRef {
    let (made, _, snapshot) = store.reserve(verdict, uid, "batch", "job", t0());
    snapshot.write().expect("saves");
    made
}

#[test]
fn story_2_a_reservation_reduces_what_the_next_pod_sees() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert_eq!(warning, None);
    // 8 GiB free on nodes 0 and 1; pod B is admitted for 6 GiB and reserves it.
    let b = verdict(&[0, 1], 6 * GI, 8 * GI);
    saved(&mut store, &b, POD_B);
    // Pod C asks 4 GiB: 8 free, 6 reserved for B, 2 left.
    let mut c = verdict(&[0, 1], 4 * GI, 8 * GI);
    apply(&mut c, &store, POD_C, t0());
    assert!(!c.allowed);
    assert_eq!(
        c.message.as_deref(),
        Some("insufficient hugepages-2Mi on NUMA node(s) [0,1]: requested 4Gi, available 2Gi")
    );
    assert_eq!(c.checks[0].reserved_by_agent_bytes, 6 * GI);
    // B itself is not held back by its own reservation.
    let mut again = verdict(&[0, 1], 6 * GI, 8 * GI);
    apply(&mut again, &store, POD_B, t0());
    assert!(again.allowed);
    // A reservation on node 1 only does not touch a request on node 0.
    assert_eq!(
        store.held(MI2, &[NumaNode(0), NumaNode(1)], "x", t0()),
        6 * GI
    );
    let other_dir = tempfile::tempdir().expect("tempdir");
    let (mut other, _) = Store::open(other_dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut other, &verdict(&[1], GI, 8 * GI), POD_D);
    assert_eq!(other.held(MI2, &[NumaNode(0)], "x", t0()), 0);
}

#[test]
fn reservations_survive_a_restart_and_end_when_released() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    let r = saved(&mut store, &verdict(&[0], 2 * GI, 4 * GI), POD_B);
    assert_eq!(r.expires_at, t0() + Duration::from_secs(30));
    let (reopened, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert_eq!(warning, None);
    assert_eq!(
        reopened.list(),
        store.list(),
        "the file holds what memory held"
    );
    let (gone, snapshot) = store
        .release(|r| (r.expires_at <= t0() + Duration::from_secs(31)).then_some(Released::Expired));
    assert_eq!(gone.len(), 1);
    let (reopened, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert_eq!(
        reopened.list().len(),
        1,
        "not in the file before it is written"
    );
    snapshot.expect("a change").write().expect("saves");
    let (reopened, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert!(reopened.list().is_empty());
}

#[test]
fn a_new_admission_of_the_same_pod_replaces_its_reservation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut store, &verdict(&[0], 2 * GI, 4 * GI), POD_B);
    saved(&mut store, &verdict(&[0], GI, 4 * GI), POD_B);
    let list = store.list();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].bytes.get(&MI2), Some(&GI));
}

#[test]
fn a_corrupt_or_foreign_file_is_set_aside_never_half_read() {
    for (content, why) in [
        (
            "{\"version\":1,\"reservations\":[",
            "not a reservations file",
        ),
        (
            "{\"version\":1,\"reservations\":[],\"checksum\":\"0000000000000000\"}",
            "does not match",
        ),
        (
            "{\"version\":9,\"reservations\":[],\"checksum\":\"x\"}",
            "version 9 is not 1",
        ),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(dir.path().join(FILE), content).expect("write");
        let (store, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
        let warning = warning.expect("a warning");
        assert!(warning.contains(why), "{warning}");
        assert!(warning.contains("set aside as"), "{warning}");
        assert!(store.list().is_empty());
        assert!(
            !dir.path().join(FILE).exists(),
            "the corrupt file was moved"
        );
        let aside: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(aside.len(), 1, "kept for a post-mortem");
    }
}

/// Issue #23: an older agent took any pod UID, and wrote it into the file as it came.
#[test]
fn a_stored_reservation_whose_pod_uid_kubernetes_never_assigns_is_refused_on_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    // Written as an older agent wrote them: the store itself never checked.
    let kept = saved(&mut store, &verdict(&[0], GI, 4 * GI), POD_B);
    let huge = "x".repeat(100_000);
    for uid in ["../../etc/passwd", huge.as_str()] {
        saved(&mut store, &verdict(&[1], GI, 4 * GI), uid);
    }
    let (_, _, snapshot) = store.reserve(&verdict(&[1], GI, 4 * GI), POD_C, "Team_A", "job", t0());
    snapshot.write().expect("saves");

    let (store, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    let warning = warning.expect("a warning");
    assert!(warning.contains("3 reservation(s) refused"), "{warning}");
    assert!(
        warning.contains("podUid \"../../etc/passwd\" is not a pod UID"),
        "{warning}"
    );
    assert!(warning.contains("is 100000 bytes long"), "{warning}");
    assert!(
        warning.contains("namespace \"Team_A\" is not a DNS-1123 label"),
        "{warning}"
    );
    assert!(
        warning.len() < 2000,
        "a long UID is not repeated: {warning}"
    );
    let ids: Vec<String> = store.list().into_iter().map(|r| r.id).collect();
    assert_eq!(ids, [kept.id], "the valid reservation is kept");
    // The file was set aside and written again with what was kept.
    let aside = fs::read_dir(dir.path())
        .expect("list")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".refused-"))
        .count();
    assert_eq!(aside, 1, "kept for a post-mortem");
    let (again, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert_eq!(warning, None);
    assert_eq!(again.list().len(), 1);
}

#[test]
fn a_flipped_byte_is_caught_by_the_checksum() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut store, &verdict(&[0], 2 * GI, 4 * GI), POD_B);
    let path = dir.path().join(FILE);
    let text = fs::read_to_string(&path).expect("read");
    fs::write(&path, text.replace("2147483648", "1073741824")).expect("write");
    let (store, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert!(warning.is_some_and(|w| w.contains("checksum")));
    assert!(store.list().is_empty());
}

#[test]
fn an_expired_reservation_holds_nothing_before_it_is_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut store, &verdict(&[0], 2 * GI, 4 * GI), POD_B);
    let nodes = [NumaNode(0)];
    assert_eq!(
        store.held(MI2, &nodes, "x", t0() + Duration::from_secs(29)),
        2 * GI
    );
    assert_eq!(
        store.held(MI2, &nodes, "x", t0() + Duration::from_secs(30)),
        0
    );
    assert_eq!(
        store.list().len(),
        1,
        "still listed until the run loop removes it"
    );
}

#[test]
fn a_snapshot_older_than_the_file_is_not_written_over_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    // Two admissions reserve; the second one's write happens first.
    let (_, _, first) = store.reserve(&verdict(&[0], 2 * GI, 8 * GI), POD_A, "", "", t0());
    let (_, _, second) = store.reserve(&verdict(&[0], GI, 8 * GI), POD_B, "", "", t0());
    second.write().expect("saves");
    first.write().expect("skipped, not an error");
    let (reopened, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert_eq!(
        reopened.list(),
        store.list(),
        "both, from the newer snapshot"
    );
    assert_eq!(reopened.list().len(), 2);
}

#[test]
fn a_reservation_that_could_not_be_written_is_taken_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    let (made, replaced, snapshot) =
        store.reserve(&verdict(&[0], 2 * GI, 8 * GI), POD_A, "", "", t0());
    // The state directory is gone: the write fails and names the file.
    fs::remove_dir_all(dir.path()).expect("remove");
    let err = snapshot.write().expect_err("no directory");
    assert!(err.to_string().contains("reservations.json.tmp"), "{err}");
    assert!(store.take_back(&made.id, replaced).is_some());
    assert!(store.list().is_empty());
    assert_eq!(store.held(MI2, &[NumaNode(0)], "x", t0()), 0);
    assert!(
        store.take_back(&made.id, Vec::new()).is_none(),
        "already taken back"
    );
}

#[test]
fn a_write_that_fails_leaves_the_file_as_it_was_and_no_temporary_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut store, &verdict(&[0], GI, 8 * GI), POD_A);
    let file = dir.path().join(FILE);
    let before = fs::read(&file).expect("written");
    // The rename fails (a directory is in the file's place, as the file is left by a failing
    // disk): the temporary file written and fsynced is removed, not left to fill the directory.
    fs::rename(&file, dir.path().join("aside")).expect("move the file");
    fs::create_dir(&file).expect("a directory in its place");
    fs::write(file.join("keep"), "x").expect("not empty");
    let (_, _, snapshot) = store.reserve(&verdict(&[0], GI, 8 * GI), POD_B, "", "", t0());
    let err = snapshot.write().expect_err("cannot replace a directory");
    assert!(err.to_string().contains("reservations.json"), "{err}");
    assert!(!temporary(&file).exists(), "the temporary file is left");
    assert_eq!(fs::read(dir.path().join("aside")).expect("aside"), before);
}

#[test]
fn a_temporary_file_a_killed_write_left_is_removed_on_open_and_never_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut store, &verdict(&[0], GI, 8 * GI), POD_A);
    let tmp = temporary(&dir.path().join(FILE));
    let text = fs::read(dir.path().join(FILE)).expect("written");
    fs::write(&tmp, &text[..text.len() / 2]).expect("half a write");
    let (reopened, warning) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    assert_eq!(warning, None, "the temporary file is not the file");
    assert_eq!(reopened.list(), store.list());
    assert!(!tmp.exists(), "{} is left", tmp.display());
}

/// A pod admitted again while the state directory cannot be written (read-only, full): the
/// failed admission takes its new reservation back and the pod keeps the one it had, as the
/// file does.
#[test]
fn a_replacing_reservation_that_could_not_be_written_gives_the_pod_its_earlier_one_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    let earlier = saved(&mut store, &verdict(&[0], GI, 8 * GI), POD_A);
    let (made, replaced, _) = store.reserve(&verdict(&[1], 2 * GI, 8 * GI), POD_A, "", "", t0());
    assert_eq!(
        replaced.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [earlier.id.as_str()]
    );
    assert_eq!(store.held(MI2, &[NumaNode(0)], "x", t0()), 0, "replaced");
    let snapshot = store.take_back(&made.id, replaced).expect("was there");
    snapshot.write().expect("saves");
    let kept: Vec<String> = store.list().into_iter().map(|r| r.id).collect();
    assert_eq!(kept, std::slice::from_ref(&earlier.id));
    assert_eq!(store.held(MI2, &[NumaNode(0)], "x", t0()), GI);
    let (reopened, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("reopens");
    assert_eq!(reopened.list(), store.list());
}

/// A later admission of the same pod replaced the reservation before its write failed: taking
/// it back changes nothing, and the earlier one stays replaced.
#[test]
fn taking_back_a_reservation_already_replaced_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    let (first, _, _) = store.reserve(&verdict(&[0], GI, 8 * GI), POD_A, "", "", t0());
    let (second, replaced, _) = store.reserve(&verdict(&[0], 2 * GI, 8 * GI), POD_A, "", "", t0());
    assert_eq!(replaced.len(), 1);
    let (third, _, _) = store.reserve(&verdict(&[0], GI, 8 * GI), POD_A, "", "", t0());
    assert!(store.take_back(&second.id, replaced).is_none());
    let kept: Vec<String> = store.list().into_iter().map(|r| r.id).collect();
    assert_eq!(kept, std::slice::from_ref(&third.id));
    assert_ne!(first.id, third.id);
}

#[test]
fn a_uid_reserved_under_one_name_is_held_against_any_other_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    saved(&mut store, &verdict(&[0], 2 * GI, 8 * GI), POD_A);
    assert_eq!(store.other_owner(POD_A, "batch", "job"), None);
    assert_eq!(store.other_owner(POD_B, "other", "thief"), None);
    let held = store
        .other_owner(POD_A, "other", "job")
        .expect("another namespace");
    assert_eq!(
        (held.namespace.as_str(), held.name.as_str()),
        ("batch", "job")
    );
    assert!(store.other_owner(POD_A, "batch", "thief").is_some());
}

#[test]
fn a_namespace_is_held_to_its_limit_with_its_pod_s_own_reservation_replaced() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (store, _) = Store::open(dir.path(), Duration::from_secs(30)).expect("opens");
    let mut store = store.limit_namespaces(NamespaceLimit::Bytes(3 * GI));
    saved(&mut store, &verdict(&[0], 2 * GI, 8 * GI), POD_A);
    let pool = |_| 8 * GI;
    let two = verdict(&[1], 2 * GI, 8 * GI);
    let why = store
        .over_namespace_limit(&two, "batch", POD_B, pool, t0())
        .expect("past 3 GiB");
    assert_eq!(
        why,
        format!(
            "namespace batch would hold {} bytes of hugepages-2Mi reserved on this node, over its --namespace-reservation-limit of {} (2147483648 reserved for its other pods, 2147483648 requested)",
            4 * GI,
            3 * GI
        )
    );
    // The pod itself again: its reservation is replaced, not added to.
    let three = verdict(&[0], 3 * GI, 8 * GI);
    assert_eq!(
        store.over_namespace_limit(&three, "batch", POD_A, pool, t0()),
        None
    );
    // Another namespace; or after the reservation expired.
    assert_eq!(
        store.over_namespace_limit(&two, "other", POD_B, pool, t0()),
        None
    );
    let later = t0() + Duration::from_secs(31);
    assert_eq!(
        store.over_namespace_limit(&two, "batch", POD_B, pool, later),
        None
    );
    // A percentage of the node's pool of the size.
    let store = store.limit_namespaces(NamespaceLimit::Percent(50));
    assert!(
        store
            .over_namespace_limit(&two, "batch", POD_B, pool, t0())
            .is_none()
    );
    assert!(
        store
            .over_namespace_limit(&two, "batch", POD_B, |_| 6 * GI, t0())
            .is_some()
    );
    assert_eq!(NamespaceLimit::Percent(100).of(u64::MAX), u64::MAX);
}
