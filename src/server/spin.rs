//! How the receive thread waits when a poll finds nothing: one decision per
//! empty poll ([`Spin::idle`] returns a [`Wait`]), acted on by the receive
//! loop (`thread.rs`), as quinn-proto's `Pacer::delay` decides and its
//! caller acts. The spin budget is here; whether to spin or nap at all is
//! the judge's (`judge.rs`), which this holds.
//!
//! A spin saves a park (arm, block, wake-up: microseconds of CPU and of
//! latency; on a window-limited sender, such as surf's engine waiting for
//! ACKs, a slower stream) when the next packet comes within the spin; it
//! wastes the spin when it does not. The budget adapts as Linux KVM's halt
//! polling does (`virt/kvm/kvm_main.c`: `grow_halt_poll_ns`,
//! `shrink_halt_poll_ns`), judging each idle period by how it ended:
//!
//! - **a hit** (a spin found the packet): the budget stays;
//! - **a miss that was short** (the spin ran out and the thread blocked, but
//!   the packet came within `spin_us`: a longer spin would have caught it):
//!   the budget doubles, from 1 us, up to `spin_us`;
//! - **a miss that was long** (the block outlasted `spin_us`: an idle link,
//!   or one slower than the budget can bridge): the budget halves, and below
//!   1 us it is 0: block at once, until a short block grows it back.
//!
//! So a stream whose gaps the budget bridges is polled without parking
//! (latency and a window-limited sender's pace kept), and an idle link, or a
//! slow one (gaps beyond `spin_us`), costs what blocking costs after a few
//! idle periods instead of a spin per gap. A wake-up by a release (no
//! packet) does not end the idle period. Spinning reads the clock every
//! [`CLOCK_EVERY`] empty polls; the end of an idle period reuses the clock
//! read the loop makes anyway (`note_activity`). `spin_us` 0 never spins and
//! reads no clock.
//!
//! Above the budget, the judge decides whether to spin at all: a paced
//! sender's gaps are bridged as well as a window-limited sender's round
//! trips, but only the latter's frame rate depends on the spin.

use super::judge::{Judge, Mode};
use std::time::{Duration, Instant};

/// The smallest budget worth spinning; a smaller one blocks at once.
const MIN_SPIN: Duration = Duration::from_micros(1);

/// A block that ended within this many times `spin_us` counts as short
/// (the budget grows): the idle period a block measures includes the
/// thread's own wake-up, so a window-limited sender whose ACK round trip a
/// spin would bridge shows up a little beyond `spin_us` once the thread
/// blocks (and runs at a fraction of its spinning rate: the demo's
/// surf-like 4-message window, docs/performance.md, the surf rows).
const GROW_WITHIN: u32 = 2;

/// Empty polls between clock reads while spinning.
const CLOCK_EVERY: u32 = 4;

/// Spinning polls between two `sched_yield`s ([`Wait::Yield`]), counted
/// over all idle periods. Spinning gives the CPU, every `YIELD_EVERY`
/// polls, to any thread waiting for it (the application's consumer, a
/// sender on this host): with none, sched_yield returns at once; without
/// it, a spinning receive thread starved a pull consumer until the slots
/// ran out and the FPGA was sent RNR NAKs, at surf's window. Not every
/// poll: a verbs poll is a userspace CQ read, which a syscall each time
/// would slow several-fold.
const YIELD_EVERY: u32 = 8;

/// What the receive loop does after a poll that found nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wait {
    /// Poll again at once (a spin-loop hint between).
    Poll,
    /// Poll again after a `sched_yield` (every [`YIELD_EVERY`]th spin).
    Yield,
    /// Sleep this long, then poll once; park if that found nothing.
    Nap(Duration),
    /// Block until a completion or a wake-up.
    Park,
}

/// The budget after an idle period that lasted `wait` and ended in a spin
/// (`spun`) or after a block, from `budget`, at most `max`.
pub(super) fn next_budget(budget: Duration, wait: Duration, spun: bool, max: Duration) -> Duration {
    if spun {
        budget
    } else if wait <= max * GROW_WITHIN {
        (budget * 2).max(MIN_SPIN).min(max)
    } else if budget / 2 < MIN_SPIN {
        Duration::ZERO
    } else {
        budget / 2
    }
}

/// Where the thread is between two polls that found work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idle {
    /// Not idle: the last poll found packets or completions.
    No,
    /// Idle since `since`, spinning; `polls` empty polls so far.
    Spinning { since: Instant, polls: u32 },
    /// Idle since `since` (None: not measured, at the start), parked.
    Parked { since: Option<Instant> },
}

/// The receive loop's waiting policy: [`Spin::work`] after each poll that
/// found work, [`Spin::idle`] after each empty one (what to do), and
/// [`Spin::parked`] when it blocks.
#[derive(Debug)]
pub(super) struct Spin {
    max: Duration,
    budget: Duration,
    idle: Idle,
    /// Spins over all idle periods, for the yield cadence.
    spins: u32,
    /// Whether to spin at all, and how long to nap (None: `spin_us` 0, or
    /// the budget's own tests).
    judge: Option<Judge>,
}

