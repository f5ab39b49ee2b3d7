//! Adaptive spinning: how long the receive thread busy-polls an empty
//! completion queue before it arms and blocks.
//!
//! A spin saves a park (arm, block, wake-up: microseconds of CPU and of
//! latency, and on a window-limited sender a slower stream, as each side then
//! waits for the other's wake-up) when the next packet comes soon; it wastes
//! the spin when it does not. [`Budget`] judges each idle period (`wait`: the
//! spin, plus the block if the spin missed) against the work it ended with
//! (`busy`: the polls that found packets or completions until the next empty
//! one):
//!
//! - `wait <= busy` (a success): the link keeps the thread at least half
//!   busy, where a park's cost comes out of the thread's capacity: spin the
//!   full budget (`spin_us`);
//! - `wait > busy`: the thread has time to spare and the wait cost more than
//!   the work it brought (a paced, slow or idle link): the budget halves, and
//!   below 1 us it is 0: block at once;
//! - while blocking at once, every `probe` parks the full budget is tried
//!   again (blocking can itself hold the stream back: a sender that waits
//!   for ACKs slows down while its receiver sleeps). A probe without a
//!   success doubles the interval (16 parks up to 1024); a success resets it.
//!
//! So a saturated or window-limited stream is polled without parking, a slow
//! or idle link blocks after a few idle periods and spins only in rare,
//! short probes. Spinning checks the clock every [`CLOCK_EVERY`] polls; the
//! busy side reuses the clock read the loop makes anyway (`note_activity`).
//! `spin_us` 0 never spins and tracks nothing.

use std::time::{Duration, Instant};

/// The smallest budget worth spinning; a smaller one blocks at once.
const MIN_SPIN: Duration = Duration::from_micros(1);

/// Empty polls between clock reads while spinning.
const CLOCK_EVERY: u32 = 4;

/// Parks between probes, first and at most.
const PROBE_MIN: u32 = 16;
const PROBE_MAX: u32 = 1024;

/// The spin budget and its rules, pure (no clock): see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Budget {
    max: Duration,
    budget: Duration,
    /// Parks at budget 0 between probes.
    probe: u32,
    /// Parks at budget 0 since the last probe.
    parks: u32,
    /// A success since the budget last fell to 0.
    won: bool,
    /// A probe starts: the period that ends next is the block before it,
    /// not judged.
    probing: bool,
}

impl Budget {
    /// At most `max`, starting there.
    pub fn new(max: Duration) -> Budget {
        Budget {
            max,
            budget: max,
            probe: PROBE_MIN,
            parks: 0,
            won: true,
            probing: false,
        }
    }

    /// How long the next idle period spins (0: block at once).
    pub fn get(&self) -> Duration {
        self.budget
    }

    /// An idle period of `wait` ended with `busy` of work.
    pub fn period(&mut self, wait: Duration, busy: Duration) {
        if std::mem::replace(&mut self.probing, false) {
            return;
        }
        if wait <= busy {
            self.budget = self.max;
            self.won = true;
            self.probe = PROBE_MIN;
        } else if self.budget / 2 >= MIN_SPIN {
            self.budget /= 2;
        } else if !self.budget.is_zero() {
            self.budget = Duration::ZERO;
            self.parks = 0;
            if !std::mem::replace(&mut self.won, false) {
                self.probe = (self.probe * 2).min(PROBE_MAX);
            }
        }
    }

    /// The loop parked; at budget 0, every `probe` parks a probe.
    pub fn parked(&mut self) {
        if self.budget.is_zero() {
            self.parks += 1;
            if self.parks >= self.probe {
                self.budget = self.max;
                self.probing = true;
            }
        }
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
    budget: Budget,
    phase: Phase,
}

impl Spin {
    /// Spinning at most `spin_us` microseconds (0: never), starting at the
    /// full budget.
    pub fn new(spin_us: u32) -> Spin {
        Spin {
            budget: Budget::new(Duration::from_micros(spin_us as u64)),
            phase: Phase::Parked { since: None },
        }
    }

    /// The budget the next idle period spins for.
    #[cfg(test)]
    pub fn budget(&self) -> Duration {
        self.budget.get()
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
        if self.budget.max.is_zero() {
            return false;
        }
        match self.phase {
            Phase::Busy { start, wait } => {
                let now = clock();
                if let Some(start) = start {
                    self.budget
                        .period(wait, now.saturating_duration_since(start));
                }
                self.phase = Phase::Spinning {
                    since: now,
                    polls: 0,
                };
                !self.budget.get().is_zero()
            }
            Phase::Spinning { since, polls } => {
                let polls = polls.wrapping_add(1);
                self.phase = Phase::Spinning { since, polls };
                polls % CLOCK_EVERY != 0
                    || clock().saturating_duration_since(since) < self.budget.get()
            }
            Phase::Parked { .. } => false,
        }
    }

