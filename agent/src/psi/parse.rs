//! Parsing of pressure files (`/proc/pressure/*`, cgroup v2 `*.pressure`):
//!
//! ```text
//! some avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! full avg10=0.00 avg60=0.00 avg300=0.00 total=0
//! ```
//!
//! A `some` line is required; `full` is optional (the system-wide cpu file of older kernels has
//! none). Errors name the file and the line.

use std::path::Path;

use serde::Serialize;

use super::PsiError;

/// One line: the share of wall time (percent) in which tasks stalled, over 10 s, 60 s and 300 s,
/// and the total stall time in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Line {
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
    pub total: u64,
}

/// A whole pressure file.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Pressure {
    /// Some tasks stalled.
    pub some: Line,
    /// All non-idle tasks stalled at once (absent in older cpu files).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full: Option<Line>,
}

/// Parses the content of the pressure file `path` (named in errors).
pub fn parse(text: &str, path: &Path) -> Result<Pressure, PsiError> {
    let mut some = None;
    let mut full = None;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |why: &str| PsiError::Malformed {
            path: path.to_path_buf(),
            line: i + 1,
            content: raw.to_owned(),
            why: why.to_owned(),
        };
        let (kind, rest) = line
            .split_once(' ')
            .ok_or_else(|| bad("expected `some` or `full` and four fields"))?;
        let slot = match kind {
            "some" => &mut some,
            "full" => &mut full,
            _ => return Err(bad("the line must start with `some` or `full`")),
        };
        if slot.is_some() {
            return Err(bad("this kind of line appears twice"));
        }
        *slot = Some(parse_line(rest).map_err(|why| bad(&why))?);
    }
    let some = some.ok_or_else(|| PsiError::Malformed {
        path: path.to_path_buf(),
        line: 0,
        content: text.to_owned(),
        why: "no `some` line".to_owned(),
    })?;
    Ok(Pressure { some, full })
}

fn parse_line(fields: &str) -> Result<Line, String> {
    let mut avg = [None::<f64>; 3];
    let mut total = None;
    for field in fields.split_whitespace() {
        let (key, value) = field
            .split_once('=')
            .ok_or_else(|| format!("{field:?} is not key=value"))?;
        let percent = || -> Result<f64, String> {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
                .ok_or_else(|| format!("{key}={value}: expected a percentage"))
        };
        match key {
            "avg10" => avg[0] = Some(percent()?),
            "avg60" => avg[1] = Some(percent()?),
            "avg300" => avg[2] = Some(percent()?),
            "total" => {
                total = Some(
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("total={value}: expected microseconds"))?,
                )
            }
            // Later kernels may add fields; they are not ours to reject.
            _ => {}
        }
    }
    match (avg, total) {
        ([Some(avg10), Some(avg60), Some(avg300)], Some(total)) => Ok(Line {
            avg10,
            avg60,
            avg300,
            total,
        }),
        _ => Err("expected avg10, avg60, avg300 and total".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<Pressure, String> {
        parse(text, Path::new("/proc/pressure/memory")).map_err(|e| e.to_string())
    }

    #[test]
    fn real_files_with_and_without_full() {
        let memory = p("some avg10=2.13 avg60=0.44 avg300=0.09 total=313872\nfull avg10=1.50 avg60=0.30 avg300=0.05 total=200000\n").expect("valid");
        assert_eq!(
            memory.some,
            Line {
                avg10: 2.13,
                avg60: 0.44,
                avg300: 0.09,
                total: 313872
            }
        );
        assert_eq!(memory.full.map(|f| f.total), Some(200000));
        let old_cpu =
            p("some avg10=12.61 avg60=10.79 avg300=5.00 total=311282614\n").expect("valid");
        assert_eq!(old_cpu.full, None);
    }

    #[test]
    fn garbage_names_the_file_and_line() {
        assert_eq!(
            p("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=x avg60=0.00 avg300=0.00 total=0\n").unwrap_err(),
            "/proc/pressure/memory line 2: \"full avg10=x avg60=0.00 avg300=0.00 total=0\": avg10=x: expected a percentage"
        );
        assert!(
            p("half avg10=0 avg60=0 avg300=0 total=0")
                .unwrap_err()
                .contains("line 1")
        );
        assert!(
            p("some avg10=0 avg60=0 total=0")
                .unwrap_err()
                .contains("expected avg10, avg60, avg300 and total")
        );
        assert!(
            p("some avg10=101 avg60=0 avg300=0 total=0")
                .unwrap_err()
                .contains("expected a percentage")
        );
        assert!(p("").unwrap_err().contains("no `some` line"));
        assert!(
            p("some avg10=0 avg60=0 avg300=0 total=0\nsome avg10=0 avg60=0 avg300=0 total=0")
                .unwrap_err()
                .contains("twice")
        );
    }
}
