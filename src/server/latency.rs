//! Latency histograms: the soft backend's ACK turnaround and every
//! backend's frame delivery latency, measured from the kernel's receive
//! timestamp of a packet (`SO_TIMESTAMPNS`, CLOCK_REALTIME, taken in the
//! kernel's receive path) to a clock read (CLOCK_REALTIME through the vDSO)
//! at the moment that counts: the ACK leaving (`sendmmsg` returned), the
//! frame callback's entry, or the pull poll's return.
//!
//! Measured only when `ServerConfig::measure_latency` asks: the kernel then
//! stamps every packet and the thread reads the clock once per ACK batch
//! and once per frame; otherwise nothing is stamped and nothing is read.
//!
//! Buckets are log-linear (16 per power of two, as HdrHistogram's with 4
//! significant bits): a quantile is reported as its bucket's midpoint,
//! within 3.2% of the true value, from 1 ns to 68 s.

use std::sync::atomic::{AtomicU64, Ordering};

/// Sub-buckets per power of two: 2^SUB_BITS.
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// The largest value bucketed apart (2^36 ns, 68 s); longer ones land in
/// the last bucket.
const TOP_BIT: u32 = 36;
const BUCKETS: usize = SUB + (TOP_BIT - SUB_BITS) as usize * SUB;

/// The bucket of `v` nanoseconds.
fn bucket(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let p = 63 - v.leading_zeros();
    if p >= TOP_BIT {
        return BUCKETS - 1;
    }
    let sub = (v >> (p - SUB_BITS)) as usize & (SUB - 1);
    SUB + (p - SUB_BITS) as usize * SUB + sub
}

/// The value a bucket stands for: its midpoint.
fn midpoint(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let octave = ((i - SUB) / SUB) as u32;
    let sub = ((i - SUB) % SUB) as u64;
    let width = 1u64 << octave;
    ((SUB as u64 + sub) << octave) + width / 2
}

/// A live histogram: any thread records, any thread reads a snapshot.
pub(crate) struct Histogram {
    counts: Box<[AtomicU64]>,
    max: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// One sample of `ns` nanoseconds.
    pub fn record(&self, ns: u64) {
        self.counts[bucket(ns)].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(ns, Ordering::Relaxed);
    }

    /// One sample from a kernel receive stamp `rx_ns` (CLOCK_REALTIME ns;
    /// 0: not stamped, nothing recorded) to `now_ns`.
    pub fn since(&self, rx_ns: u64, now_ns: u64) {
        if rx_ns != 0 {
            self.record(now_ns.saturating_sub(rx_ns));
        }
    }

    /// Count, p50, p99, p99.9 and max so far.
    pub fn snapshot(&self) -> Latency {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let count: u64 = counts.iter().sum();
        let quantile = |q: f64| {
            if count == 0 {
                return 0;
            }
            // The smallest value with at least q of the samples at or below it.
            let rank = ((q * count as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, &c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return midpoint(i);
                }
            }
            midpoint(BUCKETS - 1)
        };
        Latency {
            count,
            p50_ns: quantile(0.5),
            p99_ns: quantile(0.99),
            p999_ns: quantile(0.999),
            max_ns: self.max.load(Ordering::Relaxed),
        }
    }
}

/// A latency distribution since the server was created (all 0 when not
/// measured: see `ServerConfig::measure_latency`). Quantiles within 3.2%.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Median, nanoseconds.
    pub p50_ns: u64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: u64,
    /// 99.9th percentile, nanoseconds.
    pub p999_ns: u64,
    /// The largest sample, nanoseconds (exact).
    pub max_ns: u64,
}

impl std::fmt::Display for Latency {
    /// "p50 12.3 us, p99 45.6 us, p99.9 78.9 us (N samples)" or "not measured".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.count == 0 {
            return f.write_str("not measured");
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        write!(
            f,
            "p50 {:.1} us, p99 {:.1} us, p99.9 {:.1} us ({} samples)",
            us(self.p50_ns),
            us(self.p99_ns),
            us(self.p999_ns),
            self.count
        )
    }
}

/// Now, as the kernel's receive stamps count it (CLOCK_REALTIME, ns).
pub(crate) fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_falls_in_a_bucket_whose_midpoint_is_within_3_2_percent() {
        let mut v = 1u64;
        while v < 1 << TOP_BIT {
            for x in [v, v + v / 3, v * 2 - 1] {
                let m = midpoint(bucket(x));
                let err = (m as f64 - x as f64).abs() / x as f64;
                assert!(err <= 0.032, "{x} -> bucket {} -> {m}", bucket(x));
            }
            v *= 2;
        }
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        // Buckets ascend with the value.
        let mids: Vec<u64> = (0..BUCKETS).map(midpoint).collect();
        assert!(mids.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn quantiles_come_from_the_samples() {
        let h = Histogram::default();
        assert_eq!(h.snapshot(), Latency::default());
        assert_eq!(h.snapshot().to_string(), "not measured");
        // 1000 samples: 1..=1000 us.
        for us in 1..=1000u64 {
            h.record(us * 1000);
        }
        let s = h.snapshot();
        assert_eq!(s.count, 1000);
        assert_eq!(s.max_ns, 1_000_000);
        let near = |got: u64, want: u64| (got as f64 - want as f64).abs() <= want as f64 * 0.032;
        assert!(near(s.p50_ns, 500_000), "{s:?}");
        assert!(near(s.p99_ns, 990_000), "{s:?}");
        assert!(near(s.p999_ns, 999_000), "{s:?}");
        // An unstamped receive records nothing; a stamp in the future (a
        // clock step) records 0, not a wrapped value.
        h.since(0, 5);
        h.since(10, 5);
        assert_eq!(h.snapshot().count, 1001);
        assert_eq!(h.snapshot().max_ns, 1_000_000);
    }
}
