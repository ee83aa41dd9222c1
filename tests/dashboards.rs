//! The Grafana dashboard and the Prometheus alert rules in `dashboards/`, checked by their real
//! tools: promtool checks the rules and runs a test case for every alert; the dashboard
//! type-checks against `@grafana/schema` (npm) with TypeScript's compiler, and its variables,
//! data sources and the "why was my pod rejected" guide are where an operator looks for them.

use std::process::Command;

use hugepage_agent_tests::peers::{grafana_schema, promtool, workspace};
use serde_json::Value;

fn dashboard() -> (String, Value) {
    let text = std::fs::read_to_string(workspace().join("dashboards/hugepage-agent.json"))
        .expect("read the dashboard");
    let value = serde_json::from_str(&text).expect("dashboard JSON");
    (text, value)
}

#[test]
fn the_alert_rules_pass_promtool_and_every_alert_has_a_test_case_that_fires_it() {
    let (ok, out) = promtool(&["check", "rules", "alerts.yaml"], "");
    assert!(ok, "{out}");
    let (ok, out) = promtool(&["test", "rules", "alerts.test.yaml"], "");
    assert!(ok && out.contains("SUCCESS"), "{out}");
    let rules = std::fs::read_to_string(workspace().join("dashboards/alerts.yaml")).expect("rules");
    let tests =
        std::fs::read_to_string(workspace().join("dashboards/alerts.test.yaml")).expect("tests");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 16, "{alerts:?}");
    for alert in alerts {
        // A case that expects the alert to fire: its name followed by a non-empty exp_alerts.
        let fires = tests.split("alertname: ").skip(1).any(|case| {
            case.starts_with(alert)
                && case[alert.len()..].starts_with('\n')
                && !case
                    .lines()
                    .nth(1)
                    .is_some_and(|l| l.contains("exp_alerts: []"))
        });
        assert!(fires, "no test case fires {alert}");
    }
}

#[test]
fn the_dashboard_type_checks_against_grafana_schema() {
    let (text, _) = dashboard();
    let schema = grafana_schema();
    let dir = std::env::temp_dir().join(format!("hugepage-agent-schema-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Resolved from the npm prefix: the check file lives beside its node_modules.
    let check = schema.join(format!("check-{}.ts", std::process::id()));
    let source = format!(
        "import type {{ Dashboard }} from '@grafana/schema';\nexport const dashboard: Dashboard = {text};\n"
    );
    std::fs::write(&check, source).expect("write the check");
    let out = Command::new(schema.join("node_modules/.bin/tsc"))
        .args([
            "--noEmit",
            "--strict",
            "--skipLibCheck",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
        ])
        .arg(&check)
        .output()
        .expect("run tsc (cargo xtask setup installs it)");
    let _ = std::fs::remove_file(&check);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "the dashboard does not match @grafana/schema's Dashboard:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn the_dashboard_has_its_variables_every_panel_uses_the_datasource_variable_and_rejections_are_explained()
 {
    let (_, d) = dashboard();
    let variables: Vec<&str> = d["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(variables, ["datasource", "node", "size"]);
    let panels = d["panels"].as_array().expect("panels");
    let mut titles = Vec::new();
    for p in panels {
        titles.push(p["title"].as_str().unwrap_or_default());
        if matches!(p["type"].as_str(), Some("row" | "text")) {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            assert!(
                expr.contains("$node"),
                "{}: {expr} ignores $node",
                p["title"]
            );
        }
    }
    for wanted in [
        "Why was my pod rejected?",
        "Rejections by reason",
        "Admission rate by result",
        "Rejections by NUMA node and size (last hour)",
        "Verification latency p50 / p99",
        "Free / total hugepages per NUMA node and size",
        "Discrepancy: Memory Manager vs kernel",
        "Top pools by pages in use",
        "Reserved by the agent",
        "PSI some avg10",
        "Node conditions",
        "Probes attached",
        "Ring-buffer losses",
        "Cgroup events",
    ] {
        assert!(
            titles.contains(&wanted),
            "no panel {wanted:?} in {titles:?}"
        );
    }
    let guide = panels
        .iter()
        .find(|p| p["title"] == "Why was my pod rejected?")
        .and_then(|p| p["options"]["content"].as_str())
        .expect("the guide's text");
    for reason in [
        "FailedHugepagesVerification",
        "NodeUnderMemoryContentionPressure",
        "HugepagesVerificationUnavailable",
        "admission.message",
    ] {
        assert!(
            guide.contains(reason),
            "the guide does not mention {reason}"
        );
    }
}
