//! `hugepage-agent status`: the host's hugepage pools per NUMA node and system-wide, as a table
//! or as JSON.

use std::fmt::Write as _;

use crate::{
    numa::HugepageTable,
    quantity,
    sysfs::{HostFs, SysfsError, hugepages},
};

/// Reads the pools and prints them to stdout.
pub fn print(host: &HostFs, json: bool) -> Result<(), SysfsError> {
    let table = hugepages::read_table(host)?;
    if json {
        println!("{}", render_json(&table));
    } else {
        print!("{}", render_text(&table));
    }
    Ok(())
}

pub fn render_json(table: &HugepageTable) -> String {
    serde_json::to_string_pretty(table).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Two tables: per node (total, free, surplus) and system-wide (with reserved).
pub fn render_text(table: &HugepageTable) -> String {
    let mut out = String::new();
    if table.nodes.is_empty() {
        out.push_str("per NUMA node: none (no /sys/devices/system/node on this host)\n");
    } else {
        let _ = writeln!(
            out,
            "{:<6} {:<6} {:>8} {:>8} {:>8} {:>12}",
            "NODE", "SIZE", "TOTAL", "FREE", "SURPLUS", "FREE BYTES"
        );
        for p in &table.nodes {
            let free_bytes = quantity::format_binary(p.free.saturating_mul(p.size.0));
            let _ = writeln!(
                out,
                "{:<6} {:<6} {:>8} {:>8} {:>8} {:>12}",
                p.node.0,
                p.size.to_string(),
                p.total,
                p.free,
                p.surplus,
                free_bytes
            );
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<6} {:<6} {:>8} {:>8} {:>8} {:>8}",
        "SYSTEM", "SIZE", "TOTAL", "FREE", "RESERVED", "SURPLUS"
    );
    for g in &table.global {
        let _ = writeln!(
            out,
            "{:<6} {:<6} {:>8} {:>8} {:>8} {:>8}",
            "all",
            g.size.to_string(),
            g.total,
            g.free,
            g.reserved,
            g.surplus
        );
    }
    out.push_str("\nFREE still counts RESERVED pages: promised to a mapping, not yet faulted.\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numa::{GlobalPool, NodePool, NumaNode, PageSize};

    fn table() -> HugepageTable {
        HugepageTable {
            nodes: vec![
                NodePool {
                    node: NumaNode(0),
                    size: PageSize(2 << 20),
                    total: 16,
                    free: 12,
                    surplus: 0,
                },
                NodePool {
                    node: NumaNode(1),
                    size: PageSize(1 << 30),
                    total: 2,
                    free: 1,
                    surplus: 0,
                },
            ],
            global: vec![GlobalPool {
                size: PageSize(2 << 20),
                total: 16,
                free: 12,
                reserved: 4,
                surplus: 0,
            }],
        }
    }

    #[test]
    fn text_has_one_row_per_pool_with_free_bytes() {
        let text = render_text(&table());
        let rows: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[0],
            ["NODE", "SIZE", "TOTAL", "FREE", "SURPLUS", "FREE", "BYTES"]
        );
        assert_eq!(rows[1], ["0", "2Mi", "16", "12", "0", "24Mi"]);
        assert_eq!(rows[2], ["1", "1Gi", "2", "1", "0", "1Gi"]);
        assert_eq!(rows[5], ["all", "2Mi", "16", "12", "4", "0"]);
    }

    #[test]
    fn json_uses_the_contract_field_names() {
        let value: serde_json::Value = serde_json::from_str(&render_json(&table())).expect("json");
        assert_eq!(value["nodes"][0]["pageSizeBytes"], 2097152);
        assert_eq!(value["nodes"][1]["node"], 1);
        assert_eq!(value["global"][0]["reserved"], 4);
    }

    #[test]
    fn a_host_without_numa_directories_says_so() {
        let mut t = table();
        t.nodes.clear();
        assert!(render_text(&t).starts_with("per NUMA node: none"));
    }
}
