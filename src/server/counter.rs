//! The FPGA's frame counter, checked when `ServerConfig::counter_wrap`
//! asks: surf's stream core puts `addrCount` in immediate bits \[31:8\],
//! +1 per SEND it dispatches (a retry replays the work request and never
//! renumbers), wrapping to 0 at its `AddrWrapCount` register, 0 again when
//! dispatch is re-armed. Every message the host ACKs is delivered in order,
//! so a delivered frame whose counter is not the last one + 1 (modulo the
//! wrap) tells of frames the FPGA numbered and never sent (a gap), or of an
//! FPGA that started counting over (a reset: back to 0).
//!
//! [`CounterCheck`] is pure: fed each delivered frame's counter, it says
//! what it saw. The receive thread counts and logs (`thread.rs`).

/// What one frame's counter says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// The counter expected.
    InOrder,
    /// `missing` numbers from `expected` on never arrived; this frame
    /// carries `got`.
    Gap {
        expected: u32,
        got: u32,
        missing: u32,
    },
    /// Back to 0 where `expected` was due: the FPGA re-armed its dispatch
    /// (or a restarted FPGA's first frame).
    Reset { expected: u32 },
    /// A counter at or above the wrap: the FPGA's `AddrWrapCount` is not
    /// the server's `counter_wrap` (or the FPGA puts other things in those
    /// bits). The check goes on from it.
    Beyond { got: u32 },
}

/// The check of one link's counter: `wrap` numbers (the counter runs
/// 0..wrap-1), the next one due.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CounterCheck {
    wrap: u32,
    expected: u32,
}

impl CounterCheck {
    /// A check of a counter wrapping at `wrap` (1..=2^24), the first frame
    /// due at 0 (the FPGA counts from 0 once armed, and the host is
    /// connected before it is).
    pub fn new(wrap: u32) -> CounterCheck {
        CounterCheck {
            wrap: wrap.max(1),
            expected: 0,
        }
    }

    /// A delivered frame's counter (immediate bits \[31:8\]).
    pub fn frame(&mut self, got: u32) -> Seen {
        let expected = self.expected;
        if got >= self.wrap {
            self.expected = (got + 1) % crate::wire::MASK_24.wrapping_add(1);
            return Seen::Beyond { got };
        }
        self.expected = (got + 1) % self.wrap;
        if got == expected {
            Seen::InOrder
        } else if got == 0 {
            Seen::Reset { expected }
        } else {
            let missing = (got + self.wrap - expected) % self.wrap;
            Seen::Gap {
                expected,
                got,
                missing,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(wrap: u32, counters: &[u32]) -> Vec<Seen> {
        let mut c = CounterCheck::new(wrap);
        counters.iter().map(|&n| c.frame(n)).collect()
    }

    #[test]
    fn a_counter_that_advances_by_one_and_wraps_is_in_order() {
        let seen = run(4, &[0, 1, 2, 3, 0, 1, 2, 3, 0]);
        assert!(seen.iter().all(|s| *s == Seen::InOrder), "{seen:?}");
        let top = 1 << 24;
        let mut c = CounterCheck::new(top);
        c.expected = top - 1;
        assert_eq!(c.frame(top - 1), Seen::InOrder);
        assert_eq!(c.frame(0), Seen::InOrder, "2^24 wraps to 0");
    }

    #[test]
    fn skipped_numbers_are_a_gap_with_how_many_even_across_the_wrap() {
        assert_eq!(
            run(4096, &[0, 1, 4, 5]),
            [
                Seen::InOrder,
                Seen::InOrder,
                Seen::Gap {
                    expected: 2,
                    got: 4,
                    missing: 2
                },
                Seen::InOrder
            ]
        );
        // 4094 then 1: 4095 and 0 never came.
        let mut c = CounterCheck::new(4096);
        c.expected = 4094;
        assert_eq!(c.frame(4094), Seen::InOrder);
        assert_eq!(
            c.frame(1),
            Seen::Gap {
                expected: 4095,
                got: 1,
                missing: 2
            }
        );
        assert_eq!(c.frame(2), Seen::InOrder);
    }

    #[test]
    fn the_first_frame_is_due_at_0() {
        assert_eq!(
            run(16, &[3])[0],
            Seen::Gap {
                expected: 0,
                got: 3,
                missing: 3
            }
        );
    }

    #[test]
    fn back_to_0_is_a_reset_and_counting_goes_on_from_it() {
        assert_eq!(
            run(4096, &[0, 1, 2, 0, 1]),
            [
                Seen::InOrder,
                Seen::InOrder,
                Seen::InOrder,
                Seen::Reset { expected: 3 },
                Seen::InOrder
            ]
        );
    }

    #[test]
    fn a_counter_beyond_the_wrap_says_so_and_the_check_follows_it() {
        assert_eq!(
            run(16, &[0, 20, 21]),
            [
                Seen::InOrder,
                Seen::Beyond { got: 20 },
                Seen::Beyond { got: 21 }
            ]
        );
    }
}
