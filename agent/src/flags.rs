//! What every group of flags shares: the error a flag's value gets ([`FlagError`], naming the
//! flag and the value), and the readers of durations (`30s`, `500ms`), sizes (`64Mi`) and
//! addresses. Each subsystem keeps its own flags beside it, as a clap group (`…::flags`), and
//! turns them into its settings with these; `config` puts the groups together per subcommand.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::quantity::{format_binary, parse_bytes};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("--host-root {0}: not a directory")]
    HostRoot(PathBuf),
    #[error("{flag} {value:?}: expected an address and port such as {example}")]
    Address {
        flag: &'static str,
        value: String,
        example: &'static str,
    },
    #[error("{flag} {value:?}: {reason}")]
    Interval {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("{flag} {value}: expected a percentage above 0 and at most 100")]
    Threshold { flag: &'static str, value: String },
    #[error("{flag} {value:?}: {reason}")]
    Bytes {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("{flags} go together: {missing} missing")]
    Together {
        flags: &'static str,
        missing: String,
    },
    #[error("{flag} {value:?}: {reason}")]
    Name {
        flag: &'static str,
        value: String,
        reason: String,
    },
}

/// `text` as a socket address, or the error naming `flag` with an `example`.
pub fn address(
    flag: &'static str,
    text: &str,
    example: &'static str,
) -> Result<SocketAddr, FlagError> {
    text.parse().map_err(|_| FlagError::Address {
        flag,
        value: text.to_owned(),
        example,
    })
}

/// A duration flag: parsed, then `reject` says what is wrong with the value, if anything.
pub fn duration(
    flag: &'static str,
    text: &str,
    reject: impl Fn(Duration) -> Option<String>,
) -> Result<Duration, FlagError> {
    parse_duration(text)
        .and_then(|d| reject(d).map_or(Ok(d), Err))
        .map_err(|reason| FlagError::Interval {
            flag,
            value: text.to_owned(),
            reason,
        })
}

/// Refuses a zero duration.
pub fn above_zero(d: Duration) -> Option<String> {
    d.is_zero().then(|| "must be above zero".to_owned())
}

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h` (`30s`, `500ms`, `1.5m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| "needs a unit: ms, s, m or h".to_owned())?;
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{number:?} is not a number"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?}; use ms, s, m or h")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| e.to_string())
}

/// A size flag: a Kubernetes quantity of bytes (`64Mi`, `8388608`), above zero and at most
/// `most`.
pub fn bytes(flag: &'static str, text: &str, most: u64) -> Result<usize, FlagError> {
    let invalid = |reason: String| FlagError::Bytes {
        flag,
        value: text.to_owned(),
        reason,
    };
    let n = parse_bytes(text).map_err(|e| invalid(e.to_string()))?;
    if n == 0 || n > most {
        return Err(invalid(format!(
            "must be above 0 and at most {}",
            format_binary(most)
        )));
    }
    usize::try_from(n).map_err(|e| invalid(e.to_string()))
}

/// A percentage flag: above 0 and at most 100.
pub fn percentage(flag: &'static str, value: f64) -> Result<f64, FlagError> {
    if value > 0.0 && value <= 100.0 {
        Ok(value)
    } else {
        Err(FlagError::Threshold {
            flag,
            value: value.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("10").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("10d").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("x1s").is_err());
    }

    #[test]
    fn sizes_and_percentages_name_the_flag() {
        assert_eq!(bytes("--x", "64Mi", 1 << 30), Ok(64 << 20));
        for bad in ["0", "-1Mi", "lots", "2Gi"] {
            let err = bytes("--x", bad, 1 << 30).expect_err(bad).to_string();
            assert!(err.starts_with(&format!("--x {bad:?}: ")), "{err}");
        }
        assert_eq!(percentage("--p", 100.0), Ok(100.0));
        assert_eq!(
            percentage("--p", 0.0).map_err(|e| e.to_string()),
            Err("--p 0: expected a percentage above 0 and at most 100".to_owned())
        );
    }
}
