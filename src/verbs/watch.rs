//! Watching the peer through the port's responder counters: a restarted FPGA
//! (its PSNs behind: the NIC ACKs them as old duplicates and delivers
//! nothing) and a stale one (its PSNs ahead: the NIC NAKs them as out of
//! sequence). The NIC sees both; only its counters tell:
//! `/sys/class/infiniband/<dev>/ports/<port>/hw_counters/duplicate_request`
//! and `out_of_seq_request` (rxe; older kernels and mlx5: `out_of_sequence`).
//!
//! Cost: the files are read only on an empty poll (never while completions
//! come back to back), at most every [`SAMPLE_EVERY`]; while the link stays
//! quiet and the counters still, every read doubles the wait to the next, up
//! to [`SAMPLE_MAX`].
//!
//! The counters are the port's, not the QP's: with several servers on one
//! port, a verdict goes to every server that had no delivery while the
//! counters rose (a server receiving frames is never blamed for a neighbour's
//! peer), and the log says how many servers of this process share the port.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::server::VerbsCounters;

/// Shortest time between two reads of the counters.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(4);
/// Longest time between two reads while the link is quiet.
pub(crate) const SAMPLE_MAX: Duration = Duration::from_millis(64);
/// How long out-of-sequence requests with no delivery make a stale peer (a
/// lost packet's NAK brings the resend within a round trip).
pub(crate) const STALE_AFTER: Duration = Duration::from_millis(50);
/// Duplicates in one read that make a restart at once: more than any
/// requester's window could resend after a lost ACK (rxe: 128 PSNs).
/// Fewer make one only when they keep coming (a second read with more).
pub(crate) const RESTART_BURST: u64 = 128;
/// Empty polls between two looks at the clock.
const POLLS_PER_CLOCK: u32 = 32;

/// One reading of the port's responder counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// `duplicate_request`: PSN behind the expected one, re-ACKed, not delivered.
    pub dup: u64,
    /// `out_of_seq_request` / `out_of_sequence`: PSN ahead, NAKed.
    pub oos: u64,
}

/// What one reading concluded.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// A restart verdict (once per quiet spell).
    pub restart: bool,
    /// A stale-peer verdict (once per quiet spell).
    pub stale: bool,
    /// Delivery resumed after a verdict: (after a restart, after a stale peer).
    pub resumed: (bool, bool),
    /// The counters moved (the next read comes soon again).
    pub moved: bool,
}

/// The verdicts, pure: fed the deliveries and the readings.
#[derive(Debug, Default)]
pub(crate) struct Verdicts {
    /// The last reading.
    last: Option<Sample>,
    /// Frames delivered since the last reading.
    delivered: bool,
    /// Packets per message of the last frame delivered (1 before the first).
    msg_packets: u64,
    /// Duplicates of the last interval with deliveries: a restart's first
    /// ones when a quiet spell with a restart verdict follows.
    carry: u64,
    /// The quiet spell (no delivery since): readings with more duplicates,
    /// duplicates not yet judged, whether a restart was found, lost packets,
    /// when out-of-sequence requests were first seen, whether stale.
    dup_rises: u32,
    dup_pending: u64,
    restarted: bool,
    lost_packets: u64,
    oos_since: Option<Instant>,
    stale: bool,
    /// Totals: restarts, stale verdicts, frames lost in earlier spells.
    pub restarts: u64,
    pub stale_verdicts: u64,
    lost_before: u64,
}

impl Verdicts {
    /// Frames were delivered, the last `len` bytes long (`mtu` bytes per packet).
    pub fn delivered(&mut self, len: u32, mtu: u32) {
        self.delivered = true;
        self.msg_packets = (len as u64).div_ceil(mtu.max(1) as u64).max(1);
    }

    /// Whether a stale verdict holds.
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// Frames estimated lost to restarts so far.
    pub fn lost_frames(&self) -> u64 {
        self.lost_before + self.lost_packets.div_ceil(self.msg_packets.max(1))
    }

