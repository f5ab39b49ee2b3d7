//! The soft driver's per-packet pipeline: one received [`Datagram`], read
//! from the socket once, goes through filter and parse (once) -> ICRC check
//! -> responder -> place (in place where it landed, else copied) -> its
//! message's completion. The socket is touched again only when a landing
//! guess missed: then the rest of the batch is gathered and this packet
//! read anew, once per batch.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;

use super::counts::DriverCounts;
use super::landing::Planner;
use super::responder::{DropReason, Restart, Verdict};
use super::{Link, SoftBackend};
use crate::error::{Error, ErrorKind, Result};
use crate::net::{self, Body, Datagram, Landing, UdpIo};
use crate::server::latency::Histogram;
use crate::server::{Completion, CompletionKind, Slab};
use crate::wire::icrc::IcrcCache;
use crate::wire::{Headers, Opcode};

/// What the pipeline keeps beside the socket (apart from it, so that a
/// [`Datagram`] borrowed from the socket can go through every stage).
pub(super) struct Pipeline {
    pub(super) own: DriverCounts,
    pub(super) slab: Arc<Slab>,
    pub(super) planner: Planner,
    /// Raw capture: the received ICRCs' pseudo-header CRC state (one
    /// peer: kept).
    icrc: IcrcCache,
    /// Latency measured (`ServerConfig::measure_latency`): where the ACK
    /// turnaround goes, and the receive stamps of the packets that asked
    /// for an ACK not sent yet.
    pub(super) turnaround: Option<Arc<Histogram>>,
    pub(super) ack_due: Vec<u64>,
    /// Messages refused for being larger than a slot (max_payload): the
    /// first is a warning, the rest debug lines.
    too_large: u64,
    /// For the logs.
    local: SocketAddrV4,
    /// Placed this batch, the last packet that began a merged datagram:
    /// whether it continued a message (`UdpIo::note_merge_start`).
    pub(super) merge_start: Option<bool>,
}

/// One receive batch in progress.
pub(super) struct Batch {
    /// Packets received.
    pub(super) n: usize,
    /// Set at the first packet that did not land where it belongs: from
    /// there on the batch is gathered and copied (the slow path).
    pub(super) missed: bool,
}

/// A parsed request packet and where its payload was scattered, if it was.
#[derive(Debug, Clone, Copy)]
struct Request {
    bth: crate::wire::Bth,
    imm: Option<u32>,
    /// Where its payload starts in the packet (its headers' length).
    payload_at: usize,
    payload_len: usize,
    landed: Option<Landing>,
}

/// What parsing a datagram found.
enum Parsed {
    Request(Request),
    /// Counted and dropped.
    Skip,
    /// In pieces, or not landed as planned: gather, then parse again.
    Gather,
}

/// True when the packet may set where ACKs go (`peer_udp_port` 0): the
/// responder took it as this QP's stream at its head: placed (it advanced
/// the stream), or in sequence and refused (an RNR or invalid-request NAK,
/// at the expected PSN). Not: another QP's, stale, ahead of the expected
/// PSN, or a duplicate (behind it: anyone who saw the stream can send one;
/// its re-ACK goes where the stream's ACKs go). The real FPGA's next
/// packet in sequence teaches the port again.
fn steers_replies(v: &Verdict) -> bool {
    !matches!(
        v,
        Verdict::Drop(
            DropReason::WrongQp
                | DropReason::Stale
                | DropReason::OutOfSequence
                | DropReason::Duplicate
        )
    )
}

/// A landing guess missed at packet `i` (the first of the batch to miss):
/// read it and the rest of the batch the slow way, before any copy can
/// overwrite where they landed; returns packet `i` read anew, whole.
fn miss<'a>(io: &'a mut UdpIo, slab: &Slab, batch: &mut Batch, i: usize) -> Result<Datagram<'a>> {
    batch.missed = true;
    io.gather_rest(i, batch.n, slab)?;
    Ok(io.datagram(i))
}

