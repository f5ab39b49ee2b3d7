//! The RC requester state machine of the FPGA emulator, behaving like surf's
//! RoCEv2 engine (fc56630, measured in simulation: tests/firmware): one SEND
//! with immediate per frame (SEND_ONLY_WITH_IMMEDIATE, or FIRST / MIDDLE /
//! LAST_WITH_IMMEDIATE above the path MTU), AckReq on the last packet of each
//! message only, at most `window` messages started and not acknowledged (the
//! engine: 4), go-back-N retransmission from a NAK's PSN or on timeout, RNR
//! waits of the NAK's timer with retry (rnr_retry 7 = forever), and after
//! retry_cnt timeouts a failed frame (the engine's status 20, the QP dead).
//! Pure: no I/O, time (ns) passed in.

use std::collections::VecDeque;

use crate::config::RNR_TIMER_US;
use crate::wire::{psn, Aeth, Opcode, Syndrome};

/// Requester settings.
#[derive(Debug, Clone, Copy)]
pub struct RequesterConfig {
    /// The responder's QP number.
    pub dest_qpn: u32,
    /// PSN of the first packet (the host's SQ PSN under surf's convention).
    pub start_psn: u32,
    /// Path MTU in bytes.
    pub pmtu: u32,
    /// Messages (work requests) started and not acknowledged at most: the
    /// engine's send window, counted in messages, not packets or bytes
    /// (surf fc56630: 4).
    pub window: usize,
    /// Retransmit timeout in ns (IB timeout code 14 = 4.096 us * 2^14 = 67 ms).
    pub timeout_ns: u64,
    /// Timeout retries before giving up (IB retry_cnt, 0..7).
    pub retry_cnt: u32,
    /// RNR retries before giving up; 7 means forever (IB rnr_retry).
    pub rnr_retry: u32,
}

impl RequesterConfig {
    /// IB timeout code -> ns (4.096 us * 2^code; 0 = infinite, mapped to u64::MAX).
    pub fn timeout_from_code(code: u8) -> u64 {
        if code == 0 {
            u64::MAX
        } else {
            4096u64 << code.min(31)
        }
    }
}

/// Requester counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequesterStats {
    /// Messages submitted.
    pub submitted: u64,
    /// Messages acknowledged.
    pub acked: u64,
    /// Bytes acknowledged.
    pub bytes_acked: u64,
    /// Packets handed out for transmission (first time).
    pub packets: u64,
    /// Packets handed out again (retransmissions).
    pub retransmits: u64,
    /// ACK packets processed.
    pub acks: u64,
    /// RNR NAKs received.
    pub rnr_naks: u64,
    /// PSN sequence error NAKs received.
    pub seq_naks: u64,
    /// Timeouts (go-back-N from the oldest unacknowledged packet).
    pub timeouts: u64,
    /// ACKs that acknowledged nothing new.
    pub stale_acks: u64,
}

impl std::ops::Add for RequesterStats {
    type Output = RequesterStats;
    /// Field-wise sum (a restarted requester's counters on top of the old one's).
    fn add(self, o: RequesterStats) -> RequesterStats {
        RequesterStats {
            submitted: self.submitted + o.submitted,
            acked: self.acked + o.acked,
            bytes_acked: self.bytes_acked + o.bytes_acked,
            packets: self.packets + o.packets,
            retransmits: self.retransmits + o.retransmits,
            acks: self.acks + o.acks,
            rnr_naks: self.rnr_naks + o.rnr_naks,
            seq_naks: self.seq_naks + o.seq_naks,
            timeouts: self.timeouts + o.timeouts,
            stale_acks: self.stale_acks + o.stale_acks,
        }
    }
}

/// The requester failed for good (a fatal NAK or retries exhausted); the
/// messages not acknowledged are lost and counted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fatal {
    /// Why.
    pub reason: String,
    /// True when retries ran out (the host stopped answering or kept
    /// refusing with RNR NAKs); false for a fatal NAK.
    pub gave_up: bool,
    /// Messages submitted but never acknowledged.
    pub lost_messages: u64,
}

