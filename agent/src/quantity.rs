//! Kubernetes quantities (`resource.Quantity`): parsing `1Gi`, `2048Mi`, `1G`, `512M`, `1.5Gi`,
//! `1e9` or plain bytes to an exact byte count, and printing bytes the way Kubernetes prints them.
//!
//! Parsing follows apimachinery's grammar: an optional sign, decimal digits with an optional
//! fraction, then one suffix: binary (`Ki` … `Ei`), decimal (`n u m k M G T P E`) or an exponent
//! (`e3`, `E-2`). Arithmetic is exact (no floating point); a fraction of a byte rounds up, as
//! `Quantity.Value()` does. Printing uses the canonical binary form: the largest of `Ki` … `Ei`
//! that divides exactly, else plain bytes (`2097152` → `2Mi`, `1536Mi` stays `1536Mi`).

const SUFFIXES: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error(
        "{0:?} is not a quantity: expected a number with an optional suffix such as Ki, Mi, Gi, k, M, G or e3"
    )]
    Syntax(String),
    #[error(
        "{0:?} has an unknown suffix {1:?}: use Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E, m, u, n or e<exponent>"
    )]
    Suffix(String, String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is too large (at most 2^64-1 bytes)")]
    TooLarge(String),
    #[error("{0:?} has more significant digits than can be read exactly (at most 38)")]
    Precision(String),
}

/// A suffix's multiplier: `2^shift`, or `10^exp` (exp may be negative).
enum Multiplier {
    Binary(u32),
    Decimal(i32),
}

fn suffix(text: &str, suffix: &str) -> Result<Multiplier, QuantityError> {
    let binary = SUFFIXES
        .iter()
        .find(|(s, _)| *s == suffix)
        .map(|&(_, shift)| Multiplier::Binary(shift));
    if let Some(m) = binary {
        return Ok(m);
    }
    let decimal = match suffix {
        "" => 0,
        "n" => -9,
        "u" => -6,
        "m" => -3,
        "k" => 3,
        "M" => 6,
        "G" => 9,
        "T" => 12,
        "P" => 15,
        "E" => 18,
        exp if exp.starts_with(['e', 'E']) => {
            return exp[1..]
                .parse::<i32>()
                .ok()
                .filter(|e| e.abs() <= 38)
                .map(Multiplier::Decimal)
                .ok_or_else(|| QuantityError::Suffix(text.to_owned(), suffix.to_owned()));
        }
        _ => return Err(QuantityError::Suffix(text.to_owned(), suffix.to_owned())),
    };
    Ok(Multiplier::Decimal(decimal))
}

/// Parses a quantity of bytes.
pub fn parse_bytes(text: &str) -> Result<u64, QuantityError> {
    let bytes = parse_scaled(text, 0)?;
    u64::try_from(bytes).map_err(|_| QuantityError::TooLarge(text.to_owned()))
}

/// Parses any quantity (CPU too) in billionths, Kubernetes' finest precision: `500m` → 5·10⁸,
/// `1` → 10⁹. Two quantities are equal exactly when these are.
pub fn parse_nanos(text: &str) -> Result<u128, QuantityError> {
    parse_scaled(text, 9)
}

/// `text` × 10^`exp10`, a remaining fraction rounded up.
fn parse_scaled(text: &str, exp10: i32) -> Result<u128, QuantityError> {
    let syntax = || QuantityError::Syntax(text.to_owned());
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let number_len = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, rest) = unsigned.split_at(number_len);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || fraction.contains('.') {
        return Err(syntax());
    }
    // Trailing zeros of the fraction change nothing (`1.000…0` is 1), only the digits' count.
    let fraction = fraction.trim_end_matches('0');
    let multiplier = suffix(text, rest)?;
    let too_large = || QuantityError::TooLarge(text.to_owned());
    // The digits of both parts as one number, read in place (every admission reads a few
    // quantities per container: no allocation for each).
    let mut numerator = whole
        .bytes()
        .chain(fraction.bytes())
        .try_fold(0u128, |n, digit| {
            n.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
        })
        .ok_or_else(|| {
            // A fraction's digits beyond u128 are a precision this reading does not keep, not a
            // large value (a large whole part is).
            if fraction.is_empty() {
                too_large()
            } else {
                QuantityError::Precision(text.to_owned())
            }
        })?;
    if numerator != 0 && negative {
        return Err(QuantityError::Negative(text.to_owned()));
    }
    let mut denominator_exp = fraction.len() as i32 - exp10;
    match multiplier {
        Multiplier::Binary(shift) => {
            numerator = numerator
                .checked_mul(1u128 << shift)
                .ok_or_else(too_large)?;
        }
        Multiplier::Decimal(exp) => denominator_exp -= exp,
    }
    if denominator_exp < 0 {
        let scale = 10u128
            .checked_pow(denominator_exp.unsigned_abs())
            .ok_or_else(too_large)?;
        numerator = numerator.checked_mul(scale).ok_or_else(too_large)?;
        denominator_exp = 0;
    }
    // A denominator beyond u128 is above any numerator: the value is below one unit, which
    // rounds up to 1 unless it is 0 (it was refused as too large: `0.1e-38`).
    let Some(denominator) = 10u128.checked_pow(denominator_exp as u32) else {
        return Ok(u128::from(numerator != 0));
    };
    Ok(numerator.div_ceil(denominator))
}

