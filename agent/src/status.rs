//! `hugepage-agent status`: the hugepage pools per NUMA node and system-wide, as a table or as
//! JSON: this host's, read from sysfs, or with `--from URL` a running agent's map
//! (`GET /v1/hugepages`), with the map's source, generation and time.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::{
    client::{self, AgentUrl, ClientError},
    host::{GlobalPool, HugepageTable},
    numa::map::{NodeView, node_pools},
    quantity,
    sysfs::{HostFs, SysfsError, hugepages},
};

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Reads this host's pools (or, with `from`, a running agent's map) and prints them to stdout.
pub fn print(host: &HostFs, from: Option<&AgentUrl>, json: bool) -> Result<(), StatusError> {
    let (table, remote) = match from {
        None => (hugepages::read_table(host)?, None),
        Some(url) => {
            let map: RemoteMap = client::get_json(url, "/v1/hugepages")?;
            (map.table(), Some((url, map.about)))
        }
    };
    if json {
        let about = remote.as_ref().map(|(_, about)| about);
        println!("{}", render_json(&table, about));
    } else {
        if let Some((url, about)) = &remote {
            println!(
                "{}: source {}, generation {}, updated {}\n",
                url.join(""),
                about.source,
                about.generation,
                about.updated_at
            );
        }
        print!("{}", render_text(&table));
    }
    Ok(())
}

/// Where a remote map comes from and how fresh it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct About {
    pub source: String,
    pub generation: u64,
    pub updated_at: String,
}

/// `GET /v1/hugepages`, as much of it as the table needs.
#[derive(Debug, Deserialize)]
struct RemoteMap {
    #[serde(flatten)]
    about: About,
    nodes: Vec<NodeView>,
    global: Vec<GlobalPool>,
}

impl RemoteMap {
    fn table(&self) -> HugepageTable {
        HugepageTable {
            nodes: node_pools(&self.nodes),
            global: self.global.clone(),
        }
    }
}

/// The table as JSON (`{"nodes":[…],"global":[…]}`), plus where it came from for a remote map.
pub fn render_json(table: &HugepageTable, about: Option<&About>) -> String {
    #[derive(Serialize)]
    struct Out<'a> {
        #[serde(flatten)]
        table: &'a HugepageTable,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        about: Option<&'a About>,
    }
    serde_json::to_string_pretty(&Out { table, about })
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
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
    use crate::host::{GlobalPool, NodePool, NumaNode, PageSize};

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
        let value: serde_json::Value =
            serde_json::from_str(&render_json(&table(), None)).expect("json");
        assert_eq!(value["nodes"][0]["pageSizeBytes"], 2097152);
        assert_eq!(value["nodes"][1]["node"], 1);
        assert_eq!(value["global"][0]["reserved"], 4);
        assert!(value.get("source").is_none(), "{value}");
    }

    #[test]
    fn a_remote_map_becomes_the_same_table_with_its_source() {
        let map: RemoteMap = serde_json::from_value(serde_json::json!({
            "generation": 7, "updatedAt": "2026-11-22T10:00:00.000000Z", "source": "ebpf+sysfs",
            "nodes": [
                {"node": 0, "cpus": [0], "distances": [10, 21], "sizes": [
                    {"pageSizeBytes": 2097152, "total": 16, "free": 12, "surplus": 0}]},
                {"node": 1, "cpus": [], "distances": [21, 10], "sizes": [
                    {"pageSizeBytes": 1073741824, "total": 2, "free": 1, "surplus": 0}]}
            ],
            "global": [{"pageSizeBytes": 2097152, "total": 16, "free": 12, "reserved": 4, "surplus": 0}]
        }))
        .expect("the API's shape");
        assert_eq!(map.table(), table());
        let value: serde_json::Value =
            serde_json::from_str(&render_json(&map.table(), Some(&map.about))).expect("json");
        assert_eq!(
            (&value["source"], &value["generation"]),
            (&serde_json::json!("ebpf+sysfs"), &serde_json::json!(7))
        );
    }

    #[test]
    fn a_host_without_numa_directories_says_so() {
        let mut t = table();
        t.nodes.clear();
        assert!(render_text(&t).starts_with("per NUMA node: none"));
    }
}