    /// The loop blocks (the spin is over until a poll finds work).
    pub fn parked(&mut self) {
        if let Phase::Spinning { since, .. } = self.phase {
            self.phase = Phase::Parked { since: Some(since) };
        }
        self.budget.parked();
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
    fn a_success_restores_the_full_budget() {
        let mut b = Budget::new(50 * US);
        b.period(3 * US, 2 * US);
        assert_eq!(b.get(), 25 * US);
        b.period(2 * US, 2 * US);
        assert_eq!(b.get(), 50 * US, "wait <= busy");
    }

    #[test]
    fn failures_halve_the_budget_down_to_blocking() {
        let mut b = Budget::new(8 * US);
        for want in [4, 2, 1, 0, 0] {
            b.period(3 * US, 2 * US);
            assert_eq!(b.get(), want * US);
        }
        assert_eq!(Budget::new(Duration::ZERO).get(), Duration::ZERO);
    }

    #[test]
    fn blocking_probes_the_full_budget_ever_more_rarely_until_a_success() {
        let mut b = Budget::new(2 * US);
        let fail = |b: &mut Budget| {
            while !b.get().is_zero() {
                b.period(3 * US, 2 * US);
            }
        };
        fail(&mut b);
        // Parks until the probe: 16 after a success, then 32, 64, ... 1024.
        for interval in [16, 32, 64, 128, 256, 512, 1024, 1024] {
            for _ in 1..interval {
                b.parked();
                b.period(100 * US, US);
                assert!(b.get().is_zero());
            }
            b.parked();
            assert_eq!(b.get(), 2 * US, "probe after {interval} parks");
            b.period(100 * US, US); // the block before the probe: not judged
            assert_eq!(b.get(), 2 * US);
            fail(&mut b);
        }
        // A probe that succeeds keeps spinning, and resets the interval.
        for _ in 0..1024 {
            b.parked();
        }
        b.period(100 * US, US);
        b.period(US, 2 * US);
        assert_eq!(b.get(), 2 * US);
        fail(&mut b);
        for _ in 0..16 {
            b.parked();
        }
        assert_eq!(b.get(), 2 * US);
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
    fn a_paced_link_backs_off_to_blocking_with_rare_probes() {
        // 290k frames/s: 3.4 us apart, 1.5 us of work each. The spins catch
        // every packet, but each costs more than the work: block at once,
        // spinning only in probes, ever more rarely.
        let mut s = Spin::new(50);
        let mut t = Instant::now();
        s.work(t);
        let mut parks = Vec::new();
        for _ in 0..3000 {
            let wait = Duration::from_nanos(1900);
            let (parked, next) = period(&mut s, t, wait, Duration::from_nanos(1500));
            parks.push(parked);
            t = next;
        }
        assert!(parks[..3].iter().all(|p| !p), "spins first");
        let spun = parks[1000..].iter().filter(|p| !**p).count();
        assert!(spun <= 2000 / 100, "{spun} of 2000 periods spun");
    }

    #[test]
    fn a_stream_that_flows_only_while_spinning_is_found_again_by_a_probe() {
        // A window-limited sender: while the receiver spins, packets follow
        // within 0.5 us and keep it busy 2 us; while it blocks, the sender
        // waits for late ACKs (27 us idle, 1 us of work).
        let mut s = Spin::new(50);
        let mut t = Instant::now();
        s.work(t);
        // A hiccup drops the budget to 0.
        for _ in 0..8 {
            t = period(&mut s, t, 200 * US, US).1;
        }
        assert_eq!(s.budget(), Duration::ZERO);
        let mut tail = Vec::new();
        for i in 0..200 {
            let spinning = !s.budget().is_zero();
            let (wait, busy) = if spinning {
                (US / 2, 2 * US)
            } else {
                (27 * US, US)
            };
            let (parked, next) = period(&mut s, t, wait, busy);
            if i >= 100 {
                tail.push(parked);
            }
            t = next;
        }
        assert!(tail.iter().all(|p| !p), "spinning again: {tail:?}");
        assert_eq!(s.budget(), 50 * US);
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