impl Spin {
    /// Spinning at most `spin_us` microseconds (0: never, nor napping),
    /// starting at the full budget; naps let in at most `nap_room` frames
    /// (`judge::nap_room`).
    pub fn new(spin_us: u32, nap_room: u64) -> Spin {
        let max = Duration::from_micros(spin_us as u64);
        Spin {
            max,
            budget: max,
            idle: Idle::Parked { since: None },
            spins: 0,
            judge: (!max.is_zero()).then(|| Judge::new(nap_room)),
        }
    }

    /// The budget alone, never judged (its tests).
    #[cfg(test)]
    fn unjudged(spin_us: u32) -> Spin {
        Spin {
            judge: None,
            ..Spin::new(spin_us, 0)
        }
    }

    /// The budget the next idle period spins for.
    #[cfg(test)]
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// A poll found work at `now` (`frames` frames completed): the idle
    /// period (if any) ends.
    pub fn work(&mut self, now: Instant, frames: usize) {
        if let Some(judge) = &mut self.judge {
            judge.work(now, frames as u64);
        }
        let (since, spun) = match self.idle {
            Idle::No => return,
            Idle::Spinning { since, .. } => (Some(since), true),
            Idle::Parked { since } => (since, false),
        };
        if let Some(since) = since {
            let wait = now.saturating_duration_since(since);
            self.budget = next_budget(self.budget, wait, spun, self.max);
        }
        self.idle = Idle::No;
    }

    /// A poll found nothing: what to do. `clock` is read at the first empty
    /// poll of a spin and every [`CLOCK_EVERY`] after it, never otherwise.
    pub fn idle(&mut self, clock: impl FnOnce() -> Instant) -> Wait {
        if self.spin(clock) {
            self.spins = self.spins.wrapping_add(1);
            if self.spins % YIELD_EVERY == 0 {
                Wait::Yield
            } else {
                Wait::Poll
            }
        } else {
            match self.judge.as_ref().and_then(Judge::nap) {
                Some(d) => Wait::Nap(d),
                None => Wait::Park,
            }
        }
    }

    /// Whether to spin after this empty poll: within the budget, and not
    /// napping.
    fn spin(&mut self, clock: impl FnOnce() -> Instant) -> bool {
        if self.max.is_zero() || self.judge.as_ref().is_some_and(|j| j.mode() == Mode::Nap) {
            return false;
        }
        match self.idle {
            Idle::No => {
                self.idle = Idle::Spinning {
                    since: clock(),
                    polls: 0,
                };
                !self.budget.is_zero()
            }
            Idle::Spinning { since, polls } => {
                let polls = polls.wrapping_add(1);
                self.idle = Idle::Spinning { since, polls };
                polls % CLOCK_EVERY != 0 || clock().saturating_duration_since(since) < self.budget
            }
            Idle::Parked { .. } => false,
        }
    }

