//! `hugepage-agent check`: one verification from the shell. Exit 0 admitted, 1 rejected (the
//! KEP's message on stderr), 2 bad input (the flag at fault on stderr).

use std::{collections::BTreeMap, process::ExitCode};

use crate::{
    admission::{
        request::{self, QuantityValue, ResourceList},
        verify::{Verdict, Verifier},
    },
    config::Config,
    numa::NumaNode,
    quantity::format_binary,
};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CheckError {
    #[error("--request {0:?}: expected hugepages-<size>=<quantity>, e.g. hugepages-2Mi=4Gi")]
    RequestSyntax(String),
    #[error("--request {0:?}: not a hugepages resource")]
    NotHugepages(String),
    #[error("--request {given:?}: {detail}")]
    Request { given: String, detail: String },
    #[error("--numa {0:?}: expected NUMA node numbers separated by commas, e.g. 0,1")]
    Numa(String),
}

/// Parses `--request` values into a resource list (requests equal limits).
pub fn parse_requests(values: &[String]) -> Result<request::Hugepages, CheckError> {
    let mut total = request::Hugepages::new();
    for value in values {
        let (name, amount) = value
            .split_once('=')
            .ok_or_else(|| CheckError::RequestSyntax(value.clone()))?;
        let list: ResourceList =
            BTreeMap::from([(name.to_owned(), QuantityValue::Text(amount.to_owned()))]);
        let pages = request::from_list(&list, "--request").map_err(|e| CheckError::Request {
            given: value.clone(),
            detail: e.detail,
        })?;
        if request::page_size(name, "--request")
            .ok()
            .flatten()
            .is_none()
        {
            return Err(CheckError::NotHugepages(value.clone()));
        }
        for (size, bytes) in pages {
            *total.entry(size).or_default() += bytes;
        }
    }
    Ok(total)
}

/// Parses `--numa 0,1`.
pub fn parse_numa(text: &str) -> Result<Vec<NumaNode>, CheckError> {
    text.split(',')
        .map(|n| n.trim().parse().map(NumaNode))
        .collect::<Result<_, _>>()
        .map_err(|_| CheckError::Numa(text.to_owned()))
}

/// Runs the check and prints the outcome; returns the exit code.
pub fn run(config: &Config, requests: &[String], numa: Option<&str>, json: bool) -> ExitCode {
    let bad = |err: &dyn std::fmt::Display| {
        eprintln!("hugepage-agent: {err}");
        ExitCode::from(2)
    };
    let request = match parse_requests(requests) {
        Ok(r) => r,
        Err(e) => return bad(&e),
    };
    let verifier = match Verifier::new(config.host.clone()) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("hugepage-agent: {e}");
            return ExitCode::FAILURE;
        }
    };
    let nodes = match numa.map(parse_numa).transpose() {
        Ok(n) => n.unwrap_or_else(|| verifier.nodes()),
        Err(e) => return bad(&e),
    };
    let verdict = match verifier.verify(&request, &nodes, config.verification) {
        Ok(v) => v,
        Err(e) => return bad(&e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&verdict).unwrap_or_default()
        );
    } else {
        print!("{}", summary(&verdict));
    }
    match &verdict.message {
        Some(message) if !verdict.allowed => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
        _ => ExitCode::SUCCESS,
    }
}

/// One line per size: requested, available in the chosen mode, and both numbers.
pub fn summary(verdict: &Verdict) -> String {
    let mut out = String::new();
    for c in &verdict.checks {
        let state = match (&c.unverified, c.ok) {
            (Some(_), _) => "unverified",
            (None, true) => "ok",
            (None, false) => "insufficient",
        };
        out.push_str(&format!(
            "{state:<12} {} on NUMA node(s) {:?}: requested {}, available {} (free {}, unreserved {})\n",
            c.resource,
            c.numa_nodes.iter().map(|n| n.0).collect::<Vec<_>>(),
            format_binary(c.requested_bytes),
            format_binary(c.available_bytes),
            format_binary(c.free_bytes),
            format_binary(c.unreserved_bytes),
        ));
    }
    out.push_str(if verdict.allowed {
        "admitted\n"
    } else {
        "rejected\n"
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numa::PageSize;

    #[test]
    fn requests_parse_and_add_up_per_size() {
        let values = [
            "hugepages-2Mi=4Gi",
            "hugepages-1Gi=2Gi",
            "hugepages-2Mi=2048Mi",
        ]
        .map(String::from);
        let parsed = parse_requests(&values).expect("valid");
        assert_eq!(
            parsed,
            request::Hugepages::from([(PageSize(2 << 20), 6 << 30), (PageSize(1 << 30), 2 << 30)])
        );
    }

    #[test]
    fn bad_requests_name_the_value() {
        let one = |v: &str| parse_requests(&[v.to_owned()]).unwrap_err().to_string();
        assert_eq!(
            one("hugepages-2Mi"),
            "--request \"hugepages-2Mi\": expected hugepages-<size>=<quantity>, e.g. hugepages-2Mi=4Gi"
        );
        assert_eq!(
            one("memory=1Gi"),
            "--request \"memory=1Gi\": not a hugepages resource"
        );
        assert!(one("hugepages-2Mi=1G").contains("not a whole multiple of the page size 2Mi"));
        assert!(one("hugepages-2Mi=lots").contains("is not a quantity"));
    }

    #[test]
    fn numa_lists_parse() {
        assert_eq!(parse_numa("0,1"), Ok(vec![NumaNode(0), NumaNode(1)]));
        assert_eq!(parse_numa("0, 2"), Ok(vec![NumaNode(0), NumaNode(2)]));
        assert_eq!(parse_numa("zero"), Err(CheckError::Numa("zero".into())));
    }
}
