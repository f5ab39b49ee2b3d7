//! The emulator's outgoing packets. A plain packet is its headers and
//! trailer, built here, around a payload that is read from its message where
//! it lies: the socket gathers the three pieces, so a frame's bytes are
//! copied once, by the kernel, as an FPGA's DMA reads them once. A faulted
//! packet (corrupted after sealing, duplicated, held back to reorder) is
//! built whole into a buffer of its own: it may outlive the call that made
//! it, and its message with it.

use super::requester::{Requester, Span};
use crate::wire::icrc::{IcrcCache, Ipv4Udp};
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

    /// Its pieces, in order (the payload read from `req`: its message is
    /// unacknowledged while the packet waits to be sent, in the same
    /// transmit round).
    pub(super) fn pieces<'a>(&'a self, req: &'a Requester) -> [&'a [u8]; 3] {
        match self {
            Tx::Parts {
                head,
                head_len,
                span,
                tail,
                tail_len,
            } => [
                &head[..*head_len as usize],
                req.payload(*span).unwrap_or_else(|| {
                    debug_assert!(false, "a queued packet's message was acknowledged");
                    &[]
                }),
                &tail[..*tail_len as usize],
            ],
            Tx::Whole(b, _) => [b, &[], &[]],
        }
    }

    /// Fills its ICRC for `ctx` (then flips a bit of a packet to corrupt).
    pub(super) fn seal(&mut self, icrc: &mut IcrcCache, ctx: &Ipv4Udp, req: &Requester) {
        let c = {
            let p = self.pieces(req);
            icrc.compute_parts(ctx, &p)
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulator::requester::RequesterConfig;
    use crate::wire::Opcode;

    /// Gathered pieces are the packet built whole, ICRC included, for every
    /// opcode and pad the emulator sends.
    #[test]
    fn pieces_are_the_whole_packet() {
        let mut req = Requester::new(RequesterConfig {
            dest_qpn: 0x12,
            start_psn: 7,
            pmtu: 256,
            window: 64,
            timeout_ns: 1_000_000,
            retry_cnt: 2,
            rnr_retry: 7,
        });
        for len in [1usize, 3, 4, 255, 256, 257, 513, 770] {
            req.submit((0..len).map(|i| (i * 7 + len) as u8).collect(), len as u32);
        }
        let ctx = Ipv4Udp {
            src: [10, 0, 0, 2].into(),
            dst: [10, 0, 0, 1].into(),
            ip_id: 3,
            dont_fragment: true,
            src_port: 50000,
            dst_port: 4791,
        };
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
            whole.seal(&mut a, &ctx, &req);
            parts.seal(&mut b, &ctx, &req);
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
}
