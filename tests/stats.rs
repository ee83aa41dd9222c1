//! Latency figures for the benchmarks: median, p99, p99.9 and maximum of timed samples.

use std::{fmt, time::Duration};

/// Order statistics of a set of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    pub count: usize,
    pub median: Duration,
    pub p99: Duration,
    pub p999: Duration,
    pub max: Duration,
}

impl Percentiles {
    /// Sorts `samples` and reads the percentiles off them (nearest rank).
    pub fn of(samples: &mut [Duration]) -> Percentiles {
        assert!(!samples.is_empty(), "no samples");
        samples.sort_unstable();
        let rank = |p: f64| {
            let i = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            samples[i - 1]
        };
        Percentiles {
            count: samples.len(),
            median: rank(0.5),
            p99: rank(0.99),
            p999: rank(0.999),
            max: samples[samples.len() - 1],
        }
    }
}

impl fmt::Display for Percentiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = |d: Duration| d.as_nanos() as f64 / 1000.0;
        write!(
            f,
            "median {:8.2} us  p99 {:8.2} us  p99.9 {:8.2} us  max {:9.2} us",
            us(self.median),
            us(self.p99),
            us(self.p999),
            us(self.max)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut samples: Vec<Duration> = (1..=1000).rev().map(Duration::from_micros).collect();
        let p = Percentiles::of(&mut samples);
        assert_eq!(
            (p.median, p.p99, p.p999, p.max),
            (
                Duration::from_micros(500),
                Duration::from_micros(990),
                Duration::from_micros(999),
                Duration::from_micros(1000)
            )
        );
        let p = Percentiles::of(&mut [Duration::from_micros(7)]);
        assert_eq!(
            (p.median, p.p99, p.count),
            (Duration::from_micros(7), Duration::from_micros(7), 1)
        );
    }
}
