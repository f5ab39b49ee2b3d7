//! What `rocev2 recv` saw: the frames' tally (counts, --verify, the rate
//! between the first and the last frame) and the periodic --stats-interval
//! lines with the verdicts that hold now.

use std::time::{Duration, Instant};

use rocev2::emulator::pattern;
use rocev2::{BackendStats, Frame, Stats};

/// What the receive loop saw.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) frames: u64,
    pub(crate) bytes: u64,
    /// Frames that failed --verify.
    pub(crate) bad: u64,
    pub(crate) first_error: Option<String>,
    /// Why --out failed, if it did (receiving stopped there).
    pub(crate) out_error: Option<String>,
    /// Arrival of the first and the last frame, and the first frame's size
    /// (the rate covers the frames after the first, over that span).
    pub(crate) first: Option<Instant>,
    pub(crate) last: Option<Instant>,
    pub(crate) first_len: u64,
}

impl Tally {
    pub(crate) fn add(&mut self, f: &Frame, verify: bool) {
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some(now);
            self.first_len = f.len() as u64;
        }
        self.last = Some(now);
        if verify {
            if let Err(e) = pattern::check(f.data()).and_then(|seq| match seq == self.frames {
                true => Ok(()),
                false => Err(format!("frame {seq} arrived where {} was due", self.frames)),
            }) {
                self.bad += 1;
                self.first_error.get_or_insert(e);
            }
        }
        self.frames += 1;
        self.bytes += f.len() as u64;
    }
    /// Seconds from the first to the last frame.
    pub(crate) fn span(&self) -> f64 {
        match (self.first, self.last) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        }
    }
    /// Gbit/s and frames/s between the first and the last frame.
    pub(crate) fn rate(&self) -> (f64, f64) {
        let secs = self.span();
        if self.frames < 2 || secs <= 0.0 {
            return (0.0, 0.0);
        }
        let bits = (self.bytes - self.first_len) as f64 * 8.0;
        (bits / secs / 1e9, (self.frames - 1) as f64 / secs)
    }
}

/// Periodic `--stats-interval` lines: totals and the rate since the last line.
pub(crate) struct Ticker {
    pub(crate) every: Duration,
    pub(crate) t0: Instant,
    pub(crate) next: Instant,
    pub(crate) last: (Instant, u64, u64),
}

impl Ticker {
    pub(crate) fn new(secs: f64) -> Ticker {
        let every = Duration::from_secs_f64(secs);
        let now = Instant::now();
        Ticker {
            every,
            t0: now,
            next: now + every,
            last: (now, 0, 0),
        }
    }
    /// The line now; `link` (with several --fpga): which link, first.
    pub(crate) fn line(&mut self, t: &Tally, s: &Stats, link: Option<usize>) -> String {
        let who = link.map_or(String::new(), |i| format!(" link {i}"));
        let now = Instant::now();
        let dt = (now - self.last.0).as_secs_f64().max(1e-9);
        let gbit = (t.bytes - self.last.2) as f64 * 8.0 / dt / 1e9;
        let fps = (t.frames - self.last.1) as f64 / dt;
        self.last = (now, t.frames, t.bytes);
        while self.next <= now {
            self.next += self.every;
        }
        let mut line = format!(
            "rocev2 recv{who}: {:.1} s  {} frames  {gbit:.3} Gbit/s  {fps:.0} frames/s  \
             seq NAKs {}  RNR NAKs {}  socket drops {}  duplicates {}  peer restarts {}  \
             {}{}link {}, last packet {}",
            (now - self.t0).as_secs_f64(),
            t.frames,
            s.soft().seq_naks_tx,
            s.soft().rnr_naks_tx,
            s.soft().socket_drops,
            s.soft().duplicates,
            s.peer_restarts(),
            peer_verdicts(s),
            link_verdicts(s),
            s.link,
            s.since_last_packet.map_or("never".to_string(), |d| format!(
                "{:.1} s ago",
                d.as_secs_f64()
            ))
        );
        if s.ack_turnaround.count + s.delivery_latency.count > 0 {
            line += &format!(
                "  ACK turnaround {}  delivery {}",
                s.ack_turnaround, s.delivery_latency
            );
        }
        line
    }
}

/// The verdicts that hold now and the counter check's findings, for a
/// --stats-interval line ("" when there are none).
fn link_verdicts(s: &Stats) -> String {
    let mut v = String::new();
    if s.duplicating_peer != 0 {
        v += "DUPLICATING PEER  ";
    }
    if s.rnr_storm != 0 {
        v += "RNR STORM  ";
    }
    if s.counter_gaps + s.counter_resets > 0 {
        v += &format!(
            "counter gaps {} ({} frames) resets {}  ",
            s.counter_gaps, s.counter_gap_frames, s.counter_resets
        );
    }
    v
}

/// The verbs backend's verdicts for a --stats-interval line ("" on soft).
fn peer_verdicts(s: &Stats) -> String {
    match s.backend {
        BackendStats::Verbs(v) if v.watched == 0 => "peer not watched  ".to_string(),
        BackendStats::Verbs(v) => format!(
            "lost to restarts ~{}  stale peer {}{}  ",
            v.lost_frames_estimate,
            if v.stale != 0 { "NOW, " } else { "" },
            v.stale_peers
        ),
        BackendStats::Soft(_) => String::new(),
    }
}
