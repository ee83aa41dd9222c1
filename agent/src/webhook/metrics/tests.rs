use super::*;

/// The value of `series` (name and labels as written) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn every_series_exists_at_zero_and_counts_what_happened() {
    let metrics = Metrics::default();
    let before = metrics.render(Format::Prometheus);
    for series in [
        r#"hugepage_agent_webhook_calls_total{endpoint="filter",result="answered"}"#,
        r#"hugepage_agent_webhook_calls_total{endpoint="prioritize",result="error"}"#,
        r#"hugepage_agent_webhook_nodes_total{judged="no_answer"}"#,
        "hugepage_agent_webhook_fail_open_total",
        "hugepage_agent_webhook_fail_closed_total",
        "hugepage_agent_webhook_agent_call_seconds_count",
        r#"hugepage_agent_webhook_tls_reloads_total{files="agent_client",result="rejected"}"#,
        r#"hugepage_agent_webhook_tls_reloads_total{files="serving",result="reloaded"}"#,
        r#"hugepage_agent_trace_spans_dropped_total{reason="queue_full"}"#,
    ] {
        assert_eq!(sample(&before, series), Some(0.0), "{series} in\n{before}");
    }
    metrics.call(Endpoint::Filter, true);
    metrics.call(Endpoint::Prioritize, false);
    metrics.node(Outcome::Misfit);
    metrics.node(Outcome::NoAnswer);
    metrics.unanswered(FailurePolicy::Fail, 2);
    metrics.agent_call(Duration::from_millis(3));
    let after = metrics.render(Format::OpenMetrics);
    for (series, value) in [
        (
            r#"hugepage_agent_webhook_calls_total{endpoint="filter",result="answered"}"#,
            1.0,
        ),
        (
            r#"hugepage_agent_webhook_calls_total{endpoint="prioritize",result="error"}"#,
            1.0,
        ),
        (
            r#"hugepage_agent_webhook_nodes_total{judged="misfit"}"#,
            1.0,
        ),
        (
            r#"hugepage_agent_webhook_nodes_total{judged="no_answer"}"#,
            1.0,
        ),
        ("hugepage_agent_webhook_fail_closed_total", 2.0),
        ("hugepage_agent_webhook_fail_open_total", 0.0),
        (
            r#"hugepage_agent_webhook_agent_call_seconds_bucket{le="0.005"}"#,
            1.0,
        ),
        (
            r#"hugepage_agent_webhook_agent_call_seconds_bucket{le="0.0025"}"#,
            0.0,
        ),
    ] {
        assert_eq!(sample(&after, series), Some(value), "{series} in\n{after}");
    }
    assert!(after.ends_with("# EOF\n"));
}
