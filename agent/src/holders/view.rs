//! `hugepage-agent holders`: the holders of the hugepages ([`super::walk`]) as tables for the
//! shell, or as JSON: this host's, walked now, or with `--from URL` a running agent's
//! (`GET /v1/consumers`). It reads; it never deletes, detaches or writes anything (it maps a
//! file only private and read-only, to ask where its pages are).

use std::fmt::Write as _;

use super::{Holder, Holders, InCgroup, Kind, NodesFrom, book::Seen};
use crate::{
    client::{self, AgentUrl, ClientError},
    quantity::format_binary,
    sysfs::{HostFs, SysfsError, hugepages},
};

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error(transparent)]
    Sysfs(#[from] SysfsError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Walks this host (or asks the agent at `from`) and prints the holders to stdout.
pub fn print(host: &HostFs, from: Option<&AgentUrl>, json: bool) -> Result<(), ViewError> {
    let held = match from {
        None => super::walk(host, &hugepages::read_table(host)?),
        Some(url) => client::get_json(url, "/v1/consumers")?,
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&held)
                .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        );
    } else {
        print!("{}", render_text(&held));
    }
    Ok(())
}

/// The holders, largest first, then the accounts per page size, then what was not read.
pub fn render_text(held: &Holders) -> String {
    let mut out = String::new();
    let row = |out: &mut String, cells: [&str; 7]| {
        let [kind, size, bytes, nodes, nothing, what, users] = cells;
        let _ = writeln!(
            out,
            "{kind:<14} {size:<5} {bytes:>7} {nodes:<16} {nothing:<12} {what:<40} {users}"
        );
        out.truncate(out.trim_end().len());
        out.push('\n');
    };
    if held.holders.is_empty() {
        out.push_str("no hugetlbfs file, SysV segment or memfd holds hugepages\n");
    } else {
        row(
            &mut out,
            [
                "HOLDER",
                "SIZE",
                "HELD",
                "NODES",
                "NOTHING RUNS",
                "WHAT",
                "USED BY",
            ],
        );
        for h in &held.holders {
            let cells = cells(h);
            row(&mut out, cells.each().map(String::as_str));
        }
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<5} {:>7} {:>7} {:>11} {:>7} {:>8} {:>7} {:>12} {:>11}",
        "SIZE",
        "IN USE",
        "PRIVATE",
        "SHARED ANON",
        "FILES",
        "SEGMENTS",
        "MEMFDS",
        "NOTHING RUNS",
        "UNEXPLAINED"
    );
    for a in &held.accounts {
        let _ = writeln!(
            out,
            "{:<5} {:>7} {:>7} {:>11} {:>7} {:>8} {:>7} {:>12} {:>11}",
            format_binary(a.page_size_bytes),
            format_binary(a.in_use_bytes),
            format_binary(a.private_bytes),
            format_binary(a.shared_anonymous_bytes),
            format_binary(a.files_bytes),
            format_binary(a.segments_bytes),
            format_binary(a.memfds_bytes),
            format_binary(a.held_by_nothing_that_runs_bytes),
            format_binary(a.unexplained_bytes)
        );
    }
    for u in &held.unread {
        let _ = writeln!(out, "\nnot read: {}: {}", u.what, u.error);
    }
    out
}

/// One holder's cells.
struct Cells([String; 7]);

impl Cells {
    fn each(&self) -> [&String; 7] {
        self.0.each_ref()
    }
}

fn cells(h: &Holder) -> Cells {
    let kind = match h.kind {
        Kind::HugetlbfsFile => "hugetlbfs-file",
        Kind::SysvSegment => "sysv-segment",
        Kind::Memfd => "memfd",
        Kind::Unexplained => "unexplained",
    };
    let nodes = match h.nodes_from {
        NodesFrom::Unknown => "unknown".to_owned(),
        from => {
            let placed: Vec<String> = h
                .per_node
                .iter()
                .map(|(n, b)| format!("{}:{}", n.0, format_binary(*b)))
                .collect();
            let more = if from == NodesFrom::SomeMappings {
                "+?"
            } else {
                ""
            };
            format!("{}{more}", placed.join(","))
        }
    };
    let nothing = match (h.kind, h.held_by_nothing_that_runs) {
        (Kind::Unexplained, _) => "",
        (_, true) => "yes",
        (_, false) => "no",
    };
    let what = match (h.kind, &h.path, h.shmid) {
        (Kind::Unexplained, ..) if h.candidate_shmids.is_empty() => String::new(),
        (Kind::Unexplained, ..) => format!("perhaps shmid {:?}", h.candidate_shmids),
        (_, Some(path), _) => {
            let volume = h.pod_volume.as_ref().map_or(String::new(), |v| {
                format!(" (pod {} volume {})", v.pod_uid, v.volume)
            });
            let deleted = if h.deleted { " (deleted)" } else { "" };
            format!("{path}{deleted}{volume}")
        }
        (_, None, Some(id)) => {
            let pid = |p: Option<super::NamedPid>| {
                p.map_or("-".to_owned(), |p| {
                    format!("{}{}", p.pid, if p.running { "" } else { " gone" })
                })
            };
            format!(
                "shmid {id} key {} attached {} creator {} last {}",
                h.key.as_deref().unwrap_or("-"),
                h.attached.unwrap_or(0),
                pid(h.creator),
                pid(h.last_attach)
            )
        }
        _ => String::new(),
    };
    let users: Vec<String> = h
        .users
        .iter()
        .map(|u| {
            let pod = pod_suffix(&u.cgroup);
            let how = match (u.maps, u.open_fds.is_empty()) {
                (true, true) => "maps".to_owned(),
                (true, false) => format!("maps, fd {:?}", u.open_fds),
                (false, _) => format!("fd {:?}", u.open_fds),
            };
            format!("{} {} ({how}){pod}", u.pid, u.command)
        })
        .collect();
    let users = match (users.is_empty(), &h.probes) {
        (true, Some(seen)) => was(seen),
        _ => users.join("; "),
    };
    Cells([
        kind.to_owned(),
        format_binary(h.page_size_bytes),
        format_binary(h.held_bytes),
        nodes,
        nothing.to_owned(),
        what,
        users,
    ])
}

