//! Whether spinning pays: judged by the frame rate it brings.
//!
//! The spin budget (`spin.rs`) keeps spinning while packets come within it.
//! That is right for a sender that waits for the host: surf's engine keeps
//! 4 messages un-ACKed, so the host's wake-up latency after each ACK is
//! the stream's pace (the demo: about 175k frames/s spinning, 50-60k
//! parking). It is wrong for a paced sender whose bursts come 20 us apart
//! (a NIC's interrupt coalescing at 10 GbE): the gaps are as short as the
//! window-limited sender's round trip, every spin "hits", and the thread
//! spins a whole core away (99% at 290k frames/s) for a rate that parking
//! reaches at 45%. Gap lengths cannot tell the two apart; whether the rate
//! depends on the thread's latency can.
//!
//! So the thread holds a mode (spin, as the budget allows, or park at
//! once) and now and then runs a trial: [`PHASE`] in the held mode, one in
//! the other, one in the held mode again (the two held phases average out
//! a rate that drifts). Parking is chosen when its frame rate is at least
//! [`PARK_KEEPS`] of spinning's, spinning otherwise. A trial that confirms
//! the held mode multiplies the hold before the next one by [`GROWTH`], up
//! to [`HOLD_MAX`] (then 0.4% of the time is spent in the other mode); one that switches it
//! starts again from [`HOLD_MIN`], so a wrong switch is undone quickly. A
//! trial whose phase spans an idle stretch, or sees too few frames to
//! judge, is void (the held mode stays).
//!
//! Earlier, a judge that compared the gaps after short probes (16 idle
//! periods) misjudged the window-limited sender now and then: a window's
//! worth of frames queued while it slept made a parked gap look cheap. A
//! frame rate over milliseconds has no such blind spot.

use std::time::{Duration, Instant};

/// One phase of a trial.
pub(super) const PHASE: Duration = Duration::from_millis(4);
/// The hold before the first trial and after a switch.
pub(super) const HOLD_MIN: Duration = Duration::from_millis(20);
/// A trial that confirms the held mode multiplies the hold by this.
const GROWTH: u32 = 4;
/// The longest hold between trials.
pub(super) const HOLD_MAX: Duration = Duration::from_secs(1);
/// Parking is chosen when its frame rate is at least this share of
/// spinning's.
pub(super) const PARK_KEEPS: f64 = 0.97;
/// A phase with fewer frames does not count (the trial is void).
const MIN_FRAMES: u64 = 32;
/// A phase that lasted more than this many [`PHASE`]s spanned an idle
/// stretch (phases end at the first work after [`PHASE`]): the trial is void.
const STRETCH: u32 = 4;

/// How the receive thread waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Spin while the budget allows, then park.
    Spin,
    /// Park at once.
    Park,
}

