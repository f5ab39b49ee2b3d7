//! Counters: every frame, byte, drop and protocol event, by cause. The core
//! keeps its own ([`Stats`]); each backend reports its own section
//! ([`BackendStats`]): the soft backend's protocol and socket counters
//! ([`SoftStats`]); the verbs backend its verdicts on the peer
//! ([`VerbsStats`]; the NIC keeps the protocol counters: `ethtool -S`, the
//! device's hw_counters).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::health::Totals;
use super::Latency;

/// Live counters (`$live`, atomics) and their snapshot (`$snap`, with any
/// extra fields, filled by the caller).
macro_rules! counters {
    ($(#[doc = $ldoc:literal])+ $live:ident;
     $(#[doc = $sdoc:literal])+ $snap:ident;
     { $($(#[doc = $doc:literal])+ $name:ident,)* }
     $($(#[doc = $xdoc:literal])+ $xname:ident: $xty:ty,)*) => {
        $(#[doc = $ldoc])+
        #[derive(Default)]
        pub(crate) struct $live {
            $(pub $name: AtomicU64,)*
        }

        $(#[doc = $sdoc])+
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct $snap {
            $($(#[doc = $doc])+ pub $name: u64,)*
            $($(#[doc = $xdoc])+ pub $xname: $xty,)*
        }

        impl $live {
            /// The counters now (extra fields at their defaults).
            #[allow(clippy::needless_update)]
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $($name: self.$name.load(Ordering::Acquire),)*
                    ..Default::default()
                }
            }
        }
    };
}

counters! {
    /// The core's live counters, bumped by the server core.
    Counters;
    /// A snapshot of a server's counters: the core's, then the backend's section.
    Stats;
    {
        /// Frames delivered to the consumer (callback or pull queue).
        frames,
        /// Payload bytes delivered.
        bytes,
        /// Loans released by the consumer.
        releases,
        /// Receive slots re-posted after release.
        reposts,
        /// Re-post calls (each re-posts a batch of slots).
        repost_batches,
        /// Times the receive thread blocked waiting for completions.
        parks,
        /// Times the receive thread napped (slept briefly, then took what
        /// came: a paced sender, see `spin_us`).
        naps,
        /// Completions with an error status (the slot is re-posted).
        completion_errors,
        /// Flush completions (the QP entered the error state; the thread ends).
        flush_errors,
        /// Completions with a zero or oversized length (dropped, slot re-posted).
        bad_length,
        /// Completions that were not a receive with immediate (dropped, slot re-posted).
        unexpected_opcode,
        /// Release calls with an unknown or already released token.
        invalid_releases,
        /// Frame callbacks that panicked (the frame is released, the thread goes on).
        callback_panics,
        /// Gaps in the FPGA's frame counter (immediate bits \[31:8\]; checked
        /// when `ServerConfig::counter_wrap` is set): delivered frames whose
        /// counter skipped numbers, each logged once with the positions.
        counter_gaps,
        /// Frames the FPGA numbered that never arrived: the numbers the
        /// gaps skipped, in all.
        counter_gap_frames,
        /// Resets of the FPGA's frame counter: back to 0 before the wrap
        /// (the FPGA re-armed its dispatch, or restarted), each logged once.
        counter_resets,
        /// Duplicating-peer verdicts: duplicates nearly as many as the frames
        /// delivered over a window (surf's sticky half-bandwidth latch: the
        /// FPGA sends every message twice), each logged once with its remedy.
        duplicating_peers,
        /// 1 while a duplicating-peer verdict holds, else 0.
        duplicating_peer,
        /// RNR storms: RNR NAKs above 100 a second over a window, each logged
        /// once with what to check.
        rnr_storms,
        /// 1 while an RNR storm verdict holds, else 0.
        rnr_storm,
    }
    /// Slots on loan to consumers right now.
    loans_outstanding: u64,
    /// The link's state.
    link: LinkState,
    /// Time since the last packet from the FPGA (soft: any datagram from its
    /// address; verbs: any completion); None before the first.
    since_last_packet: Option<Duration>,
    /// Time since the last frame was delivered; None before the first.
    since_last_frame: Option<Duration>,
    /// The backend's own counters.
    backend: BackendStats,
    /// soft: from the kernel's receive stamp of each packet that asked for
    /// an ACK to the ACK that covers it leaving (`sendmmsg` returned). All 0
    /// unless `ServerConfig::measure_latency`; verbs: 0 (the NIC ACKs).
    ack_turnaround: Latency,
    /// From the kernel's receive stamp of a frame's last packet to the
    /// frame callback's entry or the poll's return (soft; all 0 unless
    /// `ServerConfig::measure_latency`; verbs: 0).
    delivery_latency: Latency,
}

/// The link's state, as an operator reads it (C: `ROCEV2_LINK_*`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Created: the connection is not complete yet.
    #[default]
    Created,
    /// Connected: the receive thread runs.
    Connected,
    /// Ended on an error (a QP error, a failed complete_connection, a failing
    /// socket): `Server::end_cause` says what happened.
    Error,
    /// Stopped by `stop()`.
    Stopped,
}

impl LinkState {
    /// "created", "connected", "error" or "stopped".
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Created => "created",
            LinkState::Connected => "connected",
            LinkState::Error => "error",
            LinkState::Stopped => "stopped",
        }
    }
    /// The C code: 0 created, 1 connected, 2 error, 3 stopped.
    pub fn code(self) -> u32 {
        self as u32
    }
}

impl std::fmt::Display for LinkState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Adds `n` to a counter that only the receive thread writes: a plain load
/// and store (no locked read-modify-write; readers on other threads see the
/// old or the new value, never a torn one). A release store, read with
/// acquire by `snapshot`: a reader that sees a count sees the counts the
/// thread bumped before it (after `reposts` moved, `releases` has too).
pub(crate) fn bump(counter: &AtomicU64, n: u64) {
    counter.store(
        counter.load(Ordering::Relaxed).wrapping_add(n),
        Ordering::Release,
    );
}

/// When the last packet and the last frame came (written by the receive
/// thread, read by any): nanoseconds since `epoch` plus one, 0 = never.
pub(crate) struct Activity {
    epoch: Instant,
    last_packet: AtomicU64,
    last_frame: AtomicU64,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            epoch: Instant::now(),
            last_packet: AtomicU64::new(0),
            last_frame: AtomicU64::new(0),
        }
    }
    fn stamp(&self, at: &AtomicU64, now: Instant) {
        at.store((now - self.epoch).as_nanos() as u64 + 1, Ordering::Relaxed);
    }
    /// A packet (or a completion) arrived at `now`.
    pub fn packet(&self, now: Instant) {
        self.stamp(&self.last_packet, now);
    }
    /// A frame was delivered at `now`.
    pub fn frame(&self, now: Instant) {
        self.stamp(&self.last_frame, now);
    }
    fn age(&self, at: &AtomicU64) -> Option<Duration> {
        match at.load(Ordering::Relaxed) {
            0 => None,
            t => Some(
                self.epoch
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(t - 1)),
            ),
        }
    }
    /// (since the last packet, since the last frame).
    pub fn ages(&self) -> (Option<Duration>, Option<Duration>) {
        (self.age(&self.last_packet), self.age(&self.last_frame))
    }
}

counters! {
    /// The soft backend's live counters (its responder's are published here
    /// after each receive batch).
    SoftCounters;
    /// The soft backend's counters.
    SoftStats;
    {
        /// RoCEv2 packets received on the socket.
        packets_rx,
        /// Packets sent (ACKs and NAKs).
        packets_tx,
        /// ACKs sent.
        acks_tx,
        /// RNR NAKs sent (no free slot at a message start; the sender retries).
        rnr_naks_tx,
        /// PSN sequence error NAKs sent (a gap: packets were lost).
        seq_naks_tx,
        /// Invalid request NAKs sent (bad opcode or length).
        invalid_naks_tx,
        /// Duplicate packets (re-ACKed, never re-delivered).
        duplicates,
        /// Packets ahead of the expected PSN (dropped; the sender goes back).
        out_of_sequence,
        /// Packets not for this QP or not from the configured FPGA address.
        foreign_packets,
        /// Packets too short or inconsistent to parse.
        malformed,
        /// Packets with a bad ICRC (dropped).
        icrc_errors,
        /// Packets whose ICRC could not be checked (no raw IP header).
        icrc_unchecked,
        /// Packets whose ICRC was verified (raw capture mode).
        icrc_checked,
        /// Packets whose payload the kernel wrote straight into the slot.
        payload_direct,
        /// Packets whose payload was copied into the slot afterwards (a
        /// missed landing guess: loss, reordering, a change of frame size).
        payload_copied,
        /// Packets the kernel dropped because the receive socket's buffer
        /// was full (the receive thread fell behind; the sender resends them).
        socket_drops,
        /// Packets further from the expected PSN than any sender window
        /// allows (dropped, not ACKed): a restarted FPGA's first packets or
        /// a mis-programmed start PSN.
        stale_packets,
        /// Peer restarts: the FPGA started over at the connection's first PSN
        /// (re-programmed after a reload); the responder re-synchronised to
        /// the new stream and logged a warning.
        peer_restarts,
    }
}

counters! {
    /// The verbs backend's live counters: its verdicts on the peer, from the
    /// port's responder counters (`verbs/watch.rs`).
    VerbsCounters;
    /// The verbs backend's counters: the NIC keeps the protocol counters
    /// (`ethtool -S`, `/sys/class/infiniband/<dev>/ports/<port>/hw_counters`);
    /// these are the verdicts the server draws from them.
    VerbsStats;
    {
        /// Peer restarts: the port's `duplicate_request` counter rose while no
        /// completion came (the NIC ACKed a restarted stream as old
        /// duplicates and delivered none of it). Logged once per restart.
        peer_restarts,
        /// Frames estimated lost to peer restarts: each duplicate the NIC
        /// ACKed during a restart was a message the FPGA believes delivered
        /// (packets divided by the packets per message of the last frame).
        lost_frames_estimate,
        /// Stale-peer verdicts: the port's out-of-sequence counter rose while
        /// no completion came for 50 ms (the FPGA sends PSNs ahead of the
        /// expected one: not programmed with this server's host params, or it
        /// kept its PSN). Logged once per verdict.
        stale_peers,
        /// 1 while a stale-peer verdict holds (cleared when delivery resumes).
        stale,
        /// 1 when the port's counters are watched (0: the files are missing,
        /// said once at connect; no verdict is drawn).
        watched,
        /// The port's `duplicate_request` counter since the server was
        /// created (the port's: every QP on it; read while no completion
        /// comes): what the duplicating-peer verdict reads on verbs.
        port_duplicates,
        /// The port's RNR NAKs sent since the server was created (rxe
        /// `send_rnr_err`, mlx5 `out_of_buffer`; 0 when the port has
        /// neither): what the RNR storm verdict reads on verbs.
        port_rnr_naks,
        /// 1 when the port has an RNR NAK counter (`port_rnr_naks` is read).
        rnr_watched,
        /// This server's frames delivered when the port's counters were last
        /// read: `port_duplicates` and `port_rnr_naks` are as of this many
        /// frames (the duplicating-peer verdict compares the two at one
        /// reading, never a fresh frame count against a stale counter).
        port_read_frames,
    }
}

/// The backend's section of [`Stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendStats {
    /// The verbs backend's verdicts on its peer (the NIC keeps the protocol
    /// counters).
    Verbs(VerbsStats),
    /// The soft backend's counters.
    Soft(SoftStats),
}

impl Default for BackendStats {
    fn default() -> BackendStats {
        BackendStats::Verbs(VerbsStats::default())
    }
}

impl Stats {
    /// The soft backend's counters (all 0 on verbs).
    pub fn soft(&self) -> SoftStats {
        match self.backend {
            BackendStats::Soft(s) => s,
            BackendStats::Verbs(_) => SoftStats::default(),
        }
    }
    /// The verbs backend's counters (all 0 on soft).
    pub fn verbs(&self) -> VerbsStats {
        match self.backend {
            BackendStats::Verbs(v) => v,
            BackendStats::Soft(_) => VerbsStats::default(),
        }
    }
    /// Peer restarts seen by either backend (soft: the responder
    /// re-synchronised, nothing lost; verbs: the NIC dropped the restarted
    /// stream as duplicates, see `verbs().lost_frames_estimate`).
    pub fn peer_restarts(&self) -> u64 {
        self.soft().peer_restarts + self.verbs().peer_restarts
    }
}

/// Where the core reads a backend's counters from (any thread).
#[derive(Clone, Default)]
pub(crate) enum BackendCounters {
    /// The backend keeps none.
    #[default]
    None,
    /// The soft backend's.
    Soft(Arc<SoftCounters>),
    /// The verbs backend's verdicts.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    Verbs(Arc<VerbsCounters>),
}

impl BackendCounters {
    /// The totals the link health's verdicts judge (`frames`: delivered
    /// so far). Verbs reads the port's counters now and then: its totals are
    /// those of the last reading, with the frames delivered at that reading,
    /// so a window never sets fresh frames against a stale counter. None:
    /// the backend cannot count it.
    pub fn health_totals(&self, frames: u64) -> Totals {
        match self {
            BackendCounters::None => Totals {
                frames,
                duplicates: None,
                rnr_naks: None,
            },
            BackendCounters::Soft(c) => Totals {
                frames,
                duplicates: Some(c.duplicates.load(Ordering::Acquire)),
                rnr_naks: Some(c.rnr_naks_tx.load(Ordering::Acquire)),
            },
            BackendCounters::Verbs(c) => {
                if c.watched.load(Ordering::Acquire) == 0 {
                    return Totals {
                        frames,
                        duplicates: None,
                        rnr_naks: None,
                    };
                }
                let rnr = (c.rnr_watched.load(Ordering::Acquire) != 0)
                    .then(|| c.port_rnr_naks.load(Ordering::Acquire));
                Totals {
                    frames: c.port_read_frames.load(Ordering::Acquire),
                    duplicates: Some(c.port_duplicates.load(Ordering::Acquire)),
                    rnr_naks: rnr,
                }
            }
        }
    }

    /// The backend's section now.
    pub fn snapshot(&self) -> BackendStats {
        match self {
            BackendCounters::None => BackendStats::default(),
            BackendCounters::Soft(c) => BackendStats::Soft(c.snapshot()),
            BackendCounters::Verbs(c) => BackendStats::Verbs(c.snapshot()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::health::Health;

    /// Verbs reads the port's duplicate counter now and then; frames come
    /// all the time. A window that set fresh frames against a stale counter
    /// read a latched duplicating peer as healthy and cleared its verdict
    /// (the rxe VM saw the verdict given twice on one sticky-half stream).
    #[test]
    fn a_stale_port_reading_never_clears_the_duplicating_verdict() {
        let c = Arc::new(VerbsCounters::default());
        c.watched.store(1, Ordering::Release);
        let b = BackendCounters::Verbs(Arc::clone(&c));
        let mut h = Health::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // A reading at 0 frames, then one at 200 frames with 200 duplicates.
        assert!(h.sample(at(0), b.health_totals(0)).duplicating.is_none());
        c.port_duplicates.store(200, Ordering::Release);
        c.port_read_frames.store(200, Ordering::Release);
        assert!(h
            .sample(at(600), b.health_totals(210))
            .duplicating
            .is_some());
        assert!(h.duplicating);
        // 300 more frames, no reading since: nothing judged, the verdict holds.
        assert_eq!(h.sample(at(1200), b.health_totals(510)).duplicating, None);
        assert!(h.duplicating);
        // The next reading says the FPGA still sends each message twice.
        c.port_duplicates.store(500, Ordering::Release);
        c.port_read_frames.store(500, Ordering::Release);
        assert_eq!(h.sample(at(1800), b.health_totals(520)).duplicating, None);
        assert!(h.duplicating);
    }

    /// Soft counts duplicates as they come: its totals are the frames now.
    #[test]
    fn soft_totals_are_the_counters_now() {
        let c = Arc::new(SoftCounters::default());
        c.duplicates.store(7, Ordering::Release);
        let t = BackendCounters::Soft(c).health_totals(9);
        assert_eq!((t.frames, t.duplicates), (9, Some(7)));
    }
}