/// ` pod <uid>` for a pod's cgroup, else nothing.
fn pod_suffix(c: &InCgroup) -> String {
    c.pod_uid
        .as_ref()
        .map_or(String::new(), |p| format!(" pod {p}"))
}

/// Who the probes saw make or fault a holder nothing uses now: `was made by 7291 fallocate
/// (gone)`, or `was faulted by …`.
fn was(seen: &Seen) -> String {
    let (verb, w) = match (&seen.made_by, &seen.last_fault_by) {
        (Some(w), _) => ("made", w),
        (None, Some(w)) => ("faulted", w),
        (None, None) => return String::new(),
    };
    let pod = pod_suffix(&w.cgroup);
    let state = if w.running { "runs" } else { "gone" };
    format!("was {verb} by {} {} ({state}){pod}", w.pid, w.command)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        holders::{Account, NamedPid, User, book::Witness},
        host::NumaNode,
    };

    fn held() -> Holders {
        let mut file = Holder::new(Kind::HugetlbfsFile, 2 << 20, 8 << 20);
        file.path = Some("/dev/hugepages/rtemap_0".into());
        file.held_by_nothing_that_runs = true;
        file.probes = Some(Seen {
            made_by: Some(Witness {
                pid: 7291,
                command: "testpmd".into(),
                running: false,
                cgroup_id: 4242,
                cgroup: InCgroup {
                    pod_uid: Some("p-2".into()),
                    ..InCgroup::default()
                },
                at: "2026-11-28T02:24:46.557Z".into(),
            }),
            first_fault_by: None,
            last_fault_by: None,
            faults: 4,
            fallocated_bytes: 0,
        });
        let mut segment = Holder::new(Kind::SysvSegment, 2 << 20, 2 << 20);
        segment.shmid = Some(4);
        segment.key = Some("0x00001234".into());
        segment.attached = Some(1);
        segment.creator = Some(NamedPid {
            pid: 4242,
            running: false,
        });
        segment.nodes_from = NodesFrom::Mappings;
        segment.per_node = BTreeMap::from([(NumaNode(1), 2 << 20)]);
        segment.users = vec![User {
            pid: 4250,
            command: "dpdk-app".into(),
            maps: true,
            open_fds: Vec::new(),
            cgroup: InCgroup {
                pod_uid: Some("p-1".into()),
                ..InCgroup::default()
            },
        }];
        Holders {
            holders: vec![file, segment],
            accounts: vec![Account {
                page_size_bytes: 2 << 20,
                in_use_bytes: 10 << 20,
                files_bytes: 8 << 20,
                segments_bytes: 2 << 20,
                held_by_nothing_that_runs_bytes: 8 << 20,
                ..Account::default()
            }],
            unread: Vec::new(),
        }
    }

    #[test]
    fn each_holder_is_a_row_with_what_it_is_and_who_uses_it() {
        let text = render_text(&held());
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("HOLDER"), "{text}");
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            words(lines[1]),
            [
                "hugetlbfs-file",
                "2Mi",
                "8Mi",
                "unknown",
                "yes",
                "/dev/hugepages/rtemap_0",
                "was",
                "made",
                "by",
                "7291",
                "testpmd",
                "(gone)",
                "pod",
                "p-2"
            ]
        );
        assert!(
            lines[2].contains("shmid 4 key 0x00001234 attached 1 creator 4242 gone last -"),
            "{text}"
        );
        assert!(lines[2].contains(" 1:2Mi "), "{text}");
        assert!(lines[2].ends_with("4250 dpdk-app (maps) pod p-1"), "{text}");
        assert_eq!(
            words(lines[5]),
            ["2Mi", "10Mi", "0", "0", "8Mi", "2Mi", "0", "8Mi", "0"]
        );
    }

    #[test]
    fn the_json_is_the_api_s_and_reads_back() {
        let json = serde_json::to_string(&held()).expect("json");
        let back: Holders = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back, held());
    }
}