impl Mode {
    fn other(self) -> Mode {
        match self {
            Mode::Spin => Mode::Park,
            Mode::Park => Mode::Spin,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    /// No work seen yet.
    Start,
    /// The held mode until `until`.
    Hold { until: Instant },
    /// Phase `n` of a trial (0 and 2 in the held mode, 1 in the other),
    /// since `start`, with `frames` so far; `rates` of the phases done.
    Trial {
        n: usize,
        start: Instant,
        frames: u64,
        rates: [f64; 3],
    },
}

/// The judge: [`Judge::work`] after each poll that found work, with the
/// frames it completed; [`Judge::mode`] for how to wait now.
#[derive(Debug)]
pub(super) struct Judge {
    held: Mode,
    hold: Duration,
    stage: Stage,
}

impl Judge {
    /// Holding spin (the demanding case: a window-limited sender) until the
    /// first trial.
    pub fn new() -> Judge {
        Judge {
            held: Mode::Spin,
            hold: HOLD_MIN,
            stage: Stage::Start,
        }
    }

    /// How the thread waits now.
    pub fn mode(&self) -> Mode {
        match self.stage {
            Stage::Trial { n: 1, .. } => self.held.other(),
            _ => self.held,
        }
    }

    /// A poll at `now` found work and completed `frames` frames.
    pub fn work(&mut self, now: Instant, frames: u64) {
        match &mut self.stage {
            Stage::Start => {
                self.stage = Stage::Hold {
                    until: now + self.hold,
                }
            }
            Stage::Hold { until } => {
                if now >= *until {
                    self.stage = Stage::Trial {
                        n: 0,
                        start: now,
                        frames: 0,
                        rates: [0.0; 3],
                    };
                }
            }
            Stage::Trial {
                n,
                start,
                frames: seen,
                rates,
            } => {
                *seen += frames;
                let took = now.saturating_duration_since(*start);
                if took < PHASE {
                    return;
                }
                if took > PHASE * STRETCH || *seen < MIN_FRAMES {
                    log::debug!(
                        "spin judge: trial void ({} frames in {took:?}); holding {:?}",
                        seen,
                        self.held
                    );
                    self.stage = Stage::Hold {
                        until: now + self.hold,
                    };
                    return;
                }
                rates[*n] = *seen as f64 / took.as_secs_f64();
                if *n < 2 {
                    *n += 1;
                    *start = now;
                    *seen = 0;
                    return;
                }
                let held = (rates[0] + rates[2]) / 2.0;
                let (spin, park) = match self.held {
                    Mode::Spin => (held, rates[1]),
                    Mode::Park => (rates[1], held),
                };
                let chosen = if park >= spin * PARK_KEEPS {
                    Mode::Park
                } else {
                    Mode::Spin
                };
                if chosen == self.held {
                    self.hold = (self.hold * GROWTH).min(HOLD_MAX);
                } else {
                    log::debug!(
                        "spin judge: {chosen:?} (frames/s spinning {spin:.0}, parking {park:.0})"
                    );
                    self.held = chosen;
                    self.hold = HOLD_MIN;
                }
                self.stage = Stage::Hold {
                    until: now + self.hold,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Drives a judge for `secs` simulated seconds against a sender whose
    /// frame rate (frames/s) in each mode is `rate(mode)`, one work call
    /// every 100 us; returns the share of the time spent in each mode
    /// (spin, park) and the judge.
    fn drive(
        judge: &mut Judge,
        t: &mut Instant,
        secs: f64,
        rate: impl Fn(Mode) -> f64,
    ) -> (f64, f64) {
        let step = Duration::from_micros(100);
        let steps = (secs / step.as_secs_f64()) as usize;
        let mut spin = 0usize;
        let mut owed = 0.0f64;
        for _ in 0..steps {
            let mode = judge.mode();
            spin += (mode == Mode::Spin) as usize;
            owed += rate(mode) * step.as_secs_f64();
            *t += step;
            let frames = owed.floor();
            owed -= frames;
            judge.work(*t, frames as u64);
        }
        let s = spin as f64 / steps as f64;
        (s, 1.0 - s)
    }

    /// surf's window: the rate follows the thread's latency.
    fn window_limited(m: Mode) -> f64 {
        match m {
            Mode::Spin => 175_000.0,
            Mode::Park => 55_000.0,
        }
    }

    /// Paced at 290k frames/s: the rate is the sender's.
    fn paced(_: Mode) -> f64 {
        290_000.0
    }

    #[test]
    fn a_window_limited_sender_keeps_the_spin_and_is_probed_rarely() {
        let mut j = Judge::new();
        let mut t = Instant::now();
        let (spin, park) = drive(&mut j, &mut t, 10.0, window_limited);
        assert_eq!(j.mode(), Mode::Spin);
        assert_eq!(j.held, Mode::Spin);
        assert_eq!(j.hold, HOLD_MAX, "each confirming trial grows the hold");
        // Parking probes: 4 ms after 20, 80, 320 ms holds, then one a
        // second: about 12 probes in 10 s.
        assert!(park < 0.01, "parked {:.2}% of the time", park * 100.0);
        assert!(spin > 0.99);
    }

    #[test]
    fn a_paced_sender_parks_after_the_first_trial() {
        let mut j = Judge::new();
        let mut t = Instant::now();
        // The first hold and trial: spinning until about 32 ms.
        drive(&mut j, &mut t, 0.040, paced);
        assert_eq!(j.held, Mode::Park, "parking reaches the same rate");
        let (spin, _) = drive(&mut j, &mut t, 10.0, paced);
        assert_eq!(j.held, Mode::Park);
        assert!(spin < 0.01, "spun {:.2}% of the time", spin * 100.0);
    }

    #[test]
    fn a_rate_that_parking_loses_only_a_little_of_still_parks_and_more_spins() {
        for (keeps, want) in [(0.98, Mode::Park), (0.95, Mode::Spin)] {
            let mut j = Judge::new();
            let mut t = Instant::now();
            drive(&mut j, &mut t, 1.0, |m| match m {
                Mode::Spin => 300_000.0,
                Mode::Park => 300_000.0 * keeps,
            });
            assert_eq!(j.held, want, "parking keeps {keeps}");
        }
    }

    #[test]
    fn a_sender_that_turns_window_limited_gets_the_spin_back_within_a_hold() {
        let mut j = Judge::new();
        let mut t = Instant::now();
        drive(&mut j, &mut t, 5.0, paced);
        assert_eq!((j.held, j.hold), (Mode::Park, HOLD_MAX));
        // At most one full hold, then a trial (3 phases).
        let mut took = Duration::ZERO;
        while j.held == Mode::Park {
            drive(&mut j, &mut t, 0.001, window_limited);
            took += MS;
            assert!(took <= HOLD_MAX + 4 * PHASE, "still parking after {took:?}");
        }
        assert_eq!(j.hold, HOLD_MIN, "a switch starts the holds again");
    }

    #[test]
    fn a_trial_across_an_idle_stretch_or_with_too_few_frames_is_void() {
        let mut j = Judge::new();
        let mut t = Instant::now();
        j.work(t, 1);
        t += HOLD_MIN;
        j.work(t, 1); // the trial starts
        t += MS;
        j.work(t, 100);
        t += Duration::from_millis(100); // idle: the phase ends late
        j.work(t, 100);
        assert!(matches!(j.stage, Stage::Hold { .. }), "{:?}", j.stage);
        assert_eq!((j.held, j.hold), (Mode::Spin, HOLD_MIN), "nothing judged");
        // A slow link: 10 frames per phase.
        t += HOLD_MIN;
        j.work(t, 1);
        t += PHASE;
        j.work(t, 10);
        assert!(matches!(j.stage, Stage::Hold { .. }), "{:?}", j.stage);
        assert_eq!(j.held, Mode::Spin);
    }

    #[test]
    fn the_middle_phase_runs_the_other_mode() {
        let mut j = Judge::new();
        let mut t = Instant::now();
        j.work(t, 1);
        t += HOLD_MIN;
        j.work(t, 1);
        let mut modes = vec![];
        for _ in 0..3 {
            modes.push(j.mode());
            t += PHASE;
            j.work(t, 1000);
        }
        assert_eq!(modes, [Mode::Spin, Mode::Park, Mode::Spin]);
        assert!(matches!(j.stage, Stage::Hold { .. }));
    }
}
