use super::*;
use crate::sysfs::fake::tree;

fn pool(node: u32, kb: u64, total: u64, free: u64, surplus: u64) -> [(String, String); 3] {
    let d = format!("/sys/devices/system/node/node{node}/hugepages/hugepages-{kb}kB");
    [
        (format!("{d}/nr_hugepages"), format!("{total}\n")),
        (format!("{d}/free_hugepages"), format!("{free}\n")),
        (format!("{d}/surplus_hugepages"), format!("{surplus}\n")),
    ]
}

fn global(kb: u64, total: u64, free: u64, resv: u64) -> [(String, String); 4] {
    let d = format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB");
    [
        (format!("{d}/nr_hugepages"), format!("{total}\n")),
        (format!("{d}/free_hugepages"), format!("{free}\n")),
        (format!("{d}/resv_hugepages"), format!("{resv}\n")),
        (format!("{d}/surplus_hugepages"), "0\n".to_owned()),
    ]
}

fn owned_tree(files: Vec<(String, String)>) -> (tempfile::TempDir, HostFs) {
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    tree(&refs)
}

const MI2: PageSize = PageSize(2 << 20);
const GI1: PageSize = PageSize(1 << 30);

#[test]
fn two_nodes_two_sizes_with_a_size_on_one_node_only() {
    let mut files = Vec::new();
    files.extend(pool(0, 2048, 512, 100, 0));
    files.extend(pool(0, 1048576, 4, 4, 0));
    files.extend(pool(1, 2048, 512, 512, 3));
    files.extend(global(2048, 1024, 612, 7));
    files.extend(global(1048576, 4, 4, 0));
    files.push(("/sys/devices/system/node/online".into(), "0-1\n".into()));
    let (_dir, host) = owned_tree(files);
    let table = read_table(&host).expect("read");
    let rows: Vec<_> = table
        .nodes
        .iter()
        .map(|p| (p.node.0, p.size, p.total, p.free, p.surplus))
        .collect();
    assert_eq!(
        rows,
        vec![
            (0, MI2, 512, 100, 0),
            (0, GI1, 4, 4, 0),
            (1, MI2, 512, 512, 3)
        ]
    );
    assert_eq!(table.global.len(), 2);
    assert_eq!((table.global[0].size, table.global[0].reserved), (MI2, 7));
}

#[test]
fn machine_without_numa_directories_has_global_pools_only() {
    let (_dir, host) = owned_tree(global(2048, 8, 8, 0).to_vec());
    let table = read_table(&host).expect("read");
    assert!(table.nodes.is_empty());
    assert_eq!(table.global[0].total, 8);
}

#[test]
fn node_without_hugepages_directory_has_no_rows() {
    let mut files = pool(0, 2048, 2, 2, 0).to_vec();
    files.push(("/sys/devices/system/node/node1/cpulist".into(), "\n".into()));
    let (_dir, host) = owned_tree(files);
    let table = read_table(&host).expect("read");
    assert_eq!(table.nodes.len(), 1);
    assert_eq!(
        numa_nodes(&host).expect("nodes"),
        vec![NumaNode(0), NumaNode(1)]
    );
}

#[test]
fn missing_counter_file_is_an_error_naming_it() {
    let mut files = pool(0, 2048, 2, 2, 0).to_vec();
    files.retain(|(p, _)| !p.ends_with("free_hugepages"));
    let (_dir, host) = owned_tree(files);
    let err = read_table(&host).unwrap_err().to_string();
    assert!(
        err.contains("node0/hugepages/hugepages-2048kB/free_hugepages"),
        "{err}"
    );
}

#[test]
fn malformed_counter_is_an_error_naming_file_and_content() {
    let mut files = pool(0, 2048, 2, 2, 0).to_vec();
    files[1].1 = "lots\n".into();
    let (_dir, host) = owned_tree(files);
    let err = read_table(&host).unwrap_err().to_string();
    assert!(
        err.contains("free_hugepages: expected an unsigned integer, found \"lots\\n\""),
        "{err}"
    );
}

#[test]
fn odd_size_directory_is_an_error() {
    let (_dir, host) = tree(&[("/sys/kernel/mm/hugepages/hugepages-big/nr_hugepages", "1")]);
    let err = read_table(&host).unwrap_err().to_string();
    assert!(err.contains("hugepages-<kB>kB"), "{err}");
}

#[test]
fn reads_this_host() {
    let table = read_table(&HostFs::new("/")).expect("this host's sysfs");
    assert!(
        table.global.iter().any(|g| g.size == MI2),
        "this kernel offers 2 MiB pages: {table:?}"
    );
}