    /// Judges one reading taken at `now`; `starved`: no receive is posted
    /// (every slot on loan: the NIC sends RNR NAKs, and the packets the
    /// sender had in flight behind the refused one arrive out of sequence,
    /// which says nothing about the peer).
    pub fn sample(&mut self, now: Instant, s: Sample, starved: bool) -> Outcome {
        let Some(prev) = self.last.replace(s) else {
            return Outcome::default();
        };
        // (A counter that went back — the driver reloaded — reads as no change.)
        let dups = s.dup.saturating_sub(prev.dup);
        let oos = s.oos.saturating_sub(prev.oos);
        let mut out = Outcome {
            moved: dups > 0 || oos > 0,
            ..Outcome::default()
        };
        if std::mem::take(&mut self.delivered) {
            // Deliveries in this interval: the quiet spell (if any) is over.
            out.resumed = (self.restarted, self.stale);
            self.lost_before = self.lost_frames();
            self.carry = dups;
            self.dup_rises = 0;
            self.dup_pending = 0;
            self.restarted = false;
            self.lost_packets = 0;
            self.oos_since = None;
            self.stale = false;
            return out;
        }
        if dups > 0 {
            self.dup_rises += 1;
            if self.restarted {
                self.lost_packets += dups;
            } else {
                self.dup_pending += dups;
                if self.dup_rises >= 2 || self.dup_pending > RESTART_BURST {
                    self.restarted = true;
                    self.restarts += 1;
                    out.restart = true;
                    self.lost_packets += std::mem::take(&mut self.carry) + self.dup_pending;
                    self.dup_pending = 0;
                }
            }
        }
        if starved && !self.stale {
            self.oos_since = None;
        } else if oos > 0 && self.oos_since.is_none() {
            self.oos_since = Some(now);
        }
        if let Some(t) = self.oos_since {
            if !self.stale && now.saturating_duration_since(t) >= STALE_AFTER {
                self.stale = true;
                self.stale_verdicts += 1;
                out.stale = true;
            }
        }
        out
    }
}

/// The port's two counter files, and its RNR NAK counter when it has one.
struct Files {
    dup: File,
    oos: File,
    /// RNR NAKs the port sent: rxe `send_rnr_err`, mlx5 `out_of_buffer`
    /// (a message with no posted receive: the NIC RNR-NAKs it on RC).
    rnr: Option<File>,
}

impl Files {
    /// Opens them under `dir` (hw_counters); None when either is missing.
    fn open(dir: &Path) -> Option<Files> {
        let dup = File::open(dir.join("duplicate_request")).ok()?;
        let oos = File::open(dir.join("out_of_seq_request"))
            .or_else(|_| File::open(dir.join("out_of_sequence")))
            .ok()?;
        let rnr = File::open(dir.join("send_rnr_err"))
            .or_else(|_| File::open(dir.join("out_of_buffer")))
            .ok();
        Some(Files { dup, oos, rnr })
    }

    /// The RNR NAK counter, when the port has one.
    fn read_rnr(&self) -> Option<u64> {
        value(self.rnr.as_ref()?)
    }

    fn read(&self) -> Option<Sample> {
        Some(Sample {
            dup: value(&self.dup)?,
            oos: value(&self.oos)?,
        })
    }
}

