//! Values read from sysfs and `/proc` (`sysfs/`): CPU and node lists (`0-3,8`), hugetlb
//! `numa_stat` lines, meminfo's `MemTotal`, and `hugepages-<N>kB` directory names. Each parser's
//! result printed in the kernel's format parses back to the same value. The first byte picks the
//! parser.
#![no_main]

use hugepage_agent::{
    host::PageSize,
    sysfs::{hugetlb_cgroup::parse_numa_stat, meminfo::parse_mem_total, topology::parse_list},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    match first % 4 {
        0 => {
            if let Some(list) = parse_list(text) {
                let printed: Vec<String> = list.iter().map(u32::to_string).collect();
                assert_eq!(parse_list(&printed.join(",")), Some(list));
            }
        }
        1 => {
            if let Some(stat) = parse_numa_stat(text) {
                let mut printed = format!(
                    "total={}",
                    stat.values().fold(0u64, |a, b| a.wrapping_add(*b))
                );
                for (node, bytes) in &stat {
                    printed += &format!(" N{}={bytes}", node.0);
                }
                assert_eq!(parse_numa_stat(&printed), Some(stat), "{printed}");
            }
        }
        2 => {
            if let Some(bytes) = parse_mem_total(text) {
                assert_eq!(bytes % 1024, 0);
                let printed = format!("Node 0 MemTotal: {} kB\n", bytes / 1024);
                assert_eq!(parse_mem_total(&printed), Some(bytes));
            }
        }
        _ => {
            if let Some(size) = PageSize::from_dir_name(text) {
                assert!(size.0 > 0 && size.0 % 1024 == 0, "{size:?}");
                let printed = format!("hugepages-{}kB", size.0 / 1024);
                assert_eq!(PageSize::from_dir_name(&printed), Some(size));
            }
        }
    }
});
