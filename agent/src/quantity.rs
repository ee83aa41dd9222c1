//! Byte quantities printed the way Kubernetes prints them (`resource.Quantity` canonical form
//! with binary suffixes): the largest of `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` that divides exactly,
//! else plain bytes. `2097152` → `2Mi`, `1536Mi` stays `1536Mi`, `1000` stays `1000`.

const SUFFIXES: [(&str, u32); 6] = [
    ("Ei", 60),
    ("Pi", 50),
    ("Ti", 40),
    ("Gi", 30),
    ("Mi", 20),
    ("Ki", 10),
];

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
    use super::format_binary;

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
}
