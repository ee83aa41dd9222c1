//! `docs/reference/` holds the whole contract, as the running programs show it: every `--flag`
//! that `hugepage-agent <subcommand> --help` prints is in that subcommand's section of
//! `cli.md`, every metric family a real agent and a real webhook expose on `/metrics` is in
//! `metrics.md` (under the program's own heading), and every path of the agent's
//! `/openapi.json` is in `http-api.md`. (That the files are what the code writes is
//! `cargo xtask docs --check`'s; this checks that what the code writes covers what runs.) The
//! webhook's Node list comes from the stand-in API server, the one peer that cannot run here.

use std::{collections::BTreeSet, process::Command, time::Duration};

use hugepage_agent_tests::{
    Agent, agent_bin,
    apiserver::StandInApiServer,
    cluster::{self, Pki},
    http, numa_nodes, output,
    peers::workspace,
    quiet_pressure,
};
use serde_json::Value;

fn reference(file: &str) -> String {
    std::fs::read_to_string(workspace().join("docs/reference").join(file))
        .unwrap_or_else(|e| panic!("docs/reference/{file}: {e}"))
}

/// The part of `text` from the heading `from` to the next heading of the same level.
fn section<'a>(text: &'a str, from: &str) -> &'a str {
    let start = text
        .find(&format!("\n{from}\n"))
        .unwrap_or_else(|| panic!("no heading {from:?}"));
    let level = from.split(' ').next().unwrap_or("##");
    let body = &text[start + from.len() + 2..];
    let end = body
        .find(&format!("\n{level} "))
        .map_or(body.len(), |at| at + 1);
    &body[..end]
}

/// The metric families an exposition declares.
fn families(exposition: &str) -> BTreeSet<String> {
    exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_flag_of_every_subcommands_help_is_in_the_cli_reference() {
    let cli = reference("cli.md");
    for sub in ["run", "status", "check", "hints", "merge", "webhook"] {
        let mut cmd = Command::new(agent_bin());
        cmd.args([sub, "--help"]);
        let (status, help, err) = output(cmd);
        assert!(status.success(), "{sub} --help: {err}");
        // A flag's own line starts with it (after `-x, `); flags named in another's help are
        // that other's words.
        let flags: BTreeSet<&str> = help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| {
                l.split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '[')
                    .find(|w| w.starts_with("--") && w.len() > 2)
            })
            .filter(|w| *w != "--help" && *w != "--version")
            .collect();
        assert!(!flags.is_empty(), "{sub}: no flags in\n{help}");
        let part = section(&cli, &format!("## hugepage-agent {sub}"));
        for flag in flags {
            assert!(
                part.contains(&format!("`{flag}")),
                "{sub} --help shows {flag}, docs/reference/cli.md's section does not"
            );
        }
    }
}

#[test]
fn every_family_a_running_agent_exposes_and_every_api_path_is_in_the_reference() {
    let tree = tempfile::tempdir().expect("a host tree");
    numa_nodes(tree.path(), 2, 16 << 20, 64, 64);
    quiet_pressure(tree.path());
    let mut cmd = Command::new(agent_bin());
    cmd.arg("run")
        .arg("--host-root")
        .arg(tree.path())
        .args(["--ebpf", "off"]);
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    let (status, exposition) = http(agent.port, "GET", "/metrics", None, "");
    assert_eq!(status, 200);
    let metrics = reference("metrics.md");
    let agent_part = section(&metrics, "## The agent's metrics");
    let found = families(&exposition);
    assert!(found.len() > 20, "{found:?}");
    for family in &found {
        assert!(
            agent_part.contains(&format!("`{family}`")),
            "the agent exposes {family}; docs/reference/metrics.md does not list it"
        );
    }
    let (status, document) = http(agent.port, "GET", "/openapi.json", None, "");
    assert_eq!(status, 200);
    let document: Value = serde_json::from_str(&document).expect("JSON");
    let api = reference("http-api.md");
    let paths = document["paths"].as_object().expect("paths");
    for (path, item) in paths {
        for method in item.as_object().expect("methods").keys() {
            let heading = format!("### {} {path}\n", method.to_uppercase());
            assert!(api.contains(&heading), "{heading:?} not in http-api.md");
        }
    }
}

#[test]
fn every_family_a_running_webhook_exposes_is_in_the_reference() {
    let pki = Pki::new();
    let api = StandInApiServer::start();
    let webhook = cluster::webhook(&agent_bin(), &pki, &api, 1, "ignore", "2s", &[]);
    cluster::wait_ready(&pki, &webhook, Duration::from_secs(20));
    let (status, exposition) = cluster::get_text(&pki, &webhook, "/metrics");
    assert_eq!(status, 200);
    let metrics = reference("metrics.md");
    let part = section(&metrics, "## The webhook's metrics");
    let found = families(&exposition);
    assert!(found.len() > 10, "{found:?}");
    for family in &found {
        assert!(
            part.contains(&format!("`{family}`")),
            "the webhook exposes {family}; docs/reference/metrics.md does not list it"
        );
    }
    let http_api = reference("http-api.md");
    let endpoints = section(&http_api, "## The webhook's endpoints");
    for path in [
        "/scheduler/filter",
        "/scheduler/prioritize",
        "/admission/validate",
        "/metrics",
        "/healthz",
        "/readyz",
    ] {
        let (status, _) = cluster::get_text(&pki, &webhook, path);
        assert_ne!(status, 404, "{path} is served");
        assert!(endpoints.contains(&format!("`{path}`")), "{path}");
    }
    let (status, _) = cluster::get_text(&pki, &webhook, "/no/such/path");
    assert_eq!(status, 404, "and nothing else");
}
