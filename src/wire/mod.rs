//! RoCEv2 packet codec: the Base Transport Header (BTH), the immediate (ImmDt)
//! and ACK extended transport header (AETH), and the ICRC over the IPv4/UDP
//! pseudo-header ([`icrc`]). Parsing never panics: short or inconsistent
//! packets are rejected with a [`ParseError`] naming the reason.
//!
//! A RoCEv2 UDP payload is `BTH (12) [ImmDt (4)] [AETH (4)] payload pad ICRC (4)`,
//! with `pad` (BTH PadCnt, 0..3) bringing the payload to a multiple of 4.

pub mod icrc;
pub mod ipv4udp;
pub mod psn;

/// Mask of the 24-bit wire fields: QPN, PSN ([`psn`]), MSN, and the
/// immediate's ring position.
pub const MASK_24: u32 = 0x00ff_ffff;

use std::fmt;

/// BTH length in bytes.
pub const BTH_LEN: usize = 12;
/// ImmDt / AETH length in bytes.
pub const EXT_LEN: usize = 4;
/// ICRC length in bytes.
pub const ICRC_LEN: usize = 4;
/// The default partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// RC opcodes (IBA table 38) this crate speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    /// RC SEND First (0x00)
    SendFirst,
    /// RC SEND Middle (0x01)
    SendMiddle,
    /// RC SEND Last (0x02)
    SendLast,
    /// RC SEND Last with Immediate (0x03)
    SendLastImm,
    /// RC SEND Only (0x04)
    SendOnly,
    /// RC SEND Only with Immediate (0x05)
    SendOnlyImm,
    /// RC Acknowledge (0x11)
    Acknowledge,
    /// Any other opcode (RDMA WRITE/READ, atomics, UC/UD, ...): not supported here.
    Other(u8),
}

impl Opcode {
    /// Opcode from its byte.
    pub fn from_byte(b: u8) -> Opcode {
        match b {
            0x00 => Opcode::SendFirst,
            0x01 => Opcode::SendMiddle,
            0x02 => Opcode::SendLast,
            0x03 => Opcode::SendLastImm,
            0x04 => Opcode::SendOnly,
            0x05 => Opcode::SendOnlyImm,
            0x11 => Opcode::Acknowledge,
            x => Opcode::Other(x),
        }
    }
    /// The opcode byte.
    pub fn byte(self) -> u8 {
        match self {
            Opcode::SendFirst => 0x00,
            Opcode::SendMiddle => 0x01,
            Opcode::SendLast => 0x02,
            Opcode::SendLastImm => 0x03,
            Opcode::SendOnly => 0x04,
            Opcode::SendOnlyImm => 0x05,
            Opcode::Acknowledge => 0x11,
            Opcode::Other(x) => x,
        }
    }
    /// Carries an ImmDt header.
    pub fn has_imm(self) -> bool {
        matches!(self, Opcode::SendLastImm | Opcode::SendOnlyImm)
    }
    /// Carries an AETH header.
    pub fn has_aeth(self) -> bool {
        self == Opcode::Acknowledge
    }
    /// A SEND that starts a message (First or Only).
    pub fn starts_message(self) -> bool {
        matches!(
            self,
            Opcode::SendFirst | Opcode::SendOnly | Opcode::SendOnlyImm
        )
    }
    /// A SEND that ends a message (Last or Only).
    pub fn ends_message(self) -> bool {
        matches!(
            self,
            Opcode::SendLast | Opcode::SendLastImm | Opcode::SendOnly | Opcode::SendOnlyImm
        )
    }
    /// One of the six RC SEND opcodes.
    pub fn is_send(self) -> bool {
        matches!(self.byte(), 0x00..=0x05)
    }
    /// Bytes of transport headers: the BTH plus its ImmDt or AETH.
    pub fn header_len(self) -> usize {
        BTH_LEN
            + if self.has_imm() || self.has_aeth() {
                EXT_LEN
            } else {
                0
            }
    }
    /// The SEND opcode for a packet at this place in its message, as surf's
    /// engine sends frames: ONLY / FIRST / MIDDLE / LAST, with immediate on
    /// the packet that ends the message.
    pub fn send_with_imm(first: bool, last: bool) -> Opcode {
        match (first, last) {
            (true, true) => Opcode::SendOnlyImm,
            (true, false) => Opcode::SendFirst,
            (false, false) => Opcode::SendMiddle,
            (false, true) => Opcode::SendLastImm,
        }
    }
}

