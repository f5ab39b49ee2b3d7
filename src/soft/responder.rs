//! The RC responder state machine for SEND traffic: pure (packet in ->
//! verdict and replies out), no I/O, no clock, so it is tested exhaustively.
//! Behaviour follows IBA vol 1 ch. 9.7 and Linux `rxe_resp.c`:
//!
//! - in-sequence SEND packets are accepted into the current receive slot
//!   (FIRST/ONLY take a new slot from the posted list), the expected PSN
//!   advances, the MSN advances at each message end;
//! - ACKs are coalesced: one at least every `ack_every` AckReq packets and at
//!   every [`Responder::flush`] (the backend flushes whenever its input goes
//!   idle, i.e. after every receive batch), so a 16-deep sender never stalls;
//! - duplicates (PSN behind) are re-ACKed, never re-delivered;
//! - a PSN ahead of the expected one gets one PSN-sequence-error NAK (with the
//!   expected PSN) per gap, later ahead packets are dropped silently;
//! - a message start with no posted slot gets an RNR NAK with the configured
//!   min RNR timer and is dropped: the sender retries after the timer;
//! - unsupported opcodes, opcode sequence violations and bad lengths get an
//!   invalid-request NAK; a partial message is discarded;
//! - a peer restart (an FPGA re-programmed with the same host params starts
//!   again at the connection's first PSN): packets further from the expected
//!   PSN than any requester window allows ([`Responder::restart_distance`])
//!   are stale, dropped without an ACK (so the sender keeps them and resends);
//!   a message start at the first PSN is the restarted stream: the responder
//!   re-synchronises to it (expected PSN = the first PSN, MSN 0, an open
//!   message discarded) and counts a peer restart. Without this the restarted
//!   stream would be ACKed as old duplicates and never delivered.
//!   [`STALE_RUN`] stale packets in a row (a peer restarted at another PSN,
//!   or programmed with a wrong one) count a restart too, reported without a
//!   re-synchronisation: only the first PSN is a safe place to resume (no
//!   message of the new stream is skipped), so the responder keeps waiting
//!   for it and ACKs nothing meanwhile.

use std::collections::VecDeque;

use crate::wire::{psn, Bth, Opcode, Syndrome, ACK_UNLIMITED};

/// How deep in the free list a landed slot is looked for.
const PREFER_DEPTH: usize = 512;

/// Responder settings.
#[derive(Debug, Clone, Copy)]
pub struct ResponderConfig {
    /// Our QP number: packets for another QP are foreign.
    pub qpn: u32,
    /// Path MTU in bytes.
    pub pmtu: u32,
    /// Receive slot size: the largest message.
    pub slot_size: u32,
    /// Min RNR NAK timer code put in RNR NAKs.
    pub min_rnr_timer: u8,
    /// ACK at least every this many AckReq packets (the soft backend: 4, surf's window of
    /// un-ACKed messages, each with AckReq on its last packet).
    pub ack_every: u32,
}

/// A reply to send to the requester (an Acknowledge packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    /// ACK / NAK syndrome.
    pub syndrome: Syndrome,
    /// The PSN it refers to.
    pub psn: u32,
    /// Our MSN.
    pub msn: u32,
}

/// A completed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Done {
    /// Slot holding the message.
    pub slot: u32,
    /// Message length.
    pub len: u32,
    /// The immediate (host order), if the last packet carried one.
    pub imm: Option<u32>,
}

/// Why a packet was not placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// For another QP.
    WrongQp,
    /// Behind the expected PSN (re-ACKed).
    Duplicate,
    /// Ahead of the expected PSN.
    OutOfSequence,
    /// No posted slot at a message start (RNR NAK sent).
    NoSlot,
    /// Opcode not supported or out of order (invalid-request NAK sent).
    InvalidOpcode,
    /// Payload length violates pmtu (invalid-request NAK sent).
    BadLength,
    /// The message is larger than a receive slot (max_payload)
    /// (invalid-request NAK sent).
    TooLarge {
        /// Its length up to and with this packet (past the slot size).
        bytes: u32,
    },
    /// Further from the expected PSN than any requester window allows (not
    /// ACKed): the old stream's leftovers or a restarted peer's first packets.
    Stale,
}

/// Stale packets in a row that count as a peer restart even away from the
/// first PSN (more than a window of 4 surf messages of up to 4 packets).
pub const STALE_RUN: u32 = 16;

/// A peer restart the responder re-synchronised to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restart {
    /// The PSN expected before.
    pub expected_psn: u32,
    /// The restarted stream's PSN (the connection's first PSN, usually).
    pub psn: u32,
    /// Stale packets seen before it was recognised.
    pub stale_before: u32,
    /// True when the responder resumed at `psn` (the first PSN); false for a
    /// run of stale packets elsewhere (it waits for the first PSN).
    pub resynced: bool,
}

