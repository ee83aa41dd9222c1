//! The OpenAPI document and the server agree: schemathesis (PyPI, installed by `cargo xtask
//! setup`) generates requests from the live agent's `/openapi.json`, valid and invalid by the
//! document, in every phase, and checks each answer against it.
//!
//! Issue #23: schemathesis found the two disagreeing: `{"spec": null}` valid by the document
//! yet refused as an unknown field, `"topologyPolicy": null` forbidden by the document yet
//! accepted, `"numaNodes": []` accepted by `POST /v1/hints` and refused by `POST /v1/admit`.
//! Clients generate code from the document, so any such difference fails this test, with
//! schemathesis's report.
//!
//! The checks: no 5xx (`not_a_server_error`), status codes, content types and bodies as
//! documented, a body valid by the document accepted (`positive_data_acceptance`) and an
//! invalid one refused (`negative_data_rejection`). The one rule JSON Schema cannot state
//! (container names unique within a pod) is kept out of the generated bodies by
//! `schemathesis_hooks.py`, and so is `watch=true` (a stream of minutes, not a document: the
//! watch's own tests read it); no failure is ever dropped. The agent runs with `--ebpf off` over a
//! built two-node host tree, with a fresh state directory: nothing on the host changes.
//!
//! `HUGEPAGE_AGENT_CONTRACT_EXAMPLES` (default 200 per operation) and
//! `HUGEPAGE_AGENT_CONTRACT_SEED` (default 23) change the run: a larger or another one explores
//! further (the defaults keep it under a minute on two cores).

use std::{path::Path, process::Command, time::Duration, time::Instant};

use hugepage_agent_tests::{
    Agent, agent_bin, peers, put, quiet_pressure, two_numa_nodes, wait_ready,
};

/// Checks that fail the run on any finding.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,positive_data_acceptance,negative_data_rejection";

/// Two NUMA nodes of 2048 2 MiB pages, 1024 free each; quiet pressure files; a cgroup v2 root.
fn build(root: &Path) {
    two_numa_nodes(root, 16 << 20, 2048, 1024);
    quiet_pressure(root);
    for file in ["cgroup.controllers", "cgroup.subtree_control"] {
        put(
            root,
            &format!("/sys/fs/cgroup/{file}"),
            "cpu io memory hugetlb\n",
        );
    }
}

fn setting(var: &str, default: u64) -> u64 {
    std::env::var(var).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|e| panic!("{var}={v:?} is not a number: {e}"))
    })
}

#[test]
fn the_openapi_document_and_the_server_agree_as_schemathesis_checks_them() {
    let schemathesis = peers::schemathesis();
    let examples = setting("HUGEPAGE_AGENT_CONTRACT_EXAMPLES", 200);
    let seed = setting("HUGEPAGE_AGENT_CONTRACT_SEED", 23);
    let tree = tempfile::tempdir().expect("a temporary host tree");
    build(tree.path());
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree.path())
        .args(["--ebpf", "off"])
        // A watch is a stream: ended after a second or two, so that the few schemathesis sends
        // (its coverage phase; the hook keeps them out of the generated cases) are answered whole.
        .args(["--watch-max-duration", "1s", "--watch-heartbeat", "200ms"]);
    // SAFETY: geteuid has no preconditions.
    let agent = Agent::start_as(cmd, unsafe { libc::geteuid() });
    wait_ready(agent.port, Duration::from_secs(20)).expect("the agent is ready");

    let report = tempfile::tempdir().expect("a report directory");
    let started = Instant::now();
    let out = Command::new(&schemathesis)
        .arg("run")
        .arg(format!("http://127.0.0.1:{}/openapi.json", agent.port))
        .args(["--checks", CHECKS])
        .args(["--max-examples", &examples.to_string()])
        .args(["--seed", &seed.to_string()])
        .args(["--generation-database", "none", "--no-color"])
        .args(["--continue-on-failure", "--request-timeout", "10"])
        .arg("--report-dir")
        .arg(report.path())
        .env(
            "SCHEMATHESIS_HOOKS",
            peers::workspace().join("tests/schemathesis_hooks.py"),
        )
        .current_dir(report.path())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", schemathesis.display()));
    let took = started.elapsed();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    println!("schemathesis took {took:.1?} ({examples} examples per operation, seed {seed})");
    assert!(
        out.status.success(),
        "schemathesis found the document and the server disagreeing ({:?}):\n{text}",
        out.status
    );
    // A run that tested nothing would pass too: every operation was tested, thousands of cases.
    let after = |label: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {label:?} in the report:\n{text}"))
    };
    let selected = after("Selected:");
    let tested = after("Tested:");
    assert_eq!(
        selected,
        format!("{tested}/{tested}"),
        "every operation is tested:\n{text}"
    );
    let generated: u64 = text
        .lines()
        .find_map(|l| l.trim().split_once(" generated, "))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or(0);
    assert!(generated >= 1000, "only {generated} cases:\n{text}");
    let (exit, log) = agent.terminate();
    assert!(exit.success(), "{exit:?}: {log:#?}");
}
