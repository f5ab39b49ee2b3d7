//! Verdicts on the link drawn from counters over a window: surf's two
//! failure signatures.
//!
//! - *Duplicating peer*: duplicates nearly as many as the frames delivered.
//!   surf's engine, after RNR back-pressure clears, may latch into sending
//!   every SEND twice ("sticky half bandwidth"): the second copy is a
//!   duplicate the host re-ACKs and drops, the link runs at half rate until
//!   the FPGA's TxEn is toggled. A lost ACK makes the sender resend a
//!   window now and then (a few duplicates per timeout); a latched engine
//!   makes one per frame, so the ratio tells them apart.
//! - *RNR storm*: RNR NAKs sent above [`RNR_STORM_PER_S`]. A healthy link
//!   sends none: one is sent only when a message starts and no slot is
//!   posted. A consumer that pauses once makes a short burst: each RNR NAK
//!   holds the sender for min_rnr_timer (12: 0.64 ms, at most about 1560 a
//!   second), so a pause under 64 ms stays below 100 in a second. Above it,
//!   the slots were full for more than a sixteenth of a second at the
//!   recommended timer, or the timer is so short (rogue's C++ default 1:
//!   0.01 ms) that the FPGA retries into a full queue up to 100k times a
//!   second: the storm rogue users met on rxe, which surf's README calls
//!   RNR retry "never proven" for.
//!
//! [`Health`] is pure: fed the totals and a clock, it judges each window
//! of at least [`WINDOW`] and says what changed. The receive thread feeds
//! it, counts and logs (`thread.rs`).

use std::time::{Duration, Instant};

/// The shortest window judged.
pub(crate) const WINDOW: Duration = Duration::from_millis(500);
/// Fewer frames in a window say nothing about duplicating.
pub(crate) const DUP_MIN_FRAMES: u64 = 64;
/// Duplicates per delivered frame that make a duplicating peer (a latched
/// engine: 1 per frame of one packet, more for longer frames).
pub(crate) const DUP_RATIO: f64 = 0.8;
/// Below this many per frame (with [`DUP_MIN_FRAMES`]) the verdict clears.
pub(crate) const DUP_CLEAR: f64 = 0.2;
/// RNR NAKs a second that make a storm (see the module docs).
pub(crate) const RNR_STORM_PER_S: f64 = 100.0;
/// A window below this share of the storm rate clears the verdict.
const RNR_CLEAR: f64 = 0.1;

/// Counter totals at one moment. `None`: the backend cannot count it
/// (verbs without the port counter).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Totals {
    pub frames: u64,
    pub duplicates: Option<u64>,
    pub rnr_naks: Option<u64>,
}

/// A verdict given or cleared by one window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Change {
    /// Duplicates `dups` against `frames` delivered in `secs`.
    Duplicating { dups: u64, frames: u64, secs: f64 },
    /// The duplicating-peer verdict no longer holds.
    DuplicatingCleared,
    /// `naks` RNR NAKs in `secs`.
    Storm { naks: u64, secs: f64 },
    /// The RNR storm is over.
    StormCleared,
}

/// What one window judged (at most one change per verdict).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Judged {
    pub duplicating: Option<Change>,
    pub storm: Option<Change>,
}

/// The verdicts and the window under way.
#[derive(Debug, Default)]
pub(crate) struct Health {
    since: Option<(Instant, Totals)>,
    /// Whether each verdict holds.
    pub duplicating: bool,
    pub storm: bool,
}

fn delta(now: Option<u64>, then: Option<u64>) -> Option<u64> {
    Some(now?.saturating_sub(then?))
}