struct Msg {
    data: Vec<u8>,
    imm: u32,
}

#[derive(Debug, Clone, Copy)]
struct TxPkt {
    psn: u32,
    opcode: Opcode,
    msg: u64,
    offset: u32,
    len: u32,
    last_tx: u64,
}

/// Where a packet's payload lies: a message (absolute index) and a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    msg: u64,
    offset: u32,
    len: u32,
}

impl Span {
    /// The message's absolute index (see [`Requester::next_msg`]).
    pub(super) fn msg(&self) -> u64 {
        self.msg
    }
    /// Where in its message the payload starts.
    pub(super) fn offset(&self) -> usize {
        self.offset as usize
    }
    /// Payload bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }
    /// No payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A packet to put on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outgoing<'a> {
    /// PSN.
    pub psn: u32,
    /// Opcode.
    pub opcode: Opcode,
    /// Immediate (for *_WITH_IMMEDIATE).
    pub imm: Option<u32>,
    /// Payload slice.
    pub payload: &'a [u8],
    /// Where the payload lies, to read it again later
    /// ([`Requester::payload`]) while the message is unacknowledged.
    pub span: Span,
    /// True for a retransmission.
    pub retransmit: bool,
    /// BTH AckReq: set on the last packet of a message only, like the engine.
    pub ack_req: bool,
}

/// The requester.
pub struct Requester {
    cfg: RequesterConfig,
    msgs: VecDeque<Msg>,
    first_msg: u64,
    /// Next message (absolute index) and offset to packetize.
    cursor: (u64, u32),
    window: VecDeque<TxPkt>,
    send_at: usize,
    sent_ever: usize,
    next_psn: u32,
    rnr_until: Option<u64>,
    retries: u32,
    rnr_retries: u32,
    fatal: Option<Fatal>,
    stats: RequesterStats,
    /// Buffers of acknowledged messages, for the next ones (no allocation
    /// per frame in a steady stream).
    spent: Vec<Vec<u8>>,
    /// The most messages ever queued at once: as many spent buffers are
    /// kept (a caller that never takes them holds at most twice what it
    /// already had in flight; one that does never allocates again).
    peak_msgs: usize,
}

impl Requester {
    /// A requester starting at `cfg.start_psn`.
    pub fn new(cfg: RequesterConfig) -> Requester {
        Requester {
            cfg,
            msgs: VecDeque::new(),
            first_msg: 0,
            cursor: (0, 0),
            window: VecDeque::new(),
            send_at: 0,
            sent_ever: 0,
            next_psn: cfg.start_psn & psn::MASK,
            rnr_until: None,
            retries: 0,
            rnr_retries: 0,
            fatal: None,
            stats: RequesterStats::default(),
            spent: Vec::new(),
            peak_msgs: 0,
        }
    }

    /// A buffer of an acknowledged message to fill for the next one, if any.
    pub fn take_spent(&mut self) -> Option<Vec<u8>> {
        self.spent.pop()
    }

    /// Queues a message (a frame) with its immediate.
    pub fn submit(&mut self, data: Vec<u8>, imm: u32) {
        self.msgs.push_back(Msg { data, imm });
        self.peak_msgs = self.peak_msgs.max(self.msgs.len());
        self.stats.submitted += 1;
    }

    /// The absolute index the next submitted message gets (0 for a new
    /// requester).
    pub fn next_msg(&self) -> u64 {
        self.first_msg + self.msgs.len() as u64
    }