    /// The loop blocks: the spin is over until a poll finds work.
    pub fn parked(&mut self) {
        if let Idle::Spinning { since, .. } = self.idle {
            self.idle = Idle::Parked { since: Some(since) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Whether the decision is to poll again.
    fn spins(w: Wait) -> bool {
        matches!(w, Wait::Poll | Wait::Yield)
    }

    /// Drives `spin` through one idle period of `gap` (spinning while the
    /// policy says so, parking otherwise), then one busy poll, from `t`;
    /// returns whether it parked and the time after the busy poll.
    fn period(spin: &mut Spin, t: Instant, gap: Duration) -> (bool, Instant) {
        let mut now = t;
        let mut parked = false;
        while now < t + gap {
            if !spins(spin.idle(|| now)) {
                spin.parked();
                parked = true;
                now = t + gap;
                break;
            }
            now += Duration::from_nanos(100);
        }
        spin.work(now, 1);
        (parked, now + US)
    }

    /// `n` idle periods of `gap` each; how many parked.
    fn periods(spin: &mut Spin, t: &mut Instant, n: usize, gap: Duration) -> usize {
        let mut parks = 0;
        for _ in 0..n {
            let (parked, next) = period(spin, *t, gap);
            parks += parked as usize;
            *t = next;
        }
        parks
    }

    #[test]
    fn hits_keep_the_budget_short_misses_grow_it_long_ones_shrink_it() {
        let max = 50 * US;
        assert_eq!(next_budget(8 * US, 3 * US, true, max), 8 * US, "hit");
        assert_eq!(
            next_budget(8 * US, 20 * US, false, max),
            16 * US,
            "short miss"
        );
        assert_eq!(next_budget(Duration::ZERO, 9 * US, false, max), US);
        assert_eq!(next_budget(32 * US, 50 * US, false, max), max, "capped");
        assert_eq!(
            next_budget(8 * US, 99 * US, false, max),
            16 * US,
            "a block a little beyond spin_us (the thread's own wake-up in it) still grows"
        );
        assert_eq!(next_budget(max, 101 * US, false, max), 25 * US, "long miss");
        assert_eq!(next_budget(US, 101 * US, false, max), Duration::ZERO);
        let z = Duration::ZERO;
        assert_eq!(next_budget(z, Duration::from_secs(1), false, max), z);
    }

    #[test]
    fn spin_us_zero_never_spins() {
        let mut s = Spin::unjudged(0);
        let t = Instant::now();
        for i in 0..10u32 {
            s.work(t + i * US, 1);
            assert_eq!(
                s.idle(|| panic!("no clock read without spinning")),
                Wait::Park
            );
            s.parked();
        }
        assert_eq!(s.budget(), Duration::ZERO);
    }

    #[test]
    fn a_stream_whose_gaps_the_budget_bridges_never_parks() {
        // 290k frames/s (3.4 us apart) and a window-limited sender waiting
        // 30 us for its ACKs alike: every spin hits.
        for gap in [Duration::from_nanos(3400), 30 * US] {
            let mut s = Spin::unjudged(50);
            let mut t = Instant::now();
            s.work(t, 1);
            assert_eq!(periods(&mut s, &mut t, 1000, gap), 0, "{gap:?}");
            assert_eq!(s.budget(), 50 * US);
        }
    }

    #[test]
    fn an_idle_link_spins_once_then_blocks_at_once() {
        let mut s = Spin::unjudged(50);
        let mut t = Instant::now();
        s.work(t, 1);
        assert!(spins(s.idle(|| t + US)), "spins first");
        let mut polls = 0;
        while spins(s.idle(|| t + 51 * US)) {
            polls += 1;
        }
        assert!(
            polls < CLOCK_EVERY,
            "stops at the first clock read past the budget"
        );
        s.parked();
        assert_eq!(
            s.idle(|| panic!("no clock read while parked")),
            Wait::Park,
            "parked until work"
        );
        t += Duration::from_secs(1);
        s.work(t, 1);
        assert_eq!(s.budget(), 25 * US, "a long block halves the budget");
        // Packets a second apart: 25, 12.5, 6.25, 3.1, 1.6 us, then none.
        let parks = periods(&mut s, &mut t, 10, Duration::from_secs(1));
        assert_eq!((parks, s.budget()), (10, Duration::ZERO));
    }

    #[test]
    fn a_link_slower_than_the_budget_blocks_at_once() {
        // 5k frames/s: 200 us apart, beyond any spin.
        let mut s = Spin::unjudged(50);
        let mut t = Instant::now();
        s.work(t, 1);
        assert_eq!(periods(&mut s, &mut t, 100, 200 * US), 100);
        assert_eq!(s.budget(), Duration::ZERO);
        // At budget 0 the idle period is the block alone: no spin at all.
        s.work(t, 1);
        assert_eq!(s.idle(|| t), Wait::Park);
    }

    #[test]
    fn short_blocks_grow_the_budget_back_until_spins_hit() {
        let mut s = Spin::unjudged(50);
        let mut t = Instant::now();
        s.work(t, 1);
        periods(&mut s, &mut t, 20, Duration::from_secs(1));
        assert_eq!(s.budget(), Duration::ZERO);
        // Packets 10 us apart again: blocks return within 50 us, the budget
        // doubles (1, 2, 4, 8, 16 us) and the spins catch them from then on.
        assert_eq!(periods(&mut s, &mut t, 5, 10 * US), 5);
        assert_eq!(s.budget(), 16 * US);
        assert_eq!(periods(&mut s, &mut t, 100, 10 * US), 0);
        assert_eq!(s.budget(), 16 * US, "hits keep it");
    }

    #[test]
    fn every_eighth_spin_yields_counted_across_idle_periods() {
        // Idle periods of 3 spins each: the yield cadence runs on.
        let mut s = Spin::unjudged(50);
        let t = Instant::now();
        s.work(t, 1);
        let mut waits = vec![];
        for _ in 0..8 {
            for _ in 0..3 {
                waits.push(s.idle(|| t));
            }
            s.work(t, 1);
        }
        for (i, w) in waits.iter().enumerate() {
            let want = if (i + 1) % YIELD_EVERY as usize == 0 {
                Wait::Yield
            } else {
                Wait::Poll
            };
            assert_eq!(*w, want, "spin {i}");
        }
    }

    #[test]
    fn a_judged_paced_sender_naps_without_spinning_or_a_clock_read() {
        for (room, napping) in [(64, true), (0, false)] {
            let mut s = Spin::new(50, room);
            let mut t = Instant::now();
            // 290k frames/s, a poll's work every 100 us, past the first
            // hold and trial (about 32 ms).
            for _ in 0..500 {
                t += 100 * US;
                s.work(t, 29);
            }
            let w = s.idle(|| panic!("no clock read while napping"));
            if napping {
                assert!(matches!(w, Wait::Nap(d) if d > 10 * US), "{w:?}");
            } else {
                assert_eq!(w, Wait::Park, "no room: no nap");
            }
        }
    }
}
