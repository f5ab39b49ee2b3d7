//! Whether the receive thread, when idle, spins or naps: judged by the
//! frame rate each brings. [`Judge::work`] records each poll's work into
//! the trial under way ([`Trial::record`]) and a pure choice
//! ([`choose`]) judges a finished one.
//!
//! The spin budget (`spin.rs`) keeps spinning while packets come within it.
//! That is right for a sender that waits for the host: surf's engine keeps
//! 4 messages un-ACKed, so the host's latency after each ACK sets the
//! stream's pace (the demo runs several times faster spinning than parking:
//! docs/performance.md, the surf rows). It is wrong for a paced sender whose bursts come
//! 20 us apart (a NIC's interrupt coalescing at 10 GbE): the gaps are as
//! short as the window-limited sender's round trip, every spin "hits", and
//! the thread spins a whole core away for a rate it reaches without. Gap
//! lengths cannot tell the two apart; whether the rate depends on the
//! thread's latency can.
//!
//! Such a paced sender is best served by napping, as a NIC's interrupt
//! moderation does: after the socket is drained the thread sleeps a little
//! ([`Judge::nap`]: what the sender sends meanwhile, at the highest rate
//! measured, must fit a quarter of the slots and of the socket's buffer; at
//! most [`NAP_MAX`]), then takes what came in one batch, and parks only when
//! the nap found nothing. One wake-up per nap instead of one per burst, so
//! a fraction of the CPU that parking at once or spinning costs
//! (docs/performance.md, the paced rows).
//!
//! So the thread holds a mode (spin as the budget allows, or nap) and now
//! and then runs a trial of three legs of [`LEG`]: one in the held mode, one
//! in the other, one in the held mode again (the two held legs average out
//! a rate that drifts). Napping is chosen when its frame rate is at least
//! [`NAP_KEEPS`] of spinning's, spinning otherwise. A trial that confirms
//! the held mode multiplies the hold before the next one by [`GROWTH`], up
//! to [`HOLD_MAX`] (then 0.4% of the time is spent in the other mode); one
//! that switches it starts again from [`HOLD_MIN`], so a wrong switch is
//! undone quickly. A trial with a leg that spans an idle stretch or sees
//! too few frames to judge, or whose two held legs disagree by more than
//! [`STEADY`] (a stream starting up, a stalling consumer) is void: the held
//! mode stays. `spin_us` 0 neither spins nor naps: it parks at once, as
//! documented.
//!
//! Earlier, a judge that compared the gaps after short probes (16 idle
//! periods) misjudged the window-limited sender now and then: a window's
//! worth of frames queued while it slept made a parked gap look cheap. A
//! frame rate over milliseconds has no such blind spot.

use std::fmt;
use std::time::{Duration, Instant};

/// One leg of a trial.
const LEG: Duration = Duration::from_millis(4);
/// The hold before the first trial and after a switch.
const HOLD_MIN: Duration = Duration::from_millis(20);
/// A trial that confirms the held mode multiplies the hold by this.
const GROWTH: u32 = 4;
/// The longest hold between trials.
const HOLD_MAX: Duration = Duration::from_secs(1);
/// Napping is chosen when its frame rate is at least this share of
/// spinning's.
const NAP_KEEPS: f64 = 0.97;
/// The longest nap.
const NAP_MAX: Duration = Duration::from_micros(200);
/// A shorter nap is not worth its timer: park at once.
const NAP_MIN: Duration = Duration::from_micros(10);
/// A trial whose held legs differ by more than this share of the higher
/// one is void: the rate moved under it.
const STEADY: f64 = 0.1;
/// A leg with fewer frames does not count (the trial is void).
const MIN_FRAMES: u64 = 32;
/// A leg that lasted more than this many [`LEG`]s spanned an idle stretch
/// (legs end at the first work after [`LEG`]): the trial is void.
const STRETCH: u32 = 4;

/// Frames a nap may let arrive: a quarter of the slots (the rest absorb a
/// sender that speeds up before the next trial), and a quarter of what the
/// transport's buffer holds of full-size frames (its figure counts kernel
/// overhead too).
pub(super) fn nap_room(slots: u64, slot_size: u32, queue_bytes: Option<u64>) -> u64 {
    let by_slots = slots / 4;
    match queue_bytes {
        Some(b) => by_slots.min(b / 4 / slot_size.max(1) as u64),
        None => by_slots,
    }
}

/// How the receive thread waits for work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Spin while the budget allows, then park.
    Spin,
    /// Nap (sleep a little, then take what came) and park when the nap
    /// found nothing.
    Nap,
}

impl Mode {
    fn other(self) -> Mode {
        match self {
            Mode::Spin => Mode::Nap,
            Mode::Nap => Mode::Spin,
        }
    }
}

