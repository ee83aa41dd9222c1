use std::fs;

use super::*;
use crate::sysfs::fake::write;

const MI2: PageSize = PageSize(2 << 20);
const GI1: PageSize = PageSize(1 << 30);

/// Two nodes (node 1 CPU-less), 2 MiB on both, 1 GiB on node 0 only.
fn host() -> (tempfile::TempDir, HostFs) {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = dir.path();
    write(r, "/sys/devices/system/node/online", "0-1\n");
    write(r, "/sys/devices/system/node/node0/cpulist", "0-1\n");
    write(r, "/sys/devices/system/node/node0/distance", "10 20\n");
    write(r, "/sys/devices/system/node/node1/cpulist", "\n");
    write(r, "/sys/devices/system/node/node1/distance", "20 10\n");
    for (node, size, free) in [(0, MI2, 8), (1, MI2, 4), (0, GI1, 1)] {
        let d = format!(
            "/sys/devices/system/node/node{node}/hugepages/{}",
            size.dir_name()
        );
        write(r, &format!("{d}/nr_hugepages"), "8\n");
        write(r, &format!("{d}/free_hugepages"), &format!("{free}\n"));
        write(r, &format!("{d}/surplus_hugepages"), "0\n");
    }
    let host = HostFs::new(r);
    (dir, host)
}

fn set_free(host: &HostFs, node: u32, size: PageSize, free: u64) {
    let path = host.path(format!(
        "/sys/devices/system/node/node{node}/hugepages/{}/free_hugepages",
        size.dir_name()
    ));
    fs::write(path, format!("{free}\n")).expect("write");
}

fn free(s: &Snapshot, node: u32, size: PageSize) -> Option<u64> {
    s.nodes[node as usize]
        .sizes
        .iter()
        .find(|v| v.page_size_bytes == size.0)
        .map(|v| v.free)
}

#[test]
fn the_first_snapshot_has_topology_pools_and_generation_1() {
    let (_d, host) = host();
    let (_writer, reader) = MapWriter::new(host, Source::Sysfs).expect("map");
    let s = reader.load();
    assert_eq!(s.generation, 1);
    assert_eq!(s.nodes.len(), 2);
    assert_eq!(s.nodes[1].info.cpus, Vec::<u32>::new());
    assert_eq!(
        (
            free(&s, 0, MI2),
            free(&s, 1, MI2),
            free(&s, 0, GI1),
            free(&s, 1, GI1)
        ),
        (Some(8), Some(4), Some(1), None)
    );
    let json = serde_json::to_value(&*s).expect("json");
    assert_eq!(json["source"], "sysfs");
    assert_eq!(json["nodes"][0]["distances"], serde_json::json!([10, 20]));
    assert!(json["updatedAt"].as_str().is_some_and(|t| t.ends_with('Z')));
}

#[test]
fn a_prompted_refresh_rereads_only_the_touched_size() {
    let (_d, host) = host();
    let (mut writer, reader) = MapWriter::new(host.clone(), Source::EbpfSysfs).expect("map");
    set_free(&host, 0, MI2, 5);
    set_free(&host, 0, GI1, 0);
    let changes = writer
        .refresh(Some(&BTreeSet::from([MI2])), Some(monotonic_now()))
        .expect("refresh")
        .changes;
    assert_eq!(changes.len(), 1);
    assert_eq!(
        (
            changes[0].before.as_ref().map(|p| p.free),
            changes[0].now.free
        ),
        (Some(8), 5)
    );
    let s = reader.load();
    assert_eq!(
        (free(&s, 0, MI2), free(&s, 0, GI1)),
        (Some(5), Some(1)),
        "1 GiB not re-read"
    );
    assert_eq!(s.generation, 2);
    assert!(s.fault_to_map.is_some_and(|d| d < Duration::from_secs(1)));
    writer.reconcile().expect("reconcile");
    assert_eq!(free(&reader.load(), 0, GI1), Some(0));
}

/// A fault whose page an earlier re-read already saw taken prompts a re-read that changes
/// nothing: the snapshot keeps the earlier change's delay; a change the reconcile finds has none.
#[test]
fn a_reread_that_changes_nothing_keeps_the_delay_of_the_change_a_fault_prompted() {
    let (_d, host) = host();
    let (mut writer, reader) = MapWriter::new(host.clone(), Source::EbpfSysfs).expect("map");
    let sizes = BTreeSet::from([MI2]);
    set_free(&host, 0, MI2, 5);
    let first = writer
        .refresh(Some(&sizes), Some(monotonic_now()))
        .expect("refresh");
    let delay = reader.load().fault_to_map;
    assert!(delay.is_some());
    assert_eq!(first.fault_to_map, delay);
    let later = writer
        .refresh(Some(&sizes), Some(monotonic_now()))
        .expect("refresh");
    assert!(later.changes.is_empty());
    assert_eq!(later.fault_to_map, None, "no delay of its own");
    assert_eq!(reader.load().fault_to_map, delay);
    writer.reconcile().expect("reconcile");
    assert_eq!(reader.load().fault_to_map, delay, "nothing changed");
    set_free(&host, 0, MI2, 4);
    writer.reconcile().expect("reconcile");
    assert_eq!(
        reader.load().fault_to_map,
        None,
        "a change no fault prompted"
    );
}