/// A counter file's value.
fn value(f: &File) -> Option<u64> {
    let mut buf = [0u8; 32];
    let n = f.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

/// Servers of this process watching each (device, port).
static WATCHERS: Mutex<Option<HashMap<(String, u8), u32>>> = Mutex::new(None);

fn watchers(key: &(String, u8), change: i32) -> u32 {
    let mut w = WATCHERS.lock().unwrap_or_else(|e| e.into_inner());
    let map = w.get_or_insert_with(HashMap::new);
    let n = map.entry(key.clone()).or_insert(0);
    *n = n.saturating_add_signed(change);
    let now = *n;
    if now == 0 {
        map.remove(key);
    }
    now
}

/// The watch of one verbs server: its verdicts, the files, when to read next.
pub(crate) struct PeerWatch {
    port: (String, u8),
    dir: std::path::PathBuf,
    files: Option<Files>,
    registered: bool,
    verdicts: Verdicts,
    mtu: u32,
    rq_psn: u32,
    counters: Arc<VerbsCounters>,
    next: Option<Instant>,
    wait: Duration,
    empty_polls: u32,
    /// Frames delivered so far (stored beside each reading).
    frames: u64,
    /// The baseline's duplicate and RNR NAK counts (`port_duplicates` and
    /// `port_rnr_naks` count from them).
    base: (u64, Option<u64>),
}

impl PeerWatch {
    /// For `dev`'s port `port` (nothing read yet).
    pub fn new(dev: &str, port: u8) -> PeerWatch {
        PeerWatch {
            dir: Path::new("/sys/class/infiniband")
                .join(dev)
                .join("ports")
                .join(port.to_string())
                .join("hw_counters"),
            port: (dev.to_string(), port),
            files: None,
            registered: false,
            verdicts: Verdicts::default(),
            mtu: 4096,
            rq_psn: 0,
            counters: Arc::new(VerbsCounters::default()),
            next: None,
            wait: SAMPLE_EVERY,
            empty_polls: 0,
            frames: 0,
            base: (0, None),
        }
    }

    /// Where the core reads the verdicts.
    pub fn counters(&self) -> Arc<VerbsCounters> {
        Arc::clone(&self.counters)
    }

    /// Before the QP can receive (ahead of INIT->RTR): opens the files and
    /// takes the baseline reading. Taken any later, a requester that is
    /// already retrying could land its one counted out-of-sequence request
    /// (rxe counts only the first until an in-sequence one) between RTR and
    /// the baseline, and its stale verdict would never come.
    pub fn baseline(&mut self) {
        self.files = Files::open(&self.dir);
        if let Some(s) = self.files.as_ref().and_then(Files::read) {
            self.verdicts.sample(Instant::now(), s, false);
            let rnr = self.files.as_ref().and_then(Files::read_rnr);
            self.base = (s.dup, rnr);
            self.counters
                .rnr_watched
                .store(rnr.is_some() as u64, Ordering::Release);
        }
    }

    /// The link is up (`mtu` bytes per packet, the FPGA's first PSN
    /// `rq_psn`): says once when the files are missing, else starts the
    /// readings against the baseline ([`PeerWatch::baseline`]).
    pub fn connect(&mut self, mtu: u32, rq_psn: u32) {
        self.mtu = mtu;
        self.rq_psn = rq_psn;
        if self.files.is_none() {
            log::warn!(
                "peer watch: {} has no duplicate_request and out_of_seq_request (or \
                 out_of_sequence) counters: a restarted or stale FPGA is NOT watched on this \
                 link (its messages would be lost without a word); the soft backend sees both",
                self.dir.display()
            );
            return;
        }
        let n = watchers(&self.port, 1);
        self.registered = true;
        self.counters.watched.store(1, Ordering::Release);
        log::info!(
            "peer watch: reading {} (duplicate_request, out-of-sequence) while no completion \
             comes; {n} server(s) of this process on this port",
            self.dir.display()
        );
        self.next = Some(Instant::now() + SAMPLE_EVERY);
    }

    /// `frames` completions came, the last of `len` bytes.
    pub fn delivered(&mut self, frames: u64, len: u32) {
        self.frames += frames;
        self.verdicts.delivered(len, self.mtu);
        self.wait = SAMPLE_EVERY;
    }

    /// A poll found nothing: every so many, a look at the clock and, when
    /// due, a reading (`starved`: no receive is posted).
    pub fn empty_poll(&mut self, starved: bool) {
        if self.next.is_none() {
            return;
        }
        self.empty_polls += 1;
        if self.empty_polls < POLLS_PER_CLOCK {
            return;
        }
        self.empty_polls = 0;
        self.check(Instant::now(), starved);
    }

    /// How long a block may last before the next reading (-1: no limit).
    pub fn block_ms(&self) -> i32 {
        match self.next {
            None => -1,
            Some(t) => t
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, SAMPLE_MAX.as_millis()) as i32,
        }
    }

    /// Reads the counters when due (`starved`: no receive is posted).
    pub fn check(&mut self, now: Instant, starved: bool) {
        let (Some(next), Some(files)) = (self.next, &self.files) else {
            return;
        };
        if now < next {
            return;
        }
        let Some(s) = files.read() else {
            return;
        };
        let out = self.verdicts.sample(now, s, starved);
        let c = &self.counters;
        c.port_duplicates
            .store(s.dup.saturating_sub(self.base.0), Ordering::Release);
        if let (Some(base), Some(rnr)) = (self.base.1, files.read_rnr()) {
            c.port_rnr_naks
                .store(rnr.saturating_sub(base), Ordering::Release);
        }
        c.port_read_frames.store(self.frames, Ordering::Release);
        self.wait = if out.moved {
            SAMPLE_EVERY
        } else {
            (self.wait * 2).min(SAMPLE_MAX)
        };
        self.next = Some(now + self.wait);
        self.report(out);
    }

    fn report(&self, out: Outcome) {
        let v = &self.verdicts;
        let c = &self.counters;
        c.peer_restarts.store(v.restarts, Ordering::Release);
        c.lost_frames_estimate
            .store(v.lost_frames(), Ordering::Release);
        c.stale_peers.store(v.stale_verdicts, Ordering::Release);
        c.stale.store(v.is_stale() as u64, Ordering::Release);
        let (dev, port) = (&self.port.0, self.port.1);
        if !(out.restart || out.stale || out.resumed.0 || out.resumed.1) {
            return;
        }
        let shared = match watchers(&self.port, 0) {
            0 | 1 => String::new(),
            n => format!(
                " ({n} servers of this process share this port and its counters: each without \
                 deliveries gets this verdict, so the peer may be another server's)"
            ),
        };
        if out.restart {
            log::warn!(
                "peer restart on '{dev}' port {port}: duplicate requests rise while no \
                 completion comes: the FPGA started over at a PSN this QP has passed (reloaded, \
                 then re-programmed with the same host params). The NIC ACKs its messages as old \
                 duplicates and delivers none of them: about {} frames lost so far \
                 (lost_frames_estimate). Remedy: after an FPGA reload, re-create the server and \
                 program the FPGA with the new host params{shared}",
                v.lost_frames()
            );
        }
        if out.stale {
            log::warn!(
                "stale peer on '{dev}' port {port}: out-of-sequence requests and no completion \
                 for {} ms: the FPGA sends PSNs ahead of the one this QP expects ({:#08x}); it \
                 was not programmed with this server's host params, or it kept its PSN from an \
                 earlier connection. Remedy: pulse the FPGA's SoftReset before programming it \
                 (rogue #1270), then program it with this server's host params{shared}",
                STALE_AFTER.as_millis(),
                self.rq_psn
            );
        }
        if out.resumed.0 || out.resumed.1 {
            log::info!(
                "delivery resumed on '{dev}' port {port}: the {} verdict is cleared",
                if out.resumed.1 {
                    "stale-peer"
                } else {
                    "peer-restart"
                }
            );
        }
    }
}

