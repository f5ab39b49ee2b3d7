//! The NIC's completion timestamps on the host clock. A device that stamps
//! completions (`ibv_device_attr_ex.completion_timestamp_mask` non-zero, an
//! extended CQ created with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`: mlx5 does,
//! rxe does not) stamps them in its free-running clock's cycles, ticking at
//! `hca_core_clock` kHz and wrapping at the mask. [`NicClock`] converts them
//! to CLOCK_REALTIME nanoseconds from an anchor: one reading of the NIC's
//! clock (`ibv_query_rt_values_ex`) between two host clock reads, taken again
//! every [`RESYNC`] so the two clocks' drift stays bounded (crystals differ
//! by tens of ppm: under 100 µs a second). Pure: the backend takes the
//! readings (`ibv.rs`), this converts.

use std::time::Duration;

/// How often the anchor is taken again.
pub(crate) const RESYNC: Duration = Duration::from_secs(1);

/// One anchor: the NIC's clock at `raw` cycles read at host time `host_ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anchor {
    pub raw: u64,
    pub host_ns: u64,
}

impl Anchor {
    /// The anchor from a NIC reading between host reads `before_ns` and
    /// `after_ns` (the midpoint: the reading's syscall is the uncertainty).
    pub fn between(before_ns: u64, raw: u64, after_ns: u64) -> Anchor {
        Anchor {
            raw,
            host_ns: before_ns + after_ns.saturating_sub(before_ns) / 2,
        }
    }
}

/// Converts the NIC's cycles to host nanoseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NicClock {
    /// Cycles per millisecond (`hca_core_clock`, kHz).
    khz: u64,
    /// The valid bits of a timestamp (the counter wraps past it).
    mask: u64,
    anchor: Anchor,
}

impl NicClock {
    /// A clock ticking at `khz` kHz whose stamps carry the bits of `mask`;
    /// None when the device gives no rate or no bits (it cannot stamp).
    pub fn new(khz: u64, mask: u64, anchor: Anchor) -> Option<NicClock> {
        (khz > 0 && mask > 0).then_some(NicClock { khz, mask, anchor })
    }

    /// Takes a newer anchor.
    pub fn resync(&mut self, anchor: Anchor) {
        self.anchor = anchor;
    }

    /// Host nanoseconds of the NIC stamp `raw`: the signed distance from the
    /// anchor within the counter's width (a stamp a little before the
    /// anchor is before it, not a wrap ahead), scaled by the clock's rate.
    pub fn host_ns(&self, raw: u64) -> u64 {
        let m = self.mask;
        let ahead = raw.wrapping_sub(self.anchor.raw) & m;
        let cycles: i128 = if ahead > m / 2 {
            -(((m - ahead) as i128) + 1)
        } else {
            ahead as i128
        };
        let ns = cycles * 1_000_000 / self.khz as i128;
        (self.anchor.host_ns as i128 + ns).clamp(0, u64::MAX as i128) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MASK_48: u64 = (1 << 48) - 1;

    /// ConnectX's 156.25 MHz clock: 156_250 kHz, 6.4 ns a cycle.
    #[test]
    fn cycles_after_the_anchor_are_nanoseconds_after_it() {
        let a = Anchor {
            raw: 1_000_000,
            host_ns: 1_700_000_000_000_000_000,
        };
        let c = NicClock::new(156_250, MASK_48, a).unwrap();
        assert_eq!(c.host_ns(1_000_000), a.host_ns);
        // 156_250 cycles = 1 ms.
        assert_eq!(c.host_ns(1_156_250), a.host_ns + 1_000_000);
        // 5 cycles = 32 ns.
        assert_eq!(c.host_ns(1_000_005), a.host_ns + 32);
    }

    /// A completion stamped just before the anchor was taken is before it.
    #[test]
    fn a_stamp_before_the_anchor_is_earlier_not_a_wrap_ahead() {
        let a = Anchor {
            raw: 1_000_000,
            host_ns: 5_000_000_000,
        };
        let c = NicClock::new(1_000_000, MASK_48, a).unwrap(); // 1 GHz: 1 ns a cycle
        assert_eq!(c.host_ns(999_000), 5_000_000_000 - 1_000);
    }

    /// The counter wraps at its mask: a stamp after the wrap is after the anchor.
    #[test]
    fn a_stamp_past_the_counters_wrap_is_after_the_anchor() {
        let a = Anchor {
            raw: MASK_48 - 9,
            host_ns: 5_000_000_000,
        };
        let c = NicClock::new(1_000_000, MASK_48, a).unwrap();
        // 10 cycles to the wrap (MASK-9 .. 0), then 20 more.
        assert_eq!(c.host_ns(20), 5_000_000_000 + 30);
    }

    #[test]
    fn an_anchor_is_the_midpoint_of_its_host_reads_and_resync_moves_it() {
        assert_eq!(
            Anchor::between(100, 7, 300),
            Anchor {
                raw: 7,
                host_ns: 200
            }
        );
        let mut c = NicClock::new(1_000_000, MASK_48, Anchor::between(0, 0, 0)).unwrap();
        c.resync(Anchor::between(1_000, 500, 1_000));
        assert_eq!(c.host_ns(600), 1_100);
    }

    #[test]
    fn a_device_without_rate_or_bits_has_no_clock() {
        let a = Anchor::between(0, 0, 0);
        assert!(NicClock::new(0, MASK_48, a).is_none());
        assert!(NicClock::new(156_250, 0, a).is_none());
    }
}