#[test]
fn readers_keep_their_snapshot_while_the_writer_publishes() {
    let (_d, host) = host();
    let (mut writer, reader) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
    let held = reader.load();
    set_free(&host, 1, MI2, 0);
    writer.reconcile().expect("reconcile");
    assert_eq!(free(&held, 1, MI2), Some(4));
    assert_eq!(free(&reader.load(), 1, MI2), Some(0));
    assert!(reader.load().generation > held.generation);
}

fn pool(s: &Snapshot, node: u32, size: PageSize) -> &SizeView {
    s.nodes[node as usize]
        .sizes
        .iter()
        .find(|v| v.page_size_bytes == size.0)
        .expect("the pool is in the map")
}

const NODE1_2M: &str = "/sys/devices/system/node/node1/hugepages/hugepages-2048kB";

#[test]
fn an_unreadable_pool_keeps_its_last_figures_marked_stale_with_the_file_and_recovers() {
    let (_d, host) = host();
    let (mut writer, reader) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
    let file = host.path(format!("{NODE1_2M}/free_hugepages"));
    fs::remove_file(&file).expect("rm");
    set_free(&host, 0, MI2, 3);
    let before = SystemTime::now();
    let reread = writer.reconcile().expect("the other pools are read");
    let s = reader.load();
    assert_eq!(free(&s, 0, MI2), Some(3), "the readable pools are re-read");
    let stale = pool(&s, 1, MI2);
    assert_eq!(stale.free, 4, "the last good figure stays");
    let mark = stale.stale.as_ref().expect("marked stale");
    assert!(mark.since >= before, "{mark:?}");
    assert!(mark.error.contains(&file.display().to_string()), "{mark:?}");
    assert!(pool(&s, 0, MI2).stale.is_none());
    assert_eq!(reread.unreadable.len(), 1, "reported once: {reread:?}");
    assert_eq!(
        reread.unreadable[0].0,
        PoolKey {
            node: Some(NumaNode(1)),
            size: MI2
        }
    );
    let json = serde_json::to_value(&*s).expect("json");
    assert_eq!(
        json["nodes"][1]["sizes"][0]["stale"]["error"].as_str(),
        Some(mark.error.as_str())
    );
    assert!(json["nodes"][0]["sizes"][0].get("stale").is_none());

    let again = writer.reconcile().expect("reconcile");
    assert!(
        again.unreadable.is_empty(),
        "still stale: not reported again"
    );
    assert_eq!(
        pool(&reader.load(), 1, MI2).stale.as_ref().map(|m| m.since),
        Some(mark.since),
        "the mark keeps when it began"
    );

    fs::write(&file, "1\n").expect("the file is back");
    let back = writer.reconcile().expect("reconcile");
    assert_eq!(back.recovered.len(), 1, "{back:?}");
    let s = reader.load();
    assert_eq!((pool(&s, 1, MI2).free, &pool(&s, 1, MI2).stale), (1, &None));
}

#[test]
fn a_pool_directory_that_goes_while_its_node_stays_is_stale_not_dropped() {
    let (_d, host) = host();
    let (mut writer, reader) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
    fs::remove_dir_all(host.path(NODE1_2M)).expect("rm");
    let reread = writer
        .refresh(Some(&BTreeSet::from([MI2])), None)
        .expect("refresh");
    assert_eq!(reread.unreadable.len(), 1);
    let s = reader.load();
    let kept = pool(&s, 1, MI2);
    assert_eq!(kept.free, 4);
    assert!(
        kept.stale
            .as_ref()
            .is_some_and(|m| m.error.contains("node1/hugepages/hugepages-2048kB")),
        "{kept:?}"
    );
}

#[test]
fn a_failed_topology_read_names_the_file_and_keeps_the_last_snapshot() {
    let (_d, host) = host();
    let (mut writer, reader) = MapWriter::new(host.clone(), Source::Sysfs).expect("map");
    fs::remove_file(host.path("/sys/devices/system/node/node1/distance")).expect("rm");
    let err = writer.reconcile().unwrap_err().to_string();
    assert!(err.contains("node1/distance"), "{err}");
    assert_eq!(reader.load().generation, 1);
}
