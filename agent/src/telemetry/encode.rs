//! The Prometheus text exposition format (0.0.4) and OpenMetrics 1.0 text, written by hand: a
//! family header (`# HELP`, `# TYPE`), then its samples. The two formats differ only in a
//! counter's `# TYPE` name (OpenMetrics names the family without `_total`) and the closing
//! `# EOF`. Label values and help texts are escaped as both formats require.

use std::fmt::Write;

/// What a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Which text format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Prometheus,
    OpenMetrics,
}

impl Format {
    /// The format an `Accept` header asks for (OpenMetrics only when named).
    pub fn negotiate(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// A label set: (name, value) pairs; an empty value leaves the label out.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

/// Cumulative bucket counts (upper bound in seconds → observations at or below it), the sum of
/// every observation in seconds, and their number.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramValue {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// Writes one exposition.
#[derive(Debug)]
pub struct Encoder {
    out: String,
    format: Format,
}

impl Encoder {
    pub fn new(format: Format) -> Encoder {
        Encoder {
            out: String::with_capacity(16 * 1024),
            format,
        }
    }

    /// Starts a family; its samples follow.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let (type_name, kind) = match kind {
            Kind::Counter if self.format == Format::OpenMetrics => {
                (name.strip_suffix("_total").unwrap_or(name), "counter")
            }
            Kind::Counter => (name, "counter"),
            Kind::Gauge => (name, "gauge"),
            Kind::Histogram => (name, "histogram"),
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {type_name} {help}");
        let _ = writeln!(self.out, "# TYPE {type_name} {kind}");
    }

    /// One sample of a counter or gauge family.
    pub fn sample(&mut self, name: &str, labels: Labels<'_>, value: f64) {
        self.out.push_str(name);
        self.labels(labels, None);
        self.out.push(' ');
        push_value(&mut self.out, value);
        self.out.push('\n');
    }

    /// The `_bucket`, `_sum` and `_count` samples of one histogram series.
    pub fn histogram(&mut self, name: &str, labels: Labels<'_>, h: &HistogramValue) {
        for &(le, count) in &h.buckets {
            let mut bound = String::new();
            push_value(&mut bound, le);
            self.cumulative(name, labels, &bound, count);
        }
        self.cumulative(name, labels, "+Inf", h.count);
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, h.count as f64);
    }

    fn cumulative(&mut self, name: &str, labels: Labels<'_>, le: &str, count: u64) {
        self.out.push_str(name);
        self.out.push_str("_bucket");
        self.labels(labels, Some(le));
        let _ = writeln!(self.out, " {count}");
    }

    fn labels(&mut self, labels: Labels<'_>, le: Option<&str>) {
        let pairs: Vec<(&str, &str)> = labels
            .iter()
            .copied()
            .filter(|(_, v)| !v.is_empty())
            .chain(le.map(|le| ("le", le)))
            .collect();
        if pairs.is_empty() {
            return;
        }
        self.out.push('{');
        for (i, (name, value)) in pairs.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(name);
            self.out.push_str("=\"");
            for c in value.chars() {
                match c {
                    '\\' => self.out.push_str("\\\\"),
                    '"' => self.out.push_str("\\\""),
                    '\n' => self.out.push_str("\\n"),
                    c => self.out.push(c),
                }
            }
            self.out.push('"');
        }
        self.out.push('}');
    }

    /// The exposition, closed as its format requires.
    pub fn finish(mut self) -> String {
        if self.format == Format::OpenMetrics {
            self.out.push_str("# EOF\n");
        }
        self.out
    }
}

/// A float as both formats write it: integers without a fraction, `+Inf`, `-Inf`, `NaN`.
fn push_value(out: &mut String, v: f64) {
    if v.is_nan() {
        out.push_str("NaN");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    } else {
        let _ = write!(out, "{v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_histograms_are_written_in_both_formats() {
        let mut e = Encoder::new(Format::Prometheus);
        e.family("x_requests_total", Kind::Counter, "Requests.\nTwo lines");
        e.sample(
            "x_requests_total",
            &[("result", "a\"b\\c"), ("empty", "")],
            3.0,
        );
        e.family("x_latency_seconds", Kind::Histogram, "Latency.");
        let h = HistogramValue {
            buckets: vec![(0.00001, 1), (0.1, 2)],
            sum: 0.05,
            count: 3,
        };
        e.histogram("x_latency_seconds", &[("k", "v")], &h);
        let text = e.finish();
        assert_eq!(
            text,
            "# HELP x_requests_total Requests.\\nTwo lines\n# TYPE x_requests_total counter\n\
             x_requests_total{result=\"a\\\"b\\\\c\"} 3\n\
             # HELP x_latency_seconds Latency.\n# TYPE x_latency_seconds histogram\n\
             x_latency_seconds_bucket{k=\"v\",le=\"0.00001\"} 1\n\
             x_latency_seconds_bucket{k=\"v\",le=\"0.1\"} 2\n\
             x_latency_seconds_bucket{k=\"v\",le=\"+Inf\"} 3\n\
             x_latency_seconds_sum{k=\"v\"} 0.05\nx_latency_seconds_count{k=\"v\"} 3\n"
        );

        let mut e = Encoder::new(Format::OpenMetrics);
        e.family("x_requests_total", Kind::Counter, "Requests.");
        e.sample("x_requests_total", &[], 1.0);
        let text = e.finish();
        assert!(text.contains("# TYPE x_requests counter\n"), "{text}");
        assert!(text.contains("x_requests_total 1\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn the_accept_header_chooses_the_format() {
        assert_eq!(Format::negotiate(None), Format::Prometheus);
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::negotiate(Some("text/plain")), Format::Prometheus);
    }
}