/// Formats `bytes` in Kubernetes' canonical binary form.
pub fn format_binary(bytes: u64) -> String {
    if bytes == 0 {
        return "0".to_owned();
    }
    for (suffix, shift) in SUFFIXES {
        if bytes.trailing_zeros() >= shift {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_largest_exact_binary_suffix() {
        for (bytes, text) in [
            (0, "0"),
            (1000, "1000"),
            (1024, "1Ki"),
            (2 * 1024 * 1024, "2Mi"),
            (1536 * 1024 * 1024, "1536Mi"),
            (1 << 30, "1Gi"),
            (6 << 30, "6Gi"),
            ((1 << 30) + 1, "1073741825"),
            (16 << 40, "16Ti"),
        ] {
            assert_eq!(format_binary(bytes), text, "{bytes}");
        }
    }

    #[test]
    fn cpu_quantities_compare_exactly_in_nanos() {
        assert_eq!(parse_nanos("1").unwrap(), parse_nanos("1000m").unwrap());
        assert_eq!(parse_nanos("0.5").unwrap(), 500_000_000);
        assert_eq!(parse_nanos("1n").unwrap(), 1);
        assert_eq!(parse_nanos("2k").unwrap(), 2_000_000_000_000);
        assert_ne!(parse_nanos("1").unwrap(), parse_nanos("999m").unwrap());
        assert!(parse_nanos("1x").is_err());
    }

    #[test]
    fn parses_every_suffix_family_exactly() {
        for (text, bytes) in [
            ("1Gi", 1u64 << 30),
            ("2048Mi", 2 << 30),
            ("1G", 1_000_000_000),
            ("512M", 512_000_000),
            ("1.5Gi", 3 << 29),
            ("0.5Ki", 512),
            ("4194304", 4 << 20),
            ("+2Mi", 2 << 20),
            ("1e9", 1_000_000_000),
            ("2E3", 2000),
            ("1k", 1000),
            ("1500m", 2),
            ("100m", 1),
            ("0", 0),
            ("-0", 0),
            ("00012Ki", 12 << 10),
            (".5Mi", 512 << 10),
            ("15Ei", 15 << 60),
        ] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
    }

    #[test]
    fn round_trips_through_the_canonical_form() {
        for text in ["2Mi", "6Gi", "1536Mi", "1000", "3Ti"] {
            assert_eq!(format_binary(parse_bytes(text).expect(text)), text);
        }
    }

    /// Found by the fuzz target `quantity`: a positive value below one byte whose denominator
    /// is beyond u128 (more than 38 decimal places in all) was refused as "too large"; it is
    /// one byte rounded up, as its billionths (1) say.
    #[test]
    fn a_value_far_below_one_byte_rounds_up_and_is_not_too_large() {
        let tiny = ".000000000000000000006162134380544732368";
        assert_eq!(parse_nanos(tiny), Ok(1));
        assert_eq!(parse_bytes(tiny), Ok(1));
        assert_eq!(parse_bytes("0.1e-38"), Ok(1));
        assert_eq!(parse_bytes("0.0e-38"), Ok(0));
        assert_eq!(
            parse_bytes("1.0000000000000000000000000000000000000000"),
            Ok(1)
        );
        let precise = "0.12345678901234567890123456789012345678901";
        assert_eq!(
            parse_bytes(precise),
            Err(QuantityError::Precision(precise.into()))
        );
    }

    #[test]
    fn rejects_what_kubernetes_rejects_with_a_reason() {
        assert_eq!(
            parse_bytes("1KB"),
            Err(QuantityError::Suffix("1KB".into(), "KB".into()))
        );
        assert_eq!(
            parse_bytes("1K"),
            Err(QuantityError::Suffix("1K".into(), "K".into()))
        );
        assert_eq!(
            parse_bytes("1 Gi"),
            Err(QuantityError::Suffix("1 Gi".into(), " Gi".into()))
        );
        assert_eq!(parse_bytes("Gi"), Err(QuantityError::Syntax("Gi".into())));
        assert_eq!(parse_bytes(""), Err(QuantityError::Syntax(String::new())));
        assert_eq!(
            parse_bytes("1.2.3"),
            Err(QuantityError::Syntax("1.2.3".into()))
        );
        assert_eq!(
            parse_bytes("-1Gi"),
            Err(QuantityError::Negative("-1Gi".into()))
        );
        assert_eq!(
            parse_bytes("16Ei"),
            Err(QuantityError::TooLarge("16Ei".into()))
        );
        assert_eq!(
            parse_bytes("1e40"),
            Err(QuantityError::Suffix("1e40".into(), "e40".into()))
        );
        assert!(parse_bytes("99999999999999999999999999999999999999999").is_err());
    }
}