/// What to do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Copy the payload into `slot` at `offset`; when `done` is set the message
    /// is complete and the slot must be reported to the consumer.
    Place {
        /// Slot.
        slot: u32,
        /// Byte offset inside the slot.
        offset: u32,
        /// Set at the message end.
        done: Option<Done>,
    },
    /// Not placed.
    Drop(DropReason),
}

/// Responder counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResponderStats {
    /// Packets accepted.
    pub accepted: u64,
    /// Messages completed.
    pub messages: u64,
    /// ACKs emitted.
    pub acks: u64,
    /// RNR NAKs emitted.
    pub rnr_naks: u64,
    /// PSN sequence error NAKs emitted.
    pub seq_naks: u64,
    /// Invalid request NAKs emitted.
    pub invalid_naks: u64,
    /// Duplicate packets.
    pub duplicates: u64,
    /// Packets ahead of the expected PSN.
    pub out_of_sequence: u64,
    /// Packets for another QP.
    pub wrong_qp: u64,
    /// Stale packets (further from the expected PSN than a window allows; not ACKed).
    pub stale: u64,
    /// Peer restarts re-synchronised to.
    pub peer_restarts: u64,
}

#[derive(Debug, Clone, Copy)]
struct Partial {
    slot: u32,
    len: u32,
}

/// The responder.
#[derive(Debug)]
pub struct Responder {
    cfg: ResponderConfig,
    first_psn: u32,
    restart_distance: u32,
    stale_run: u32,
    /// A restart was counted for the current run of stale packets.
    restart_counted: bool,
    restarted: Option<Restart>,
    epsn: u32,
    msn: u32,
    partial: Option<Partial>,
    free: VecDeque<u32>,
    nak_outstanding: bool,
    unacked: u32,
    ack_due: bool,
    replies: Vec<Reply>,
    stats: ResponderStats,
}

impl Responder {
    /// A responder expecting `first_psn` next.
    pub fn new(cfg: ResponderConfig, first_psn: u32) -> Responder {
        // A requester keeps at most its window un-ACKed: surf's engine 4
        // messages. Allow 4 of the largest messages, and never less than 256
        // packets, before a PSN is implausible for a retransmission.
        let per_message = cfg.slot_size.div_ceil(cfg.pmtu.max(1)).max(1);
        Responder {
            cfg,
            first_psn: first_psn & psn::MASK,
            restart_distance: (4 * per_message).clamp(256, 1 << 22),
            stale_run: 0,
            restart_counted: false,
            restarted: None,
            epsn: first_psn & psn::MASK,
            msn: 0,
            partial: None,
            free: VecDeque::new(),
            nak_outstanding: false,
            unacked: 0,
            ack_due: false,
            replies: Vec::new(),
            stats: ResponderStats::default(),
        }
    }

    /// Makes `slot` available for a message.
    pub fn post(&mut self, slot: u32) {
        self.free.push_back(slot);
    }
    /// Posted slots not yet used.
    pub fn posted(&self) -> usize {
        self.free.len()
    }
    /// The next expected PSN.
    pub fn expected_psn(&self) -> u32 {
        self.epsn
    }
    /// Our MSN.
    pub fn msn(&self) -> u32 {
        self.msn
    }
    /// How far (in packets) from the expected PSN a packet may be and
    /// still be a retransmission or a loss gap; further is stale.
    pub fn restart_distance(&self) -> u32 {
        self.restart_distance
    }
    /// The last peer restart re-synchronised to, once (then None).
    pub fn take_restart(&mut self) -> Option<Restart> {
        self.restarted.take()
    }
    /// Counters.
    pub fn stats(&self) -> ResponderStats {
        self.stats
    }
    /// The slot and offset the next in-sequence payload goes to, if known.
    pub fn next_target(&self) -> Option<(u32, u32)> {
        match self.partial {
            Some(p) => Some((p.slot, p.len)),
            None => self.free.front().map(|&s| (s, 0)),
        }
    }

