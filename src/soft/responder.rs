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
//!   invalid-request NAK; a partial message is discarded.

use std::collections::VecDeque;

use crate::wire::{psn, Bth, Opcode, Syndrome, ACK_UNLIMITED};

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
    /// ACK at least every this many AckReq packets (8: half the FPGA's window).
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
    /// Payload length violates pmtu or the slot size (invalid-request NAK sent).
    BadLength,
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
        Responder {
            cfg,
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
        match self.receive(bth, imm, payload_len as u32) {
            Ok(v) => v,
            Err(why) => Verdict::Drop(why),
        }
    }

    fn receive(&mut self, bth: &Bth, imm: Option<u32>, len: u32) -> Result<Verdict, DropReason> {
        self.check_qp(bth)?;
        self.check_psn(bth)?;
        self.check_op(bth)?;
        self.check_length(bth, len)?;
        let (slot, offset) = self.check_resource(bth)?;
        if offset + len > self.cfg.slot_size {
            return Err(self.invalid(bth, DropReason::BadLength));
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

    /// check_op_valid + check_op_seq: a SEND, and FIRST/ONLY exactly when no
    /// message is open.
    fn check_op(&mut self, bth: &Bth) -> Result<(), DropReason> {
        let op = bth.opcode;
        let continues = matches!(
            op,
            Opcode::SendMiddle | Opcode::SendLast | Opcode::SendLastImm
        );
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
