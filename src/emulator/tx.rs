//! The emulator's outgoing packets. A plain packet is its headers and
//! trailer, built here, around a payload that is read from its message where
//! it lies: the socket gathers the three pieces, so a frame's bytes are
//! copied once, by the kernel, as an FPGA's DMA reads them once. A faulted
//! packet (corrupted after sealing, duplicated, held back to reorder) is
//! built whole into a buffer of its own: it may outlive the call that made
//! it, and its message with it.

use super::requester::{Requester, Span};
use crate::wire::icrc::{IcrcCache, Ipv4Udp, KnownPayload};
use crate::wire::{self, Bth, Packet, BTH_LEN, ICRC_LEN};

/// BTH and ImmDt: the longest header a SEND carries.
const HEAD_MAX: usize = BTH_LEN + 4;
/// Pad (0..3) and ICRC.
const TAIL_MAX: usize = 3 + ICRC_LEN;

#[derive(Clone)]
pub(super) enum Tx {
    /// Headers, where the payload lies, pad and ICRC.
    Parts {
        head: [u8; HEAD_MAX],
        head_len: u8,
        span: Span,
        tail: [u8; TAIL_MAX],
        tail_len: u8,
    },
    /// A whole packet, and whether to corrupt it after sealing.
    Whole(Vec<u8>, bool),
}

impl Tx {
    /// A packet whose payload (`payload_len` bytes at `span`) stays where it is.
    pub(super) fn parts(bth: &Bth, imm: Option<u32>, span: Span, payload_len: usize) -> Tx {
        let mut head = [0u8; HEAD_MAX];
        let head_len = wire::emit_headers(bth, imm, None, payload_len, &mut head);
        let tail_len = Packet::wire_len(bth.opcode, payload_len) - head_len - payload_len;
        Tx::Parts {
            head,
            head_len: head_len as u8,
            span,
            tail: [0; TAIL_MAX],
            tail_len: tail_len as u8,
        }
    }

    /// A packet built whole into `buf` (a kept buffer: no allocation once
    /// it has grown).
    pub(super) fn whole(
        bth: &Bth,
        imm: Option<u32>,
        payload: &[u8],
        mut buf: Vec<u8>,
        corrupt: bool,
    ) -> Tx {
        buf.resize(Packet::wire_len(bth.opcode, payload.len()), 0);
        wire::emit(bth, imm, None, payload, &mut buf);
        Tx::Whole(buf, corrupt)
    }

    /// Its length on the wire (UDP payload).
    pub(super) fn len(&self) -> usize {
        match self {
            Tx::Parts {
                head_len,
                span,
                tail_len,
                ..
            } => *head_len as usize + span.len() + *tail_len as usize,
            Tx::Whole(b, _) => b.len(),
        }
    }

    /// Its bytes as they lie: a plain packet's headers, where its payload
    /// lies and its tail, or the whole packet.
    fn layout(&self) -> Layout<'_> {
        match self {
            Tx::Parts {
                head,
                head_len,
                span,
                tail,
                tail_len,
            } => Layout::Parts(
                &head[..*head_len as usize],
                *span,
                &tail[..*tail_len as usize],
            ),
            Tx::Whole(b, _) => Layout::Whole(b),
        }
    }

    /// Its pieces, in order (the payload read from `req`: its message is
    /// unacknowledged while the packet waits to be sent, in the same
    /// transmit round).
    pub(super) fn pieces<'a>(&'a self, req: &'a Requester) -> [&'a [u8]; 3] {
        match self.layout() {
            Layout::Parts(head, span, tail) => [
                head,
                req.payload(span).unwrap_or_else(|| {
                    debug_assert!(false, "a queued packet's message was acknowledged");
                    &[]
                }),
                tail,
            ],
            Layout::Whole(b) => [b, &[], &[]],
        }
    }

    /// Fills its ICRC for `ctx` (then flips a bit of a packet to corrupt):
    /// from the template's known share when its payload is the template's.
    pub(super) fn seal(
        &mut self,
        icrc: &mut IcrcCache,
        ctx: &Ipv4Udp,
        req: &Requester,
        template: Option<&mut Template>,
    ) {
        let known = match (self.layout(), template) {
            (Layout::Parts(head, span, tail), Some(t)) => t
                .known(span)
                .map(|k| icrc.compute_known(ctx, head, k, tail)),
            _ => None,
        };
        let c = known.unwrap_or_else(|| icrc.compute_parts(ctx, &self.pieces(req)));
        match self {
            Tx::Parts { tail, tail_len, .. } => {
                let n = *tail_len as usize;
                if let Some(c) = c {
                    tail[n - ICRC_LEN..n].copy_from_slice(&c.to_le_bytes());
                }
            }
            Tx::Whole(buf, corrupt) => {
                if let Some(c) = c {
                    let n = buf.len();
                    buf[n - ICRC_LEN..].copy_from_slice(&c.to_le_bytes());
                }
                if *corrupt {
                    let at = buf.len() - ICRC_LEN - 1;
                    buf[at] ^= 0x10;
                }
            }
        }
    }

    /// Its buffer, to keep for the next whole packet.
    pub(super) fn into_buffer(self) -> Option<Vec<u8>> {
        match self {
            Tx::Whole(b, _) => Some(b),
            Tx::Parts { .. } => None,
        }
    }
}

/// A packet's bytes as they lie ([`Tx::layout`]).
enum Layout<'a> {
    /// Headers, where the payload lies, pad and ICRC.
    Parts(&'a [u8], Span, &'a [u8]),
    /// The whole packet.
    Whole(&'a [u8]),
}

