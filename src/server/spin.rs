//! Adaptive spinning: how long the receive thread busy-polls an empty
//! completion queue before it arms and blocks.
//!
//! A spin saves a park (arm, block, wake-up: microseconds of CPU and of
//! latency) when the next packet comes soon; it wastes the spin when it does
//! not. The policy compares each idle period (`wait`: the spin, plus the block
//! if the spin missed) with the work it ended with (`busy`: the polls that
//! found packets or completions until the next empty one):
//!
//! - `wait <= busy`: the link keeps the thread at least half busy, where a
//!   park's cost comes out of the thread's capacity: the budget doubles
//!   (from 1 us, up to `spin_us`);
//! - `wait > busy`: the thread has time to spare and a spin costs more CPU
//!   than the work it waits for (a paced or slow link, an idle one): the
//!   budget halves, and below 1 us it is 0: block at once.
//!
//! So a saturated link is polled without parking, a slow or idle link blocks
//! after a few idle periods, and a block whose backlog takes longer to work
//! off than the block lasted turns spinning back on. Spinning checks the
//! clock every [`CLOCK_EVERY`] polls; the busy side reuses the clock read the
//! loop makes anyway (`note_activity`). `spin_us` 0 never spins and tracks
//! nothing.

use std::time::{Duration, Instant};

/// The smallest budget worth spinning; a smaller one blocks at once.
const MIN_SPIN: Duration = Duration::from_micros(1);

/// Empty polls between clock reads while spinning.
const CLOCK_EVERY: u32 = 4;