impl SoftBackend {
    /// Packet `i` of the batch: read once -> filter and parse -> ICRC ->
    /// responder -> place -> completion.
    pub(super) fn receive(
        &mut self,
        link: &mut Link,
        batch: &mut Batch,
        i: usize,
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        self.rx.own.packets_rx += 1;
        let mut d = self.io.datagram(i);
        if !self.rx.accepts(link.peer_ip, &d) {
            return Ok(());
        }
        let req = match self.rx.parse(&d) {
            Parsed::Request(r) => r,
            Parsed::Skip => return Ok(()),
            // Only before the batch missed: from there on all is whole.
            Parsed::Gather => {
                // The guess was wrong (place, headers or size differ).
                d = miss(&mut self.io, &self.rx.slab, batch, i)?;
                match self.rx.parse(&d) {
                    Parsed::Request(r) => r,
                    _ => return Ok(()),
                }
            }
        };
        if !self.rx.icrc_ok(&d, req.bth.psn) {
            return Ok(());
        }
        let Some((slot, offset, done)) = self.rx.respond(link, &d, &req) else {
            return Ok(());
        };
        if matches!(req.landed, Some(l) if l.slot == slot && l.offset == offset) {
            self.rx.own.payload_direct += 1;
        } else {
            // Once the batch missed, the rest was gathered: `d` is whole.
            if !batch.missed {
                d = miss(&mut self.io, &self.rx.slab, batch, i)?;
            }
            self.rx.copy(&d, &req, slot, offset)?;
        }
        if d.starts_merge {
            self.rx.merge_start = Some(offset > 0);
        }
        let head = req.bth.opcode.header_len() as u32;
        let len = req.payload_len as u32;
        self.rx.planner.learn(offset, head, len, done.is_some());
        if let Some(d_) = done {
            let kind = CompletionKind::Recv {
                len: d_.len,
                imm: d_.imm,
            };
            out.push(Completion {
                slot: d_.slot,
                kind,
                rx_ns: d.rx_ns,
            });
        }
        Ok(())
    }
}

impl Pipeline {
    pub(super) fn new(slab: &Arc<Slab>, local: SocketAddrV4) -> Pipeline {
        Pipeline {
            own: DriverCounts::default(),
            slab: Arc::clone(slab),
            planner: Planner::default(),
            icrc: IcrcCache::default(),
            turnaround: None,
            ack_due: Vec::new(),
            too_large: 0,
            local,
            merge_start: None,
        }
    }

    /// True when `d` is usable and from the FPGA's address; else counted.
    fn accepts(&mut self, peer_ip: Ipv4Addr, d: &Datagram) -> bool {
        if d.truncated {
            // Longer than MAX_DATAGRAM, or (raw capture) an IP/UDP header
            // that does not add up.
            self.own.malformed += 1;
            log::debug!(
                "datagram from {} truncated (> {} bytes) or with a bad IP/UDP header",
                d.from,
                net::MAX_DATAGRAM
            );
            return false;
        }
        if *d.from.ip() != peer_ip {
            self.own.foreign += 1;
            return false;
        }
        true
    }

    /// Reads `d`'s headers: in place when it landed as planned (and they
    /// say it belongs there), else from the whole packet.
    fn parse(&mut self, d: &Datagram) -> Parsed {
        let bytes = match d.body {
            Body::Landed { head, landing, .. } => {
                let fits = Headers::parse(head, d.len).ok().filter(|h| {
                    h.bth.opcode.is_send()
                        && h.len == landing.head as usize
                        && h.payload_len <= landing.len as usize
                });
                return match fits {
                    Some(h) => Parsed::Request(request(h, Some(landing))),
                    None => Parsed::Gather,
                };
            }
            Body::Scattered => return Parsed::Gather,
            Body::Whole(b) => b,
        };
        match Headers::parse(bytes, bytes.len()) {
            Err(e) => {
                self.own.malformed += 1;
                log::debug!("malformed packet from {}: {e}", d.from);
                Parsed::Skip
            }
            // We only respond; an Acknowledge is not for us.
            Ok(h) if h.bth.opcode == Opcode::Acknowledge => {
                self.own.foreign += 1;
                Parsed::Skip
            }
            Ok(h) => Parsed::Request(request(h, None)),
        }
    }

    /// Raw capture: drops a packet whose ICRC is wrong (the requester
    /// resends it after our sequence NAK for the next one, or its timeout).
    fn icrc_ok(&mut self, d: &Datagram, psn: u32) -> bool {
        match d.icrc_ok(&mut self.icrc, &self.slab) {
            None => self.own.icrc_unchecked += 1,
            Some(true) => self.own.icrc_checked += 1,
            Some(false) => {
                self.own.icrc_errors += 1;
                log::debug!("bad ICRC on PSN {psn:#08x} from {}: dropped", d.from);
                return false;
            }
        }
        true
    }

