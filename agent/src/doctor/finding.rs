//! What the doctor found: one [`Finding`] per thing checked (the Kubernetes API, a webhook of the
//! ValidatingWebhookConfiguration, an extender of kube-scheduler's file, a node's agent), each
//! `ok`, `wrong` (with what is wrong and what to do) or `unchecked` (with what it needs), printed
//! as lines or as JSON. The exit code follows: 0 when nothing is wrong, 1 when something is.

use serde::Serialize;

/// What was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// The Kubernetes API the other checks read.
    KubernetesApi,
    /// A webhook of the ValidatingWebhookConfiguration, called as kube-apiserver calls it.
    Webhook,
    /// An extender of kube-scheduler's configuration file, called as kube-scheduler calls it.
    Extender,
    /// A node's agent, called as the webhook calls it.
    Agent,
}

impl Check {
    fn label(self) -> &'static str {
        match self {
            Check::KubernetesApi => "kubernetes-api",
            Check::Webhook => "webhook",
            Check::Extender => "extender",
            Check::Agent => "agent",
        }
    }
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Wrong,
    Unchecked,
}

/// One finding: what was checked, of which object, the outcome and what it means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: Check,
    /// The object: a webhook's name, an extender's urlPrefix, a node's name.
    pub subject: String,
    pub verdict: Verdict,
    pub detail: String,
}

impl Finding {
    pub fn ok(check: Check, subject: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding::new(check, subject, Verdict::Ok, detail)
    }

    pub fn wrong(check: Check, subject: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding::new(check, subject, Verdict::Wrong, detail)
    }

    pub fn unchecked(
        check: Check,
        subject: impl Into<String>,
        detail: impl Into<String>,
    ) -> Finding {
        Finding::new(check, subject, Verdict::Unchecked, detail)
    }

    fn new(
        check: Check,
        subject: impl Into<String>,
        verdict: Verdict,
        detail: impl Into<String>,
    ) -> Finding {
        Finding {
            check,
            subject: subject.into(),
            verdict,
            detail: detail.into(),
        }
    }
}

/// The findings as the report prints them: one line each (`ok`, `WRONG`, `unchecked`, the check,
/// the subject, the detail), then a count of each verdict.
pub fn lines(findings: &[Finding]) -> String {
    let mut out = String::new();
    for f in findings {
        let verdict = match f.verdict {
            Verdict::Ok => "ok",
            Verdict::Wrong => "WRONG",
            Verdict::Unchecked => "unchecked",
        };
        out.push_str(&format!(
            "{verdict:<9} {:<14} {}: {}\n",
            f.check.label(),
            f.subject,
            f.detail
        ));
    }
    let count = |v: Verdict| findings.iter().filter(|f| f.verdict == v).count();
    out.push_str(&format!(
        "{} ok, {} wrong, {} unchecked\n",
        count(Verdict::Ok),
        count(Verdict::Wrong),
        count(Verdict::Unchecked)
    ));
    out
}

/// The findings as one JSON document: `{"findings": [...], "wrong": N}`.
pub fn json(findings: &[Finding]) -> String {
    let wrong = findings
        .iter()
        .filter(|f| f.verdict == Verdict::Wrong)
        .count();
    serde_json::json!({"findings": findings, "wrong": wrong}).to_string()
}

/// Whether anything is wrong.
pub fn any_wrong(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.verdict == Verdict::Wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_mark_each_verdict_and_count_them() {
        let findings = [
            Finding::ok(Check::Agent, "node-a", "answers"),
            Finding::wrong(Check::Webhook, "bindings", "caBundle does not verify"),
            Finding::unchecked(Check::Extender, "-", "no --scheduler-config"),
        ];
        let text = lines(&findings);
        assert!(
            text.contains("ok        agent          node-a: answers\n"),
            "{text}"
        );
        assert!(
            text.contains("WRONG     webhook        bindings: caBundle"),
            "{text}"
        );
        assert!(text.ends_with("1 ok, 1 wrong, 1 unchecked\n"), "{text}");
        assert!(any_wrong(&findings));
        assert!(!any_wrong(&findings[..1]));
        let doc: serde_json::Value = serde_json::from_str(&json(&findings)).expect("JSON");
        assert_eq!(doc["wrong"], 1);
        assert_eq!(doc["findings"][2]["verdict"], "unchecked");
        assert_eq!(doc["findings"][1]["check"], "webhook");
    }
}