/// Base Transport Header fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// Pad count (0..3).
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// FECN/BECN/reserved byte (masked out of the ICRC).
    pub fb: u8,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// A BTH with the defaults (no pad, TVer 0, default P_Key).
    pub fn new(opcode: Opcode, dest_qp: u32, psn: u32) -> Bth {
        Bth {
            opcode,
            solicited: false,
            mig_req: false,
            pad: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fb: 0,
            dest_qp: dest_qp & MASK_24,
            ack_req: false,
            psn: psn & MASK_24,
        }
    }

    /// Parses the first 12 bytes of `b` (which must hold at least 12).
    fn parse(b: &[u8]) -> Bth {
        Bth {
            opcode: Opcode::from_byte(b[0]),
            solicited: b[1] & 0x80 != 0,
            mig_req: b[1] & 0x40 != 0,
            pad: (b[1] >> 4) & 0x3,
            tver: b[1] & 0xf,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fb: b[4],
            dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8] & 0x80 != 0,
            psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
        }
    }

    /// Writes the 12 header bytes.
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.opcode.byte();
        b[1] = (self.solicited as u8) << 7
            | (self.mig_req as u8) << 6
            | (self.pad & 3) << 4
            | (self.tver & 0xf);
        b[2..4].copy_from_slice(&self.pkey.to_be_bytes());
        b[4] = self.fb;
        b[5..8].copy_from_slice(&self.dest_qp.to_be_bytes()[1..]);
        b[8] = (self.ack_req as u8) << 7;
        b[9..12].copy_from_slice(&self.psn.to_be_bytes()[1..]);
    }
}

/// ACK extended transport header syndromes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syndrome {
    /// Positive ACK (0x00..0x1f: credit count in the low 5 bits; 0x1f = unlimited).
    Ack(u8),
    /// Receiver Not Ready NAK with a min RNR timer code (0x20 | timer).
    RnrNak(u8),
    /// PSN sequence error NAK (0x60).
    PsnSeqErr,
    /// Invalid request NAK (0x61).
    InvalidRequest,
    /// Remote access error NAK (0x62).
    RemoteAccess,
    /// Remote operational error NAK (0x63).
    RemoteOperational,
    /// Invalid RD request NAK (0x64) or reserved values.
    Other(u8),
}

impl Syndrome {
    /// From the syndrome byte.
    pub fn from_byte(b: u8) -> Syndrome {
        match b {
            0x00..=0x1f => Syndrome::Ack(b & 0x1f),
            0x20..=0x3f => Syndrome::RnrNak(b & 0x1f),
            0x60 => Syndrome::PsnSeqErr,
            0x61 => Syndrome::InvalidRequest,
            0x62 => Syndrome::RemoteAccess,
            0x63 => Syndrome::RemoteOperational,
            x => Syndrome::Other(x),
        }
    }
    /// The syndrome byte.
    pub fn byte(self) -> u8 {
        match self {
            Syndrome::Ack(c) => c & 0x1f,
            Syndrome::RnrNak(t) => 0x20 | (t & 0x1f),
            Syndrome::PsnSeqErr => 0x60,
            Syndrome::InvalidRequest => 0x61,
            Syndrome::RemoteAccess => 0x62,
            Syndrome::RemoteOperational => 0x63,
            Syndrome::Other(x) => x,
        }
    }
}

/// The unlimited-credit ACK syndrome the responder sends.
pub const ACK_UNLIMITED: Syndrome = Syndrome::Ack(0x1f);

/// AETH fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aeth {
    /// Syndrome.
    pub syndrome: Syndrome,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// Why a packet was rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than the headers its opcode needs plus the ICRC.
    Truncated {
        /// Bytes present.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// The transport header version is not 0.
    BadVersion(u8),
    /// The pad count exceeds the payload.
    BadPad {
        /// Pad count.
        pad: u8,
        /// Payload length including pad.
        payload: usize,
    },
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseError::Truncated { len, need } => {
                write!(
                    f,
                    "packet of {len} bytes is shorter than its headers + ICRC ({need})"
                )
            }
            ParseError::BadVersion(v) => write!(f, "BTH TVer {v} is not 0"),
            ParseError::BadPad { pad, payload } => {
                write!(f, "pad count {pad} exceeds the {payload}-byte payload")
            }
        }
    }
}

/// A parsed packet borrowing its payload from the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The BTH.
    pub bth: Bth,
    /// The immediate (host order) for *_WITH_IMMEDIATE opcodes.
    pub imm: Option<u32>,
    /// The AETH for Acknowledge.
    pub aeth: Option<Aeth>,
    /// The payload without pad.
    pub payload: &'a [u8],
    /// The ICRC as carried (little-endian on the wire).
    pub icrc: u32,
}

/// The headers of a packet, parsed without its payload: for packets whose
/// bytes were scattered on receive (headers in one buffer, payload in the
/// slab). [`Packet::parse`] is this plus the payload and ICRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers {
    /// The BTH.
    pub bth: Bth,
    /// The immediate (host order) for *_WITH_IMMEDIATE opcodes.
    pub imm: Option<u32>,
    /// The AETH for Acknowledge.
    pub aeth: Option<Aeth>,
    /// Bytes of headers (BTH + extension): where the payload starts.
    pub len: usize,
    /// Payload bytes without pad.
    pub payload_len: usize,
}

