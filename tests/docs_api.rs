//! The API examples of `docs/operate/api.md` are what a real agent answers: the agent is started
//! with the command the page shows (its `HOST_TREE` a host tree of two NUMA nodes, each with
//! 16 GiB of memory and 64 free 2 MiB pages, as the page says), every ```` ```http ```` request of
//! the page is sent in the page's order over a real socket, and its answer must have the status of
//! the ```` ```json answer <status> ```` block that follows and every field that block shows
//! (objects may hold more fields; arrays are compared whole, element by element).

use std::{process::Command, time::Duration};

use hugepage_agent_tests::{Agent, agent_bin, http, numa_nodes, peers::workspace, quiet_pressure};
use serde_json::Value;

/// One example: the request as written, and the answer it must get.
struct Example {
    method: String,
    path: String,
    content_type: Option<String>,
    body: String,
    status: u16,
    answer: Value,
}

/// The page's fenced blocks, in order: (info string, text).
fn blocks(page: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in page.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some(_)) => out.extend(open.take()),
            (Some((_, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

fn examples(page: &str) -> (Vec<String>, Vec<Example>) {
    let blocks = blocks(page);
    let command = blocks
        .iter()
        .find(|(info, text)| info == "sh" && text.starts_with("hugepage-agent run"))
        .map(|(_, text)| text.split_whitespace().skip(1).map(str::to_owned).collect())
        .expect("the page shows the agent's command");
    let mut examples = Vec::new();
    let mut rest = blocks.iter();
    while let Some((info, request)) = rest.next() {
        if info != "http" {
            continue;
        }
        let (head, body) = request.split_once("\n\n").unwrap_or((request, ""));
        let mut lines = head.lines();
        let first = lines.next().expect("a request line");
        let (method, path) = first.split_once(' ').expect("METHOD PATH");
        let content_type = lines
            .filter_map(|l| l.split_once(": "))
            .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.to_owned());
        let (info, answer) = rest.next().expect("an answer after each request");
        let status = info
            .strip_prefix("json answer ")
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{first}: the answer's block is not `json answer <status>`"));
        let answer = serde_json::from_str(answer)
            .unwrap_or_else(|e| panic!("{first}: the answer shown is not JSON: {e}"));
        examples.push(Example {
            method: method.to_owned(),
            path: path.to_owned(),
            content_type,
            body: body.trim().to_owned(),
            status,
            answer,
        });
    }
    (command, examples)
}

/// Whether `answer` has everything `shown` shows; where not, the path to the first difference.
fn shows(shown: &Value, answer: &Value, at: &str) -> Result<(), String> {
    match (shown, answer) {
        (Value::Object(want), Value::Object(got)) => want.iter().try_for_each(|(key, value)| {
            let at = format!("{at}.{key}");
            let got = got.get(key).ok_or_else(|| format!("{at}: missing"))?;
            shows(value, got, &at)
        }),
        (Value::Array(want), Value::Array(got)) if want.len() == got.len() => want
            .iter()
            .zip(got)
            .enumerate()
            .try_for_each(|(i, (w, g))| shows(w, g, &format!("{at}[{i}]"))),
        (want, got) if want == got => Ok(()),
        (want, got) => Err(format!(
            "{at}: the page shows {want}, the agent answered {got}"
        )),
    }
}

#[test]
fn every_example_of_the_api_page_gets_the_answer_the_page_shows() {
    let page_path = workspace().join("docs/operate/api.md");
    let page = std::fs::read_to_string(&page_path).expect("docs/operate/api.md");
    let (command, examples) = examples(&page);
    assert!(examples.len() >= 10, "only {} examples", examples.len());
    let tree = tempfile::tempdir().expect("a host tree");
    numa_nodes(tree.path(), 2, 16 << 20, 64, 64);
    quiet_pressure(tree.path());
    let mut cmd = Command::new(agent_bin());
    for arg in &command {
        match arg.as_str() {
            "HOST_TREE" => cmd.arg(tree.path()),
            other => cmd.arg(other),
        };
    }
    let mut agent = Agent::start(cmd);
    agent.wait_for("agent running", Duration::from_secs(20), |_| true);
    for example in &examples {
        let request = format!("{} {}", example.method, example.path);
        let (status, text) = http(
            agent.port,
            &example.method,
            &example.path,
            example.content_type.as_deref(),
            &example.body,
        );
        assert_eq!(status, example.status, "{request}: {text}");
        let answer: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{request}: {e}: {text}"));
        if let Err(why) = shows(&example.answer, &answer, "answer") {
            panic!("{request} (docs/operate/api.md): {why}\n{answer:#}");
        }
    }
}