    /// The path MTU in bytes.
    pub fn pmtu(&self) -> u32 {
        self.cfg.pmtu
    }
    /// The message being reassembled: its slot and bytes so far.
    pub fn partial(&self) -> Option<(u32, u32)> {
        self.partial.map(|p| (p.slot, p.len))
    }
    /// Posted slots in the order message starts will take them.
    pub fn free_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.free.iter().copied()
    }

    fn reply(&mut self, syndrome: Syndrome, psn: u32) {
        // An ACK is cumulative: one still pending (the same receive batch:
        // replies leave together at its end) is replaced by the later one,
        // so a batch of many messages sends one ACK, not one per 4 messages
        // that would leave at the same moment.
        if let (Syndrome::Ack(_), Some(last)) = (syndrome, self.replies.last_mut()) {
            if matches!(last.syndrome, Syndrome::Ack(_)) {
                *last = Reply {
                    syndrome,
                    psn,
                    msn: self.msn,
                };
                return;
            }
        }
        match syndrome {
            Syndrome::Ack(_) => self.stats.acks += 1,
            Syndrome::RnrNak(_) => self.stats.rnr_naks += 1,
            Syndrome::PsnSeqErr => self.stats.seq_naks += 1,
            _ => self.stats.invalid_naks += 1,
        }
        if !matches!(syndrome, Syndrome::Ack(_)) {
            // A NAK acknowledges everything before its PSN.
            self.unacked = 0;
            self.ack_due = false;
        }
        self.replies.push(Reply {
            syndrome,
            psn,
            msn: self.msn,
        });
    }

    fn ack_now(&mut self) {
        self.unacked = 0;
        self.ack_due = false;
        let last = psn::add(self.epsn, psn::MASK); // epsn - 1
        self.reply(ACK_UNLIMITED, last);
    }

    /// An invalid request: NAK it and discard the open message (its slot
    /// goes back to the front of the posted list).
    fn invalid(&mut self, bth: &Bth, why: DropReason) -> DropReason {
        if let Some(p) = self.partial.take() {
            self.free.push_front(p.slot);
        }
        self.reply(Syndrome::InvalidRequest, bth.psn);
        why
    }

    /// Handles one request packet with `payload_len` payload bytes (pad
    /// removed). The stages are rxe_resp.c's: check_psn -> check_op_seq /
    /// check_op_valid -> check_length -> check_resource -> execute ->
    /// complete -> acknowledge; a stage that rejects the packet returns why.
    pub fn on_packet(&mut self, bth: &Bth, imm: Option<u32>, payload_len: usize) -> Verdict {
        self.on_packet_in(bth, imm, payload_len, None)
    }

    /// [`Responder::on_packet`] for a packet whose payload already sits at
    /// the start of posted slot `landed`: a message start takes that slot
    /// (if it is posted) instead of the next in posting order, so a payload
    /// the socket wrote straight into a slot stays there. Which posted slot
    /// a message fills is the receiver's choice; completions name it.
    pub fn on_packet_in(
        &mut self,
        bth: &Bth,
        imm: Option<u32>,
        payload_len: usize,
        landed: Option<u32>,
    ) -> Verdict {
        match self.receive(bth, imm, payload_len as u32, landed) {
            Ok(v) => v,
            Err(why) => Verdict::Drop(why),
        }
    }

    fn receive(
        &mut self,
        bth: &Bth,
        imm: Option<u32>,
        len: u32,
        landed: Option<u32>,
    ) -> Result<Verdict, DropReason> {
        self.check_qp(bth)?;
        self.check_psn(bth)?;
        self.check_op(bth)?;
        self.check_length(bth, len)?;
        if self.partial.is_none() {
            self.prefer(landed);
        }
        let (slot, offset) = self.check_resource(bth)?;
        if offset + len > self.cfg.slot_size {
            let bytes = offset + len;
            return Err(self.invalid(bth, DropReason::TooLarge { bytes }));
        }
        let done = self.execute(bth.opcode, slot, offset + len, imm);
        self.acknowledge(bth);
        Ok(Verdict::Place { slot, offset, done })
    }

    /// Packets for another QP are foreign.
    fn check_qp(&mut self, bth: &Bth) -> Result<(), DropReason> {
        if bth.dest_qp != self.cfg.qpn {
            self.stats.wrong_qp += 1;
            return Err(DropReason::WrongQp);
        }
        Ok(())
    }

    /// Behind: a duplicate (re-ACKed at the next flush). Ahead: one
    /// sequence-error NAK per gap, then silence until the gap is filled.
    fn check_psn(&mut self, bth: &Bth) -> Result<(), DropReason> {
        let d = psn::diff(bth.psn, self.epsn);
        if d.unsigned_abs() > self.restart_distance {
            return self.check_restart(bth);
        }
        if d < 0 {
            self.stats.duplicates += 1;
            self.ack_due = true;
            return Err(DropReason::Duplicate);
        }
        if d > 0 {
            self.stats.out_of_sequence += 1;
            if !self.nak_outstanding {
                self.nak_outstanding = true;
                self.reply(Syndrome::PsnSeqErr, self.epsn);
            }
            return Err(DropReason::OutOfSequence);
        }
        Ok(())
    }

    /// A stale packet: the restarted stream when it starts a message at the
    /// first PSN (or after a run of stale packets); else dropped, not ACKed.
    fn check_restart(&mut self, bth: &Bth) -> Result<(), DropReason> {
        if !bth.opcode.starts_message() || bth.psn != self.first_psn {
            self.stale_run = self.stale_run.saturating_add(1);
            self.stats.stale += 1;
            if self.stale_run >= STALE_RUN && !self.restart_counted {
                self.count_restart(bth.psn, false);
            }
            return Err(DropReason::Stale);
        }
        if self.restart_counted {
            // Counted at the run of stale packets: report the re-synchronisation.
            self.restarted = Some(Restart {
                expected_psn: self.epsn,
                psn: bth.psn,
                stale_before: self.stale_run,
                resynced: true,
            });
        } else {
            self.count_restart(bth.psn, true);
        }
        if let Some(p) = self.partial.take() {
            self.free.push_front(p.slot);
        }
        self.epsn = bth.psn;
        self.msn = 0;
        self.stale_run = 0;
        self.restart_counted = false;
        self.nak_outstanding = false;
        self.unacked = 0;
        self.ack_due = false;
        Ok(())
    }

    fn count_restart(&mut self, psn: u32, resynced: bool) {
        self.stats.peer_restarts += 1;
        self.restart_counted = true;
        self.restarted = Some(Restart {
            expected_psn: self.epsn,
            psn,
            stale_before: self.stale_run,
            resynced,
        });
    }

    /// check_op_valid + check_op_seq: a SEND, and FIRST/ONLY exactly when no
    /// message is open.
    fn check_op(&mut self, bth: &Bth) -> Result<(), DropReason> {
        let op = bth.opcode;
        // Among SENDs, a Middle or Last continues a message.
        let continues = !op.starts_message();
        if !op.is_send() || continues != self.partial.is_some() {
            return Err(self.invalid(bth, DropReason::InvalidOpcode));
        }
        Ok(())
    }

    /// FIRST and MIDDLE carry exactly one pmtu; nothing carries more.
    fn check_length(&mut self, bth: &Bth, len: u32) -> Result<(), DropReason> {
        let full_pmtu = matches!(bth.opcode, Opcode::SendFirst | Opcode::SendMiddle);
        if (full_pmtu && len != self.cfg.pmtu) || len > self.cfg.pmtu {
            return Err(self.invalid(bth, DropReason::BadLength));
        }
        Ok(())
    }

    /// Moves posted slot `landed` to the front of the free list (looking a
    /// window's worth deep: a landing guess is never further off).
    fn prefer(&mut self, landed: Option<u32>) {
        let Some(s) = landed else {
            return;
        };
        if self.free.front() == Some(&s) {
            return;
        }
        if let Some(at) = self.free.iter().take(PREFER_DEPTH).position(|&f| f == s) {
            self.free.remove(at);
            self.free.push_front(s);
        }
    }

    /// Where the payload goes: the open message's slot, or a posted slot
    /// at a message start (none posted: RNR NAK, the sender retries).
    fn check_resource(&mut self, bth: &Bth) -> Result<(u32, u32), DropReason> {
        if let Some(p) = self.partial {
            return Ok((p.slot, p.len));
        }
        match self.free.front() {
            Some(&s) => Ok((s, 0)),
            None => {
                self.nak_outstanding = true;
                let timer = self.cfg.min_rnr_timer;
                self.reply(Syndrome::RnrNak(timer), bth.psn);
                Err(DropReason::NoSlot)
            }
        }
    }

    /// Accepts the packet (the message now holds `len` bytes in `slot`);
    /// at the message end, completes it.
    fn execute(&mut self, op: Opcode, slot: u32, len: u32, imm: Option<u32>) -> Option<Done> {
        if self.partial.is_none() {
            self.free.pop_front();
        }
        self.stats.accepted += 1;
        self.nak_outstanding = false;
        self.stale_run = 0;
        self.restart_counted = false;
        self.epsn = psn::add(self.epsn, 1);
        if !op.ends_message() {
            self.partial = Some(Partial { slot, len });
            return None;
        }
        self.partial = None;
        self.msn = psn::add(self.msn, 1);
        self.stats.messages += 1;
        Some(Done { slot, len, imm })
    }

    /// Coalesced ACKs: one at least every `ack_every` AckReq packets (and at
    /// every flush).
    fn acknowledge(&mut self, bth: &Bth) {
        if bth.ack_req {
            self.unacked += 1;
            if self.unacked >= self.cfg.ack_every {
                self.ack_now();
            }
        }
    }

    /// The input went idle: emit the coalesced ACK, if one is owed.
    pub fn flush(&mut self) {
        if self.unacked > 0 || self.ack_due {
            self.ack_now();
        }
    }

    /// Replies produced since the last call, in order.
    pub fn take_replies(&mut self) -> std::vec::Drain<'_, Reply> {
        self.replies.drain(..)
    }
}

#[cfg(test)]
#[path = "responder_tests.rs"]
mod tests;