    /// Messages submitted and not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.msgs.len()
    }
    /// Nothing left to send or acknowledge.
    pub fn is_idle(&self) -> bool {
        self.msgs.is_empty()
    }
    /// Counters.
    pub fn stats(&self) -> RequesterStats {
        self.stats
    }
    /// The fatal error, once one happened.
    pub fn fatal(&self) -> Option<&Fatal> {
        self.fatal.as_ref()
    }
    /// The PSN the next new packet gets.
    pub fn next_psn(&self) -> u32 {
        self.next_psn
    }

    /// The payload at `span`, while its message is unacknowledged (the
    /// bytes a sender reads where they lie instead of copying them into
    /// each packet); None once it was acknowledged.
    pub fn payload(&self, span: Span) -> Option<&[u8]> {
        let i = span.msg.checked_sub(self.first_msg)?;
        let m = self.msgs.get(usize::try_from(i).ok()?)?;
        m.data
            .get(span.offset as usize..(span.offset + span.len) as usize)
    }

    fn msg(&self, abs: u64) -> &Msg {
        &self.msgs[(abs - self.first_msg) as usize]
    }

    fn fail(&mut self, reason: String, gave_up: bool) {
        if self.fatal.is_none() {
            let lost = self.msgs.len() as u64;
            self.fatal = Some(Fatal {
                reason,
                gave_up,
                lost_messages: lost,
            });
            self.window.clear();
            self.msgs.clear();
            self.send_at = 0;
        }
    }

    /// A new packet may be built: it continues a started message, or fewer
    /// than `window` messages are started and not acknowledged.
    fn window_open(&self) -> bool {
        let (abs, offset) = self.cursor;
        offset > 0 || ((abs - self.first_msg) as usize) < self.cfg.window
    }

    /// Builds the next new packet from the message queue, if any.
    fn packetize(&mut self) -> bool {
        let (abs, offset) = self.cursor;
        if abs - self.first_msg >= self.msgs.len() as u64 {
            return false;
        }
        let total = self.msg(abs).data.len() as u32;
        let pmtu = self.cfg.pmtu;
        let len = (total - offset).min(pmtu);
        let last = offset + len >= total;
        let opcode = Opcode::send_with_imm(offset == 0, last);
        self.window.push_back(TxPkt {
            psn: self.next_psn,
            opcode,
            msg: abs,
            offset,
            len,
            last_tx: 0,
        });
        self.next_psn = psn::add(self.next_psn, 1);
        self.cursor = if last {
            (abs + 1, 0)
        } else {
            (abs, offset + len)
        };
        true
    }

    /// The next packet to transmit at `now`, if the window, an RNR wait and
    /// the queue allow one.
    pub fn poll_transmit(&mut self, now: u64) -> Option<Outgoing<'_>> {
        if self.fatal.is_some() {
            return None;
        }
        if let Some(t) = self.rnr_until {
            if now < t {
                return None;
            }
            self.rnr_until = None;
        }
        if self.send_at == self.window.len() && (!self.window_open() || !self.packetize()) {
            return None;
        }
        let i = self.send_at;
        self.send_at += 1;
        let retransmit = i < self.sent_ever;
        if retransmit {
            self.stats.retransmits += 1;
        } else {
            self.stats.packets += 1;
            self.sent_ever = i + 1;
        }
        self.window[i].last_tx = now;
        let p = self.window[i];
        let m = self.msg(p.msg);
        Some(Outgoing {
            psn: p.psn,
            opcode: p.opcode,
            imm: p.opcode.has_imm().then_some(m.imm),
            payload: &m.data[p.offset as usize..(p.offset + p.len) as usize],
            span: Span {
                msg: p.msg,
                offset: p.offset,
                len: p.len,
            },
            retransmit,
            ack_req: p.opcode.ends_message(),
        })
    }

    /// Drops acknowledged packets: those before `psn` (and `psn` itself when
    /// `inclusive`). Returns how many.
    fn ack_through(&mut self, upto: u32, inclusive: bool) -> usize {
        let mut n = 0;
        while let Some(front) = self.window.front() {
            let d = psn::diff(front.psn, upto);
            if d > 0 || (d == 0 && !inclusive) {
                break;
            }
            // Never acknowledge what was never sent.
            if n >= self.sent_ever {
                break;
            }
            let p = self.window.pop_front().expect("front exists");
            n += 1;
            if p.opcode.ends_message() {
                let m = self
                    .msgs
                    .pop_front()
                    .expect("message of an in-flight packet");
                self.first_msg += 1;
                self.stats.acked += 1;
                self.stats.bytes_acked += m.data.len() as u64;
                if self.spent.len() < self.peak_msgs {
                    self.spent.push(m.data);
                }
            }
        }
        self.send_at = self.send_at.saturating_sub(n);
        self.sent_ever = self.sent_ever.saturating_sub(n);
        if n > 0 {
            self.retries = 0;
        }
        n
    }

    /// Handles an Acknowledge packet (BTH PSN + AETH) at `now`.
    pub fn on_ack(&mut self, ack_psn: u32, aeth: Aeth, now: u64) {
        if self.fatal.is_some() {
            return;
        }
        self.stats.acks += 1;
        match aeth.syndrome {
            Syndrome::Ack(_) => {
                if self.ack_through(ack_psn, true) == 0 {
                    self.stats.stale_acks += 1;
                }
                self.rnr_retries = 0;
            }
            Syndrome::RnrNak(code) => {
                self.stats.rnr_naks += 1;
                if self.ack_through(ack_psn, false) > 0 {
                    // Progress before the NAK: the engine counts RNR retries anew.
                    self.rnr_retries = 0;
                }
                if self.window.front().map(|p| p.psn) != Some(ack_psn) {
                    return; // stale
                }
                self.rnr_retries += 1;
                if self.cfg.rnr_retry != 7 && self.rnr_retries > self.cfg.rnr_retry {
                    self.fail(
                        format!(
                            "RNR retries exhausted ({}) at PSN {ack_psn:#x}",
                            self.cfg.rnr_retry
                        ),
                        true,
                    );
                    return;
                }
                let wait_ns = RNR_TIMER_US[(code & 31) as usize] as u64 * 1000;
                self.rnr_until = Some(now + wait_ns);
                self.send_at = 0;
            }
            Syndrome::PsnSeqErr => {
                self.stats.seq_naks += 1;
                self.ack_through(ack_psn, false);
                if self.window.front().map(|p| p.psn) == Some(ack_psn) {
                    self.send_at = 0;
                }
            }
            other => self.fail(
                format!(
                    "fatal NAK {other:?} (syndrome {:#04x}) at PSN {ack_psn:#x}",
                    other.byte()
                ),
                false,
            ),
        }
    }

    /// When the next timer (RNR wait end or retransmit timeout) fires, if any.
    pub fn next_deadline(&self) -> Option<u64> {
        let rto = if self.sent_ever > 0 {
            self.window
                .iter()
                .take(self.sent_ever)
                .map(|p| p.last_tx)
                .min()
                .map(|t| t.saturating_add(self.cfg.timeout_ns))
        } else {
            None
        };
        match (self.rnr_until, rto) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Fires a retransmit timeout if one is due at `now` (go-back-N from the
    /// oldest unacknowledged packet).
    pub fn on_timer(&mut self, now: u64) {
        if self.fatal.is_some() || self.sent_ever == 0 || self.rnr_until.is_some_and(|t| now < t) {
            return;
        }
        let oldest = self
            .window
            .iter()
            .take(self.sent_ever)
            .map(|p| p.last_tx)
            .min();
        if oldest.is_some_and(|t| now >= t.saturating_add(self.cfg.timeout_ns)) {
            self.stats.timeouts += 1;
            self.retries += 1;
            if self.retries > self.cfg.retry_cnt {
                let at = self.window.front().map(|p| p.psn).unwrap_or(0);
                self.fail(format!(
                    "transport retries exhausted ({} timeouts) at PSN {at:#x}: the host does not answer",
                    self.cfg.retry_cnt
                ), true);
                return;
            }
            self.send_at = 0;
        }
    }
}

#[cfg(test)]
#[path = "requester_tests.rs"]
mod tests;