impl Headers {
    /// Parses the headers at the start of `head`, for a packet of `wire_len`
    /// bytes (BTH through ICRC). `head` may be shorter than the packet but
    /// must hold its headers (16 bytes are always enough).
    pub fn parse(head: &[u8], wire_len: usize) -> Result<Headers, ParseError> {
        let have = head.len().min(wire_len);
        if have < BTH_LEN || wire_len < BTH_LEN + ICRC_LEN {
            return Err(ParseError::Truncated {
                len: have,
                need: BTH_LEN + ICRC_LEN,
            });
        }
        let bth = Bth::parse(head);
        if bth.tver != 0 {
            return Err(ParseError::BadVersion(bth.tver));
        }
        let ext = bth.opcode.header_len() - BTH_LEN;
        let need = BTH_LEN + ext + ICRC_LEN;
        if wire_len < need || have < BTH_LEN + ext {
            return Err(ParseError::Truncated {
                len: wire_len,
                need,
            });
        }
        let e = &head[BTH_LEN..BTH_LEN + ext];
        let (imm, aeth) = if bth.opcode.has_imm() {
            (Some(u32::from_be_bytes([e[0], e[1], e[2], e[3]])), None)
        } else if bth.opcode.has_aeth() {
            let aeth = Aeth {
                syndrome: Syndrome::from_byte(e[0]),
                msn: u32::from_be_bytes([0, e[1], e[2], e[3]]),
            };
            (None, Some(aeth))
        } else {
            (None, None)
        };
        let body = wire_len - need;
        if bth.pad as usize > body {
            return Err(ParseError::BadPad {
                pad: bth.pad,
                payload: body,
            });
        }
        Ok(Headers {
            bth,
            imm,
            aeth,
            len: BTH_LEN + ext,
            payload_len: body - bth.pad as usize,
        })
    }
}

impl<'a> Packet<'a> {
    /// Parses a UDP payload (BTH through ICRC).
    pub fn parse(b: &'a [u8]) -> Result<Packet<'a>, ParseError> {
        let h = Headers::parse(b, b.len())?;
        let t = &b[b.len() - ICRC_LEN..];
        Ok(Packet {
            bth: h.bth,
            imm: h.imm,
            aeth: h.aeth,
            payload: &b[h.len..h.len + h.payload_len],
            icrc: u32::from_le_bytes([t[0], t[1], t[2], t[3]]),
        })
    }

    /// Bytes `emit` writes for a packet with these headers and payload length.
    pub fn wire_len(opcode: Opcode, payload_len: usize) -> usize {
        opcode.header_len() + payload_len.next_multiple_of(4) + ICRC_LEN
    }
}

/// Writes BTH (its pad count set from `payload`), the extension header,
/// payload, pad and a zero ICRC placeholder into `out`; returns the length.
/// `out` must hold [`Packet::wire_len`] bytes. The caller fills the ICRC
/// (see [`icrc::Ipv4Udp::seal`]).
pub fn emit(
    bth: &Bth,
    imm: Option<u32>,
    aeth: Option<Aeth>,
    payload: &[u8],
    out: &mut [u8],
) -> usize {
    let len = Packet::wire_len(bth.opcode, payload.len());
    let mut at = emit_headers(bth, imm, aeth, payload.len(), out);
    out[at..at + payload.len()].copy_from_slice(payload);
    at += payload.len();
    for b in &mut out[at..len] {
        *b = 0;
    }
    len
}

/// Writes what goes before a payload of `payload_len` bytes: BTH (its pad
/// count set from that length) and the extension header (ImmDt or AETH);
/// returns their length ([`Opcode::header_len`]). The start of [`emit`],
/// for a sender that gathers the payload from where it lies.
pub fn emit_headers(
    bth: &Bth,
    imm: Option<u32>,
    aeth: Option<Aeth>,
    payload_len: usize,
    out: &mut [u8],
) -> usize {
    let mut h = *bth;
    h.pad = ((4 - payload_len % 4) % 4) as u8;
    h.emit(&mut out[..BTH_LEN]);
    let mut at = BTH_LEN;
    if bth.opcode.has_imm() {
        out[at..at + 4].copy_from_slice(&imm.unwrap_or(0).to_be_bytes());
        at += 4;
    } else if bth.opcode.has_aeth() {
        let a = aeth.unwrap_or(Aeth {
            syndrome: ACK_UNLIMITED,
            msn: 0,
        });
        out[at] = a.syndrome.byte();
        out[at + 1..at + 4].copy_from_slice(&a.msn.to_be_bytes()[1..]);
        at += 4;
    }
    at
}

#[cfg(test)]
mod tests;