/// A trial under way: leg `n` (0 and 2 in the held mode, 1 in the other),
/// since `start`, with `frames` so far; `rates` of the legs done.
#[derive(Debug, Clone, Copy)]
struct Trial {
    n: usize,
    start: Instant,
    frames: u64,
    rates: [f64; 3],
}

/// What a poll's work did to the trial under way.
#[derive(Debug)]
enum Recorded {
    /// The trial goes on.
    Running,
    /// The trial is void: nothing is judged.
    Void(Void),
    /// The trial is done: each leg's frame rate.
    Done([f64; 3]),
}

/// Why a trial is void.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Void {
    /// A leg spanned an idle stretch, or saw too few frames to judge.
    Leg { frames: u64, took: Duration },
    /// The held mode's two legs disagree: the rate moved (a stream
    /// starting, a consumer stalling) more than any difference the trial
    /// could tell.
    Moved { first: f64, last: f64 },
}

impl fmt::Display for Void {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Void::Leg { frames, took } => write!(f, "{frames} frames in {took:?}"),
            Void::Moved { first, last } => {
                write!(f, "the held legs: {first:.0} then {last:.0} frames/s")
            }
        }
    }
}

impl Trial {
    fn new(start: Instant) -> Trial {
        Trial {
            n: 0,
            start,
            frames: 0,
            rates: [0.0; 3],
        }
    }

    /// Records `frames` frames completed by a poll at `now`; at the end of a
    /// leg, its rate goes into `peak` (the highest of this trial's legs so
    /// far: what a nap is sized for).
    fn record(&mut self, now: Instant, frames: u64, peak: &mut f64) -> Recorded {
        self.frames += frames;
        let took = now.saturating_duration_since(self.start);
        if took < LEG {
            return Recorded::Running;
        }
        if took > LEG * STRETCH || self.frames < MIN_FRAMES {
            let frames = self.frames;
            return Recorded::Void(Void::Leg { frames, took });
        }
        let rate = self.frames as f64 / took.as_secs_f64();
        self.rates[self.n] = rate;
        *peak = if self.n == 0 { rate } else { peak.max(rate) };
        if self.n == 2 {
            return Recorded::Done(self.rates);
        }
        self.n += 1;
        self.start = now;
        self.frames = 0;
        Recorded::Running
    }
}

/// A trial's verdict: the mode chosen and the rates it was chosen on.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Choice {
    mode: Mode,
    spin: f64,
    nap: f64,
}

/// The mode a finished trial (`rates` of its three legs, the first and last
/// in `held`) chooses, or why it is void.
fn choose(held: Mode, rates: [f64; 3]) -> Result<Choice, Void> {
    let [first, other, last] = rates;
    if (first - last).abs() > first.max(last) * STEADY {
        return Err(Void::Moved { first, last });
    }
    let held_rate = (first + last) / 2.0;
    let (spin, nap) = match held {
        Mode::Spin => (held_rate, other),
        Mode::Nap => (other, held_rate),
    };
    let mode = if nap >= spin * NAP_KEEPS {
        Mode::Nap
    } else {
        Mode::Spin
    };
    Ok(Choice { mode, spin, nap })
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    /// No work seen yet.
    Start,
    /// The held mode until `until`.
    Hold { until: Instant },
    /// A trial.
    Trial(Trial),
}

/// The judge: [`Judge::work`] after each poll that found work, with the
/// frames it completed; [`Judge::mode`] for how to wait now.
#[derive(Debug)]
pub(super) struct Judge {
    held: Mode,
    hold: Duration,
    stage: Stage,
    /// The highest frame rate (frames/s) of the last trial's legs (0:
    /// none yet): what a nap is sized for.
    rate: f64,
    /// The frames a nap may let arrive ([`nap_room`]).
    room: u64,
}

impl Judge {
    /// Holding spin (the demanding case: a window-limited sender) until the
    /// first trial; naps let in at most `room` frames.
    pub fn new(room: u64) -> Judge {
        Judge {
            held: Mode::Spin,
            hold: HOLD_MIN,
            stage: Stage::Start,
            rate: 0.0,
            room,
        }
    }

    /// How long to nap before parking: None to park at once (not napping,
    /// no rate measured yet, or a nap that would be too short). A nap is
    /// sized so that what the sender sends meanwhile, at the highest rate
    /// seen, fits the room (what the posted receives and the transport's
    /// buffers hold with a margin), at most [`NAP_MAX`].
    pub fn nap(&self) -> Option<Duration> {
        if self.mode() != Mode::Nap || self.rate <= 0.0 {
            return None;
        }
        let d = Duration::from_secs_f64(self.room as f64 / self.rate).min(NAP_MAX);
        (d >= NAP_MIN).then_some(d)
    }