    /// The responder's verdict on `req`: where to place its payload (slot,
    /// offset, the message it ends), or None (dropped; counted by the
    /// responder, the planner told).
    fn respond(
        &mut self,
        link: &mut Link,
        d: &Datagram,
        req: &Request,
    ) -> Option<(u32, u32, Option<super::responder::Done>)> {
        // A payload that landed at the start of a posted slot stays there.
        let landed = req.landed.filter(|l| l.offset == 0).map(|l| l.slot);
        let verdict = link
            .resp
            .on_packet_in(&req.bth, req.imm, req.payload_len, landed);
        if steers_replies(&verdict) {
            link.reply_port = Some(d.from.port());
        }
        if let Some(r) = link.resp.take_restart() {
            // The open message (if any) was discarded with the old stream.
            self.planner.discard_message();
            log_restart(r, link.resp.stats().peer_restarts);
        }
        match verdict {
            Verdict::Place { slot, offset, done } => {
                if req.bth.ack_req && self.turnaround.is_some() {
                    self.ack_due.push(d.rx_ns);
                }
                return Some((slot, offset, done));
            }
            Verdict::Drop(DropReason::TooLarge { bytes }) => {
                self.planner.discard_message();
                self.log_too_large(bytes, req.bth.psn);
            }
            // A partial message was discarded with it.
            Verdict::Drop(DropReason::InvalidOpcode | DropReason::BadLength) => {
                self.planner.discard_message()
            }
            // Counted by the responder.
            Verdict::Drop(_) => {}
        }
        None
    }

    /// Copies `d`'s payload (whole: gathered or received unplanned) to
    /// `offset` of `slot`, where the responder placed it.
    fn copy(&mut self, d: &Datagram, req: &Request, slot: u32, offset: u32) -> Result<()> {
        let internal = |what: String| Error::new(ErrorKind::Internal, what);
        let Body::Whole(bytes) = d.body else {
            return Err(internal(format!(
                "packet PSN {:#08x} to copy is not whole after gathering",
                req.bth.psn
            )));
        };
        let payload = &bytes[req.payload_at..req.payload_at + req.payload_len];
        let at = offset as usize;
        self.slab
            .write_slot(slot, |b| b[at..at + payload.len()].copy_from_slice(payload))
            .ok_or_else(|| {
                internal(format!(
                    "responder placed into slot {slot}, which is on loan"
                ))
            })?;
        self.own.payload_copied += 1;
        Ok(())
    }

    /// A message larger than max_payload (the slot size) was refused with an
    /// invalid-request NAK, which ends an IBA requester's QP: the user must
    /// hear it where they look, with both sizes and what to do.
    fn log_too_large(&mut self, bytes: u32, psn: u32) {
        self.too_large += 1;
        let max = self.slab.slot_size();
        if self.too_large == 1 {
            log::warn!(
                "soft backend {}: a frame of at least {bytes} bytes (PSN {psn:#08x}) is larger \
                 than max_payload {max}: refused with an invalid-request NAK (counted in \
                 invalid_naks_tx), which is fatal to the FPGA's QP (it stops sending). Create \
                 the server with max_payload at least the FPGA's largest frame (rocev2 recv \
                 --max-payload), or have the FPGA send smaller frames",
                self.local
            );
        } else {
            log::debug!(
                "soft backend {}: another frame of at least {bytes} bytes > max_payload {max} \
                 refused (#{})",
                self.local,
                self.too_large
            );
        }
    }
}

/// A request from its parsed headers.
fn request(h: Headers, landed: Option<Landing>) -> Request {
    Request {
        bth: h.bth,
        imm: h.imm,
        payload_at: h.len,
        payload_len: h.payload_len,
        landed,
    }
}

/// A peer restart is rare and an operator must hear of it: one warning each.
fn log_restart(r: Restart, count: u64) {
    if r.resynced {
        log::warn!(
            "peer restart #{count}: the FPGA sent a new message at PSN {:#08x} (the \
             connection's first) where {:#08x} was expected ({} stale packets before it): it \
             was re-programmed or reset and started over with the same host params. \
             Re-synchronised to its new stream (MSN 0); frames it had sent before and not had \
             ACKed are gone with its old state. To start from a clean state instead, stop and \
             re-create the server and program the FPGA with the new host params",
            r.psn,
            r.expected_psn,
            r.stale_before
        );
    } else {
        log::warn!(
            "peer restart #{count} suspected: {} packets in a row far from the expected PSN \
             {:#08x} (the last at {:#08x}): the FPGA restarted at another PSN or was \
             programmed with a wrong one. Nothing is ACKed or delivered until it sends from \
             the connection's first PSN (the host SQ PSN): re-program it with the host params, \
             or stop and re-create the server",
            r.stale_before,
            r.expected_psn,
            r.psn
        );
    }
}
