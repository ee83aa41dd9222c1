//! Command-line flags of the benchmark binaries: `--name value` pairs, checked against the names
//! a binary knows. Anything malformed prints the binary's usage line and exits with 2.

use std::path::PathBuf;

/// The parsed `--name value` pairs of one benchmark.
pub struct BenchFlags {
    usage: &'static str,
    pairs: Vec<(String, String)>,
}

impl BenchFlags {
    /// Reads `std::env::args`; every flag must be one of `known`.
    pub fn parse(usage: &'static str, known: &[&str]) -> BenchFlags {
        BenchFlags::from(usage, known, std::env::args().skip(1))
            .unwrap_or_else(|| BenchFlags::fail(usage))
    }

    fn from(
        usage: &'static str,
        known: &[&str],
        args: impl Iterator<Item = String>,
    ) -> Option<BenchFlags> {
        let args: Vec<String> = args.collect();
        let pairs = args
            .chunks(2)
            .map(|pair| match pair {
                [name, value] if known.contains(&name.as_str()) => {
                    Some((name.clone(), value.clone()))
                }
                _ => None,
            })
            .collect::<Option<Vec<_>>>()?;
        Some(BenchFlags { usage, pairs })
    }

    fn fail(usage: &str) -> ! {
        eprintln!("usage: {usage}");
        std::process::exit(2)
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// A positive number, or `default` when the flag is absent.
    pub fn number(&self, name: &str, default: u64) -> u64 {
        match self.get(name) {
            None => default,
            Some(v) => v
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| BenchFlags::fail(self.usage)),
        }
    }

    /// A positive number that may be given.
    pub fn optional_number(&self, name: &str) -> Option<u64> {
        self.get(name).map(|_| self.number(name, 0))
    }

    /// One of `choices`, or the first of them when the flag is absent.
    pub fn choice(&self, name: &str, choices: &[&'static str]) -> &'static str {
        match self.get(name) {
            None => choices[0],
            Some(v) => choices
                .iter()
                .find(|c| **c == v)
                .copied()
                .unwrap_or_else(|| BenchFlags::fail(self.usage)),
        }
    }

    /// A comma-separated list of positive numbers, or `default` when the flag is absent.
    pub fn numbers(&self, name: &str, default: &[u64]) -> Vec<u64> {
        match self.get(name) {
            None => default.to_vec(),
            Some(v) => v
                .split(',')
                .map(|n| n.trim().parse().ok().filter(|&n: &u64| n > 0))
                .collect::<Option<Vec<u64>>>()
                .unwrap_or_else(|| BenchFlags::fail(self.usage)),
        }
    }

    /// The flag's value as given, or `default` when it is absent.
    pub fn word<'a>(&'a self, name: &str, default: &'a str) -> &'a str {
        self.get(name).unwrap_or(default)
    }

    /// A path that may be given.
    pub fn optional_path(&self, name: &str) -> Option<PathBuf> {
        self.get(name).map(PathBuf::from)
    }

    /// A path that must be given.
    pub fn path(&self, name: &str) -> PathBuf {
        self.get(name)
            .map(PathBuf::from)
            .unwrap_or_else(|| BenchFlags::fail(self.usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Option<BenchFlags> {
        BenchFlags::from(
            "u",
            &["--rate", "--agent"],
            args.iter().map(|s| (*s).to_owned()),
        )
    }

    #[test]
    fn pairs_of_known_flags_parse_and_the_rest_is_refused() {
        let f = flags(&["--rate", "500", "--agent", "/bin/a"]).expect("valid");
        assert_eq!((f.number("--rate", 1), f.number("--missing", 7)), (500, 7));
        assert_eq!(
            (f.optional_number("--rate"), f.optional_number("--missing")),
            (Some(500), None)
        );
        assert_eq!(f.path("--agent"), PathBuf::from("/bin/a"));
        assert_eq!(f.optional_path("--agent"), Some(PathBuf::from("/bin/a")));
        assert_eq!(f.optional_path("--rate"), Some(PathBuf::from("500")));
        assert_eq!(f.optional_path("--versus"), None);
        assert_eq!(
            (f.word("--agent", "x"), f.word("--mode", "plain")),
            ("/bin/a", "plain")
        );
        let f = flags(&["--rate", "16,50"]).expect("valid");
        assert_eq!(f.numbers("--rate", &[1]), vec![16, 50]);
        assert_eq!(f.numbers("--agent", &[4]), vec![4], "absent: the default");
        assert!(flags(&["--rate"]).is_none(), "a flag without its value");
        assert!(flags(&["--speed", "1"]).is_none(), "an unknown flag");
    }
}