/// The budget after an idle period of `wait` that ended with `busy` of work,
/// from `budget` (the one used), at most `max`.
pub(super) fn next_budget(
    budget: Duration,
    wait: Duration,
    busy: Duration,
    max: Duration,
) -> Duration {
    if wait <= busy {
        (budget * 2).max(MIN_SPIN).min(max)
    } else if budget / 2 < MIN_SPIN {
        Duration::ZERO
    } else {
        budget / 2
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Working since `start` (None: not measured), after an idle period of `wait`.
    Busy {
        start: Option<Instant>,
        wait: Duration,
    },
    /// Idle since `since`, spinning; `polls` empty polls so far.
    Spinning { since: Instant, polls: u32 },
    /// Idle since `since` (None: not measured), the spin over: park.
    Parked { since: Option<Instant> },
}

/// The receive loop's spin state: [`Spin::work`] after each poll that found
/// work, [`Spin::idle`] after each empty one (true: poll again), and
/// [`Spin::parked`] when it blocks.
#[derive(Debug)]
pub(super) struct Spin {
    max: Duration,
    budget: Duration,
    phase: Phase,
}

impl Spin {
    /// Spinning at most `spin_us` microseconds (0: never), starting at the
    /// full budget.
    pub fn new(spin_us: u32) -> Spin {
        let max = Duration::from_micros(spin_us as u64);
        Spin {
            max,
            budget: max,
            phase: Phase::Parked { since: None },
        }
    }

    /// The budget the next idle period spins for.
    #[cfg(test)]
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// A poll found work at `now`.
    pub fn work(&mut self, now: Instant) {
        let since = match self.phase {
            Phase::Busy { .. } => return,
            Phase::Spinning { since, .. } => Some(since),
            Phase::Parked { since } => since,
        };
        self.phase = Phase::Busy {
            start: since.map(|_| now),
            wait: since.map_or(Duration::MAX, |s| now.saturating_duration_since(s)),
        };
    }

    /// A poll found nothing: true to poll again (spin), false to park.
    /// `clock` is read at the first empty poll and every few after it.
    pub fn idle(&mut self, clock: impl FnOnce() -> Instant) -> bool {
        if self.max.is_zero() {
            return false;
        }
        match self.phase {
            Phase::Busy { start, wait } => {
                let now = clock();
                if let Some(start) = start {
                    let busy = now.saturating_duration_since(start);
                    self.budget = next_budget(self.budget, wait, busy, self.max);
                }
                self.phase = Phase::Spinning {
                    since: now,
                    polls: 0,
                };
                !self.budget.is_zero()
            }
            Phase::Spinning { since, polls } => {
                let polls = polls.wrapping_add(1);
                self.phase = Phase::Spinning { since, polls };
                polls % CLOCK_EVERY != 0 || clock().saturating_duration_since(since) < self.budget
            }
            Phase::Parked { .. } => false,
        }
    }

    /// The loop blocks (the spin is over until a poll finds work).
    pub fn parked(&mut self) {
        if let Phase::Spinning { since, .. } = self.phase {
            self.phase = Phase::Parked { since: Some(since) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Drives `spin` through one idle period of `wait` (spinning while the
    /// policy says so, parking otherwise) and a busy stretch of `busy`, from
    /// `t`; returns whether it parked and the time after the busy stretch.
    fn period(spin: &mut Spin, t: Instant, wait: Duration, busy: Duration) -> (bool, Instant) {
        let mut now = t;
        let step = Duration::from_nanos(100);
        let mut parked = false;
        while now < t + wait {
            if !spin.idle(|| now) {
                spin.parked();
                parked = true;
                now = t + wait;
                break;
            }
            now += step;
        }
        spin.work(now);
        (parked, now + busy)
    }

    #[test]
    fn the_budget_doubles_while_waits_are_shorter_than_the_work() {
        let max = 50 * US;
        assert_eq!(next_budget(Duration::ZERO, 2 * US, 3 * US, max), US);
        assert_eq!(next_budget(US, 2 * US, 2 * US, max), 2 * US);
        assert_eq!(
            next_budget(32 * US, Duration::ZERO, 3 * US, max),
            max,
            "capped"
        );
        assert_eq!(next_budget(max, US, 3 * US, max), max);
    }

    #[test]
    fn the_budget_halves_to_zero_while_waits_are_longer_than_the_work() {
        let max = 50 * US;
        assert_eq!(next_budget(max, 3 * US, 2 * US, max), 25 * US);
        assert_eq!(next_budget(2 * US, 3 * US, 2 * US, max), US);
        assert_eq!(next_budget(US, 3 * US, 2 * US, max), Duration::ZERO);
        assert_eq!(
            next_budget(Duration::ZERO, 3 * US, 2 * US, max),
            Duration::ZERO
        );
    }

    #[test]
    fn spin_us_zero_never_spins() {
        let mut s = Spin::new(0);
        let t = Instant::now();
        for i in 0..10u32 {
            s.work(t + i * US);
            assert!(!s.idle(|| panic!("no clock read without spinning")));
            s.parked();
        }
    }

    #[test]
    fn a_saturated_link_spins_at_the_full_budget() {
        // Packets every 0.5 us, each taking 1 us of work: every spin hits.
        let mut s = Spin::new(50);
        let mut t = Instant::now();
        s.work(t);
        for _ in 0..100 {
            let (parked, next) = period(&mut s, t, US / 2, US);
            assert!(!parked);
            t = next;
        }
        assert_eq!(s.budget(), 50 * US);
    }

    #[test]
    fn a_paced_link_backs_off_to_blocking_and_stays_there() {
        // 290k frames/s: 3.4 us apart, 1.5 us of work each. The spins catch
        // every packet, but each costs more than the work: block at once.
        let mut s = Spin::new(50);
        let mut t = Instant::now();
        s.work(t);
        let mut parks = Vec::new();
        for _ in 0..40 {
            let wait = Duration::from_nanos(1900);
            let (parked, next) = period(&mut s, t, wait, Duration::from_nanos(1500));
            parks.push(parked);
            t = next;
        }
        assert_eq!(s.budget(), Duration::ZERO);
        assert!(parks[..3].iter().all(|p| !p), "spins first: {parks:?}");
        assert!(parks[10..].iter().all(|p| *p), "then blocks: {parks:?}");
    }

    #[test]
    fn an_idle_link_blocks_after_one_spin() {
        let mut s = Spin::new(50);
        let t = Instant::now();
        s.work(t);
        assert!(s.idle(|| t + US), "spins first");
        let mut polls = 0;
        while s.idle(|| t + 51 * US) {
            polls += 1;
        }
        assert!(
            polls < CLOCK_EVERY,
            "stops at the first clock read past the budget"
        );
        s.parked();
        assert!(
            !s.idle(|| panic!("no clock read while parked")),
            "parked until work"
        );
        // The next packet after a long block: the budget halves.
        s.work(t + Duration::from_secs(1));
        assert!(s.idle(|| t + Duration::from_secs(1) + US));
        assert_eq!(s.budget(), 25 * US);
    }

    #[test]
    fn a_backlog_after_a_block_turns_spinning_back_on() {
        let mut s = Spin::new(50);
        let mut t = Instant::now();
        s.work(t);
        // Slow: back to blocking.
        for _ in 0..10 {
            t = period(&mut s, t, 100 * US, US).1;
        }
        assert_eq!(s.budget(), Duration::ZERO);
        // Fast again: each block (10 us) leaves a backlog of 20 us of work.
        let mut parks = 0;
        for _ in 0..10 {
            let (parked, next) = period(&mut s, t, 10 * US, 20 * US);
            parks += parked as u32;
            t = next;
        }
        assert!(s.budget() >= 16 * US, "{:?}", s.budget());
        assert!(parks < 10);
    }
}