/// The one payload every message of a stream carries from message `from`
/// on ([`super::FpgaEmulator::stream_template`]), with its ICRC share per
/// span a packet takes of it (one per packet of a frame: worked out at its
/// first use).
pub(super) struct Template {
    bytes: Vec<u8>,
    from: u64,
    spans: Vec<(usize, KnownPayload)>,
}

impl Template {
    /// `bytes`, carried by every message from the absolute index `from` on.
    pub(super) fn new(bytes: &[u8], from: u64) -> Template {
        Template {
            bytes: bytes.to_vec(),
            from,
            spans: Vec::new(),
        }
    }

    /// A new requester (a restart): its messages from `from` on carry it.
    pub(super) fn restart(&mut self, from: u64) {
        self.from = from;
    }

    /// The known share of the payload at `span`, when its message is one of
    /// the template's.
    fn known(&mut self, span: Span) -> Option<&KnownPayload> {
        if span.msg() < self.from {
            return None;
        }
        let (at, len) = (span.offset(), span.len());
        let i = match self
            .spans
            .iter()
            .position(|(o, k)| *o == at && k.len() == len)
        {
            Some(i) => i,
            None => {
                let bytes = self.bytes.get(at..at + len)?;
                self.spans.push((at, KnownPayload::new(bytes)));
                self.spans.len() - 1
            }
        };
        Some(&self.spans[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulator::requester::RequesterConfig;
    use crate::wire::Opcode;

    /// A requester at pmtu 256 (frames of a few packets).
    fn requester() -> Requester {
        Requester::new(RequesterConfig {
            dest_qpn: 0x12,
            start_psn: 7,
            pmtu: 256,
            window: 64,
            timeout_ns: 1_000_000,
            retry_cnt: 2,
            rnr_retry: 7,
        })
    }

    /// The emulator's sending context, with IP ID `ip_id`.
    fn context(ip_id: u16) -> Ipv4Udp {
        Ipv4Udp {
            src: [10, 0, 0, 2].into(),
            dst: [10, 0, 0, 1].into(),
            ip_id,
            dont_fragment: true,
            src_port: 50000,
            dst_port: 4791,
        }
    }

    /// Gathered pieces are the packet built whole, ICRC included, for every
    /// opcode and pad the emulator sends.
    #[test]
    fn pieces_are_the_whole_packet() {
        let mut req = requester();
        for len in [1usize, 3, 4, 255, 256, 257, 513, 770] {
            req.submit((0..len).map(|i| (i * 7 + len) as u8).collect(), len as u32);
        }
        let ctx = context(3);
        let (mut a, mut b) = (IcrcCache::default(), IcrcCache::default());
        let mut built = Vec::new();
        let mut opcodes = std::collections::HashSet::new();
        while let Some(p) = req.poll_transmit(0) {
            opcodes.insert(p.opcode);
            let bth = Bth::new(p.opcode, 0x12, p.psn);
            let whole = Tx::whole(&bth, p.imm, p.payload, Vec::new(), false);
            let parts = Tx::parts(&bth, p.imm, p.span, p.payload.len());
            built.push((whole, parts));
        }
        for (whole, parts) in &mut built {
            whole.seal(&mut a, &ctx, &req, None);
            parts.seal(&mut b, &ctx, &req, None);
            assert_eq!(parts.len(), whole.len());
            let gathered: Vec<u8> = parts.pieces(&req).concat();
            assert_eq!(gathered, whole.pieces(&req)[0]);
            assert!(Packet::parse(&gathered).is_ok());
            assert!(ctx.verify(&gathered), "ICRC of the gathered packet");
        }
        for op in [
            Opcode::SendOnlyImm,
            Opcode::SendFirst,
            Opcode::SendMiddle,
            Opcode::SendLastImm,
        ] {
            assert!(opcodes.contains(&op), "{op:?} covered");
        }
    }

    /// With a template, the template's messages (from its first index on,
    /// every packet of a frame) are sealed from its known share, earlier
    /// messages from their own bytes: each the ICRC of the packet as sent.
    #[test]
    fn a_template_seals_its_messages_and_only_those() {
        let mut req = requester();
        let template: Vec<u8> = (0..601).map(|i| (i * 13 + 5) as u8).collect();
        let other: Vec<u8> = (0..601).map(|i| (i * 3 + 1) as u8).collect();
        req.submit(other.clone(), 0);
        req.submit(other, 1);
        let mut t = Template::new(&template, req.next_msg());
        for k in 2..5 {
            req.submit(template.clone(), k);
        }
        let ctx = context(0);
        let mut icrc = IcrcCache::default();
        let mut built = Vec::new();
        while let Some(p) = req.poll_transmit(0) {
            let bth = Bth::new(p.opcode, 0x12, p.psn);
            built.push((p.psn, Tx::parts(&bth, p.imm, p.span, p.payload.len())));
        }
        assert_eq!(
            built.len(),
            5 * 3,
            "3 packets per 601-byte frame at pmtu 256"
        );
        for (psn, parts) in &mut built {
            parts.seal(&mut icrc, &ctx, &req, Some(&mut t));
            let sent: Vec<u8> = parts.pieces(&req).concat();
            assert!(ctx.verify(&sent), "PSN {psn}");
        }
        assert_eq!(t.spans.len(), 3, "one known share per span of a frame");
    }
}