    /// How the thread waits now.
    pub fn mode(&self) -> Mode {
        match self.stage {
            Stage::Trial(Trial { n: 1, .. }) => self.held.other(),
            _ => self.held,
        }
    }

    /// The held mode from `now` for the current hold.
    fn hold_from(&mut self, now: Instant) {
        self.stage = Stage::Hold {
            until: now + self.hold,
        };
    }

    /// A poll at `now` found work and completed `frames` frames.
    pub fn work(&mut self, now: Instant, frames: u64) {
        let verdict = match &mut self.stage {
            Stage::Start => {
                self.hold_from(now);
                return;
            }
            Stage::Hold { until } => {
                if now >= *until {
                    self.stage = Stage::Trial(Trial::new(now));
                }
                return;
            }
            Stage::Trial(trial) => match trial.record(now, frames, &mut self.rate) {
                Recorded::Running => return,
                Recorded::Void(why) => Err(why),
                Recorded::Done(rates) => choose(self.held, rates),
            },
        };
        match verdict {
            Err(why) => {
                log::debug!("spin judge: trial void ({why}); holding {:?}", self.held);
            }
            Ok(c) if c.mode == self.held => self.hold = (self.hold * GROWTH).min(HOLD_MAX),
            Ok(c) => {
                log::debug!(
                    "spin judge: {:?} (frames/s spinning {:.0}, napping {:.0})",
                    c.mode,
                    c.spin,
                    c.nap
                );
                self.held = c.mode;
                self.hold = HOLD_MIN;
            }
        }
        self.hold_from(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Drives a judge for `secs` simulated seconds against a sender whose
    /// frame rate (frames/s) in each mode is `rate(mode)`, one work call
    /// every 100 us; returns the share of the time spent in each mode
    /// (spin, nap).
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

    /// A new judge through its first hold, then its first trial's three
    /// legs at `rates` frames/s (whatever the mode).
    fn first_trial(rates: [f64; 3]) -> Judge {
        let mut j = Judge::new(64);
        let mut t = Instant::now();
        drive(&mut j, &mut t, HOLD_MIN.as_secs_f64() + 0.0005, paced);
        for r in rates {
            drive(&mut j, &mut t, LEG.as_secs_f64(), |_| r);
        }
        j
    }

    /// surf's window: the rate follows the thread's latency.
    fn window_limited(m: Mode) -> f64 {
        match m {
            Mode::Spin => 175_000.0,
            Mode::Nap => 55_000.0,
        }
    }

    /// Paced at 290k frames/s: the rate is the sender's.
    fn paced(_: Mode) -> f64 {
        290_000.0
    }

    #[test]
    fn a_window_limited_sender_keeps_the_spin_and_is_probed_rarely() {
        let mut j = Judge::new(64);
        let mut t = Instant::now();
        let (spin, nap) = drive(&mut j, &mut t, 10.0, window_limited);
        assert_eq!(j.mode(), Mode::Spin);
        assert_eq!(j.held, Mode::Spin);
        assert_eq!(j.hold, HOLD_MAX, "each confirming trial grows the hold");
        // Napping probes: 4 ms after 20, 80, 320 ms holds, then one a
        // second: about 12 probes in 10 s.
        assert!(nap < 0.01, "napped {:.2}% of the time", nap * 100.0);
        assert!(spin > 0.99);
    }

    #[test]
    fn a_paced_sender_naps_after_the_first_trial() {
        let mut j = Judge::new(64);
        let mut t = Instant::now();
        // The first hold and trial: spinning until about 32 ms.
        drive(&mut j, &mut t, 0.040, paced);
        assert_eq!(j.held, Mode::Nap, "napping reaches the same rate");
        let (spin, _) = drive(&mut j, &mut t, 10.0, paced);
        assert_eq!(j.held, Mode::Nap);
        assert!(spin < 0.01, "spun {:.2}% of the time", spin * 100.0);
    }

    #[test]
    fn a_rate_that_napping_loses_only_a_little_of_still_naps_and_more_spins() {
        for (keeps, want) in [(0.98, Mode::Nap), (0.95, Mode::Spin)] {
            let mut j = Judge::new(64);
            let mut t = Instant::now();
            drive(&mut j, &mut t, 1.0, |m| match m {
                Mode::Spin => 300_000.0,
                Mode::Nap => 300_000.0 * keeps,
            });
            assert_eq!(j.held, want, "napping keeps {keeps}");
        }
    }

    #[test]
    fn a_sender_that_turns_window_limited_gets_the_spin_back_within_a_hold() {
        let mut j = Judge::new(64);
        let mut t = Instant::now();
        drive(&mut j, &mut t, 5.0, paced);
        assert_eq!((j.held, j.hold), (Mode::Nap, HOLD_MAX));
        // At most one full hold, then a trial (3 legs).
        let mut took = Duration::ZERO;
        while j.held == Mode::Nap {
            drive(&mut j, &mut t, 0.001, window_limited);
            took += MS;
            assert!(took <= HOLD_MAX + 4 * LEG, "still napping after {took:?}");
        }
        assert_eq!(j.hold, HOLD_MIN, "a switch starts the holds again");
    }

    #[test]
    fn a_trial_across_an_idle_stretch_or_with_too_few_frames_is_void() {
        let mut j = Judge::new(64);
        let mut t = Instant::now();
        j.work(t, 1);
        t += HOLD_MIN;
        j.work(t, 1); // the trial starts
        t += MS;
        j.work(t, 100);
        t += Duration::from_millis(100); // idle: the leg ends late
        j.work(t, 100);
        assert!(matches!(j.stage, Stage::Hold { .. }), "{:?}", j.stage);
        assert_eq!((j.held, j.hold), (Mode::Spin, HOLD_MIN), "nothing judged");
        // A slow link: 10 frames per leg.
        t += HOLD_MIN;
        j.work(t, 1);
        t += LEG;
        j.work(t, 10);
        assert!(matches!(j.stage, Stage::Hold { .. }), "{:?}", j.stage);
        assert_eq!(j.held, Mode::Spin);
    }

    #[test]
    fn a_nap_is_sized_to_the_room_at_the_highest_rate_seen() {
        let mut j = Judge::new(64);
        assert_eq!(j.nap(), None, "spinning, and no rate yet");
        let mut t = Instant::now();
        drive(&mut j, &mut t, 0.040, paced);
        assert_eq!(j.held, Mode::Nap);
        // 64 frames at 290k frames/s: 221 us, capped.
        assert_eq!(j.nap(), Some(NAP_MAX));
        let us = |d: Duration| d.as_micros();
        j.room = 29;
        assert_eq!(j.nap().map(us), Some(100), "29 frames: 100 us");
        j.room = 2;
        assert_eq!(j.nap(), None, "7 us: not worth a timer, park");
        // The highest leg of the trial counts.
        let j = first_trial([290_000.0, 580_000.0, 290_000.0]);
        assert!(matches!(j.stage, Stage::Hold { .. }), "{:?}", j.stage);
        assert!(j.rate > 500_000.0, "{}", j.rate);
    }

    #[test]
    fn a_trial_while_the_rate_ramps_is_void() {
        // A stream starting up: 100k, then (napping) 400k, then 800k frames/s
        // spinning. Napping "wins" against the average of the held legs,
        // but the held legs disagree: nothing is judged.
        let j = first_trial([100_000.0, 400_000.0, 800_000.0]);
        assert!(matches!(j.stage, Stage::Hold { .. }), "{:?}", j.stage);
        assert_eq!((j.held, j.hold), (Mode::Spin, HOLD_MIN));
    }

    #[test]
    fn the_middle_leg_runs_the_other_mode() {
        let mut j = Judge::new(64);
        let mut t = Instant::now();
        j.work(t, 1);
        t += HOLD_MIN;
        j.work(t, 1);
        let mut modes = vec![];
        for _ in 0..3 {
            modes.push(j.mode());
            t += LEG;
            j.work(t, 1000);
        }
        assert_eq!(modes, [Mode::Spin, Mode::Nap, Mode::Spin]);
        assert!(matches!(j.stage, Stage::Hold { .. }));
    }

    #[test]
    fn a_nap_lets_in_a_quarter_of_the_slots_or_of_the_socket_buffer() {
        assert_eq!(nap_room(256, 4096, None), 64, "verbs: the slots");
        assert_eq!(nap_room(256, 4096, Some(8 << 20)), 64, "a large buffer");
        // Debian's default rmem_max: 425984 bytes as the kernel keeps it.
        assert_eq!(nap_room(256, 4096, Some(425_984)), 26);
        assert_eq!(nap_room(256, 9000, Some(425_984)), 11);
        assert_eq!(nap_room(3, 4096, None), 0, "too few slots: no nap");
        assert_eq!(nap_room(256, 0, Some(1)), 0);
    }

    #[test]
    fn a_finished_trial_chooses_by_the_rates_or_is_void_when_they_moved() {
        let c = choose(Mode::Spin, [175_000.0, 55_000.0, 175_000.0]).unwrap();
        assert_eq!(c.mode, Mode::Spin, "{c:?}");
        let c = choose(Mode::Nap, [290_000.0, 290_000.0, 290_000.0]).unwrap();
        assert_eq!(c.mode, Mode::Nap, "{c:?}");
        assert_eq!(
            choose(Mode::Spin, [100_000.0, 400_000.0, 800_000.0]),
            Err(Void::Moved {
                first: 100_000.0,
                last: 800_000.0
            })
        );
    }
}