impl Health {
    /// The totals at `now`: judges the window when it is at least
    /// [`WINDOW`] long, then starts the next.
    pub fn sample(&mut self, now: Instant, t: Totals) -> Judged {
        let Some((start, s)) = self.since else {
            self.since = Some((now, t));
            return Judged::default();
        };
        let took = now.saturating_duration_since(start);
        if took < WINDOW {
            return Judged::default();
        }
        self.since = Some((now, t));
        let secs = took.as_secs_f64();
        let frames = t.frames.saturating_sub(s.frames);
        let mut out = Judged::default();
        if let Some(dups) = delta(t.duplicates, s.duplicates) {
            if frames >= DUP_MIN_FRAMES {
                let ratio = dups as f64 / frames as f64;
                if !self.duplicating && ratio >= DUP_RATIO {
                    self.duplicating = true;
                    out.duplicating = Some(Change::Duplicating { dups, frames, secs });
                } else if self.duplicating && ratio < DUP_CLEAR {
                    self.duplicating = false;
                    out.duplicating = Some(Change::DuplicatingCleared);
                }
            }
        }
        if let Some(naks) = delta(t.rnr_naks, s.rnr_naks) {
            let rate = naks as f64 / secs;
            if !self.storm && rate >= RNR_STORM_PER_S {
                self.storm = true;
                out.storm = Some(Change::Storm { naks, secs });
            } else if self.storm && rate < RNR_STORM_PER_S * RNR_CLEAR {
                self.storm = false;
                out.storm = Some(Change::StormCleared);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(frames: u64, dups: u64, naks: u64) -> Totals {
        Totals {
            frames,
            duplicates: Some(dups),
            rnr_naks: Some(naks),
        }
    }

    /// Feeds `steps` totals 100 ms apart from `at`, each step adding
    /// (frames, dups, naks); returns the changes.
    fn feed(
        h: &mut Health,
        at: &mut Instant,
        tot: &mut Totals,
        steps: u32,
        add: (u64, u64, u64),
    ) -> Vec<Change> {
        let mut seen = vec![];
        for _ in 0..steps {
            *at += Duration::from_millis(100);
            tot.frames += add.0;
            tot.duplicates = tot.duplicates.map(|d| d + add.1);
            tot.rnr_naks = tot.rnr_naks.map(|n| n + add.2);
            let j = h.sample(*at, *tot);
            seen.extend(j.duplicating);
            seen.extend(j.storm);
        }
        seen
    }

    #[test]
    fn a_peer_sending_every_frame_twice_is_named_once_and_cleared_when_it_stops() {
        let (mut h, mut at, mut tot) = (Health::default(), Instant::now(), t(0, 0, 0));
        h.sample(at, tot);
        assert_eq!(
            feed(&mut h, &mut at, &mut tot, 10, (1000, 3, 0)),
            [],
            "a few resends"
        );
        let seen = feed(&mut h, &mut at, &mut tot, 20, (1000, 1000, 0));
        assert!(
            matches!(
                seen[..],
                [Change::Duplicating {
                    dups: 5000,
                    frames: 5000,
                    ..
                }]
            ),
            "{seen:?}"
        );
        assert!(h.duplicating);
        // Idle (no frames): nothing judged, the verdict holds.
        assert_eq!(feed(&mut h, &mut at, &mut tot, 20, (0, 0, 0)), []);
        assert!(h.duplicating);
        let seen = feed(&mut h, &mut at, &mut tot, 10, (1000, 0, 0));
        assert_eq!(seen, [Change::DuplicatingCleared]);
    }

    #[test]
    fn duplicates_without_deliveries_are_no_duplicating_peer() {
        // (verbs: a restarted peer's stream, ACKed as old: another verdict.)
        let (mut h, mut at, mut tot) = (Health::default(), Instant::now(), t(0, 0, 0));
        h.sample(at, tot);
        assert_eq!(feed(&mut h, &mut at, &mut tot, 20, (5, 500, 0)), []);
    }

    #[test]
    fn rnr_naks_above_100_a_second_are_a_storm_a_short_pause_is_not() {
        let (mut h, mut at, mut tot) = (Health::default(), Instant::now(), t(0, 0, 0));
        h.sample(at, tot);
        // A consumer's one pause: 40 NAKs in one window.
        tot.rnr_naks = Some(40);
        assert_eq!(feed(&mut h, &mut at, &mut tot, 10, (1000, 0, 0)), []);
        // 15 a step = 150/s.
        let seen = feed(&mut h, &mut at, &mut tot, 10, (1000, 0, 15));
        assert!(
            matches!(seen[..], [Change::Storm { naks: 75, .. }]),
            "{seen:?}"
        );
        assert_eq!(
            feed(&mut h, &mut at, &mut tot, 10, (1000, 0, 15)),
            [],
            "said once"
        );
        assert_eq!(
            feed(&mut h, &mut at, &mut tot, 10, (1000, 0, 0)),
            [Change::StormCleared]
        );
    }

    #[test]
    fn a_counter_the_backend_lacks_gives_no_verdict() {
        let mut h = Health::default();
        let at = Instant::now();
        let none = Totals {
            frames: 0,
            duplicates: None,
            rnr_naks: None,
        };
        h.sample(at, none);
        let j = h.sample(
            at + WINDOW,
            Totals {
                frames: 1000,
                ..none
            },
        );
        assert_eq!(j, Judged::default());
    }
}
