//! Pressure (PSI) files (`psi/parse.rs`), any text. A file that parses prints in the kernel's
//! format and parses back to the same values; a refused one's error names the file.
#![no_main]

use std::path::Path;

use hugepage_agent::psi::parse::{Line, parse};
use libfuzzer_sys::fuzz_target;

const PATH: &str = "/proc/pressure/memory";

fn line(kind: &str, l: &Line) -> String {
    format!(
        "{kind} avg10={} avg60={} avg300={} total={}\n",
        l.avg10, l.avg60, l.avg300, l.total
    )
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text, Path::new(PATH)) {
        Ok(pressure) => {
            for l in std::iter::once(&pressure.some).chain(&pressure.full) {
                for avg in [l.avg10, l.avg60, l.avg300] {
                    assert!((0.0..=100.0).contains(&avg), "avg {avg} out of range");
                }
            }
            let mut printed = line("some", &pressure.some);
            if let Some(full) = &pressure.full {
                printed += &line("full", full);
            }
            assert_eq!(
                parse(&printed, Path::new(PATH)).ok(),
                Some(pressure),
                "{printed}"
            );
        }
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains(PATH), "{message:?} does not name the file");
        }
    }
});