impl Drop for PeerWatch {
    fn drop(&mut self) {
        if self.registered {
            watchers(&self.port, -1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    fn s(dup: u64, oos: u64) -> Sample {
        Sample { dup, oos }
    }

    #[test]
    fn a_restart_is_found_once_and_its_losses_counted_in_frames() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        v.sample(t0, s(0, 0), false);
        v.delivered(8192, 4096); // 2 packets per message
                                 // The restart begins while the last frames come: its first duplicates
                                 // fall in an interval with deliveries (carried).
        assert!(!v.sample(at(t0, 4), s(6, 0), false).restart);
        assert!(
            !v.sample(at(t0, 8), s(20, 0), false).restart,
            "one rise is no verdict"
        );
        let out = v.sample(at(t0, 12), s(40, 0), false);
        assert!(out.restart && !out.stale);
        assert_eq!((v.restarts, v.lost_frames()), (1, 20));
        assert!(
            !v.sample(at(t0, 16), s(60, 0), false).restart,
            "once per quiet spell"
        );
        assert_eq!((v.restarts, v.lost_frames()), (1, 30));
        // Delivery resumes: cleared, the loss kept.
        v.delivered(8192, 4096);
        assert_eq!(v.sample(at(t0, 20), s(60, 0), false).resumed, (true, false));
        assert_eq!(v.sample(at(t0, 24), s(60, 0), false), Outcome::default());
        assert_eq!((v.restarts, v.lost_frames()), (1, 30));
    }

    #[test]
    fn a_lost_acks_resend_is_no_restart_but_a_big_burst_is() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        v.sample(t0, s(0, 0), false);
        // One resend of a window after lost ACKs, then quiet: no verdict.
        assert!(!v.sample(at(t0, 4), s(16, 0), false).restart);
        for i in 2..20 {
            assert!(!v.sample(at(t0, 4 * i), s(16, 0), false).restart);
        }
        assert_eq!((v.restarts, v.lost_frames()), (0, 0));
        v.delivered(1000, 4096);
        v.sample(at(t0, 96), s(16, 0), false);
        // More at once than any window: a restart at once.
        assert!(
            v.sample(at(t0, 100), s(16 + RESTART_BURST + 1, 0), false)
                .restart
        );
        assert_eq!(v.lost_frames(), RESTART_BURST + 1);
    }

    #[test]
    fn out_of_sequence_without_delivery_for_a_while_is_a_stale_peer() {
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        v.sample(t0, s(0, 0), false);
        assert!(!v.sample(at(t0, 4), s(0, 1), false).stale);
        assert!(
            !v.sample(at(t0, 40), s(0, 1), false).stale,
            "before STALE_AFTER"
        );
        let out = v.sample(at(t0, 60), s(0, 2), false);
        assert!(out.stale && !out.restart && v.is_stale());
        assert!(!v.sample(at(t0, 200), s(0, 3), false).stale, "once");
        assert_eq!(v.stale_verdicts, 1);
        v.delivered(100, 4096);
        assert_eq!(v.sample(at(t0, 204), s(0, 3), false).resumed, (false, true));
        assert!(!v.is_stale());
        // A lost packet's NAK, resent and delivered at once: no verdict.
        assert!(!v.sample(at(t0, 208), s(0, 4), false).stale);
        v.delivered(100, 4096);
        v.sample(at(t0, 212), s(0, 4), false);
        assert!(!v.sample(at(t0, 400), s(0, 4), false).stale);
        assert_eq!(v.stale_verdicts, 1);
    }

    #[test]
    fn out_of_sequence_while_every_slot_is_on_loan_is_no_stale_peer() {
        // RNR back-pressure: the packets behind the refused one arrive out
        // of sequence while no receive is posted.
        let t0 = Instant::now();
        let mut v = Verdicts::default();
        v.sample(t0, s(0, 0), false);
        for i in 1..100u64 {
            assert!(!v.sample(at(t0, 4 * i), s(0, i), true).stale);
        }
        // Slots posted again, the sender's RNR retry delivers.
        assert!(!v.sample(at(t0, 404), s(0, 100), false).stale);
        v.delivered(100, 4096);
        v.sample(at(t0, 408), s(0, 100), false);
        assert_eq!(v.stale_verdicts, 0);
    }

    #[test]
    fn a_server_with_deliveries_gets_no_verdict_from_the_ports_counters() {
        // Two servers on one port: A receives all along, B's peer restarted.
        let t0 = Instant::now();
        let (mut a, mut b) = (Verdicts::default(), Verdicts::default());
        a.sample(t0, s(0, 0), false);
        b.sample(t0, s(0, 0), false);
        for i in 1..50u64 {
            a.delivered(1024, 4096);
            a.sample(at(t0, 4 * i), s(10 * i, 0), false);
            b.sample(at(t0, 4 * i), s(10 * i, 0), false);
        }
        assert_eq!((a.restarts, a.lost_frames()), (0, 0));
        assert_eq!(b.restarts, 1);
    }

    #[test]
    fn a_request_counted_between_rtr_and_the_first_poll_still_makes_a_stale_peer() {
        // rxe counts one out-of-sequence request per episode: a requester
        // retrying before the QP was up lands it as soon as the QP is RTR.
        let dir = std::env::temp_dir().join(format!("rocev2-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let put = |name: &str, v: u64| std::fs::write(dir.join(name), format!("{v}\n")).unwrap();
        put("duplicate_request", 7);
        put("out_of_seq_request", 3);
        let mut w = PeerWatch::new("test", 1);
        w.dir = dir.clone();
        w.baseline();
        put("out_of_seq_request", 4); // INIT->RTR->RTS, then the request
        w.connect(4096, 0);
        let t0 = Instant::now();
        w.check(t0 + SAMPLE_EVERY, false);
        w.check(t0 + SAMPLE_EVERY + STALE_AFTER, false);
        let c = w.counters();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.watched.load(Ordering::Acquire), 1);
        assert_eq!(c.stale_peers.load(Ordering::Acquire), 1);
        assert_eq!(c.peer_restarts.load(Ordering::Acquire), 0);
    }

    #[test]
    fn missing_counter_files_leave_the_link_unwatched() {
        let mut w = PeerWatch::new("no-such-device", 1);
        w.baseline();
        w.connect(4096, 0);
        assert_eq!(w.block_ms(), -1);
        assert_eq!(w.counters().watched.load(Ordering::Acquire), 0);
        w.empty_poll(false);
        w.check(Instant::now() + SAMPLE_MAX, false);
    }
}
