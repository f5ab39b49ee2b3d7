//! The RoCEv2 invariant CRC (IBA annex A17.2.3, Linux `rxe_icrc.c`): CRC-32
//! (reflected 0xEDB88320, init ~0, final ~0 — exactly what crc32fast computes)
//! over 8 bytes of 0xFF standing for the absent LRH, the IPv4 header with TOS,
//! TTL and checksum set to all ones, the UDP header with checksum all ones, the
//! BTH with its FECN/BECN/reserved byte all ones, then every later byte of the
//! packet up to the ICRC, which is stored little-endian.
//!
//! The IP total length, ID, flags, addresses and the UDP ports and length are
//! covered, so verifying a received packet needs its real IP header: a UDP
//! socket does not see the IP ID (see `crate::net`).

pub use super::ipv4udp::{parse_ipv4_udp, split_ipv4_udp, Ipv4Udp};
use super::{BTH_LEN, ICRC_LEN};

/// Length of the masked pseudo-header the ICRC starts with: 8 (LRH
/// stand-in) + 20 (IPv4) + 8 (UDP).
pub const HEADROOM: usize = 36;

impl Ipv4Udp {
    /// Writes the masked pseudo-header the ICRC starts with (the LRH stand-in,
    /// the IPv4 header with TOS, TTL and checksum all ones, the UDP header
    /// with checksum all ones) for a UDP payload of `pkt_len` bytes into the
    /// first [`HEADROOM`] bytes of `out`.
    fn pseudo_header(&self, pkt_len: usize, out: &mut [u8]) {
        let udp_len = (8 + pkt_len) as u16;
        let frag: u16 = if self.dont_fragment { 0x4000 } else { 0 };
        let h = &mut out[..HEADROOM];
        h[..8].fill(0xff);
        let ip = &mut h[8..28];
        ip[0] = 0x45;
        ip[1] = 0xff; // TOS masked
        ip[2..4].copy_from_slice(&(20 + udp_len).to_be_bytes());
        ip[4..6].copy_from_slice(&self.ip_id.to_be_bytes());
        ip[6..8].copy_from_slice(&frag.to_be_bytes());
        ip[8] = 0xff; // TTL masked
        ip[9] = 17; // UDP
        ip[10..12].fill(0xff); // checksum masked
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        let udp = &mut h[28..36];
        udp[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        udp[6..8].fill(0xff); // checksum masked
    }

    /// The CRC state after the masked pseudo-header for a UDP payload of
    /// `pkt_len` bytes.
    fn pseudo_header_state(&self, pkt_len: usize) -> u32 {
        let mut hdr = [0u8; HEADROOM];
        self.pseudo_header(pkt_len, &mut hdr);
        crc32fast::hash(&hdr)
    }

    /// [`Ipv4Udp::pseudo_header_state`] with the per-packet fields
    /// ([`FIELDS_AT`]) zero: what one sender's packets share.
    fn sender_state(&self) -> u32 {
        let mut hdr = [0u8; HEADROOM];
        self.pseudo_header(0, &mut hdr);
        for at in FIELDS_AT {
            hdr[at] = 0;
        }
        crc32fast::hash(&hdr)
    }

    /// The pseudo-header's bytes at [`FIELDS_AT`] for a UDP payload of
    /// `pkt_len` bytes (as [`Ipv4Udp::pseudo_header`] writes them).
    fn fields(&self, pkt_len: usize) -> [u8; 6] {
        let udp_len = (8 + pkt_len) as u16;
        let [l0, l1] = (20 + udp_len).to_be_bytes();
        let [i0, i1] = self.ip_id.to_be_bytes();
        let [u0, u1] = udp_len.to_be_bytes();
        [l0, l1, i0, i1, u0, u1]
    }

    /// The ICRC of the UDP payload `pkt` (BTH .. pad, then the 4 ICRC bytes,
    /// whose value is ignored). `pkt` must be at least BTH + ICRC long.
    pub fn compute(&self, pkt: &[u8]) -> u32 {
        self.compute_parts(&[pkt])
            .expect("packet shorter than BTH + ICRC")
    }

    /// [`Ipv4Udp::compute`] of a packet received in pieces (headers, the
    /// payload in its slot, the tail): `parts` concatenated are the UDP
    /// payload. `None` when they hold less than BTH + ICRC or the first part
    /// does not hold the whole BTH.
    pub fn compute_parts(&self, parts: &[&[u8]]) -> Option<u32> {
        let total = checked_total(parts)?;
        Some(crc_from(self.pseudo_header_state(total), parts, total))
    }

    /// True when the ICRC carried in the last 4 bytes of `parts` (see
    /// [`Ipv4Udp::compute_parts`]) is right.
    pub fn verify_parts(&self, parts: &[&[u8]]) -> bool {
        self.compute_parts(parts) == Some(carried(parts))
    }

    /// Computes the ICRC of `pkt` and stores it in its last 4 bytes.
    pub fn seal(&self, pkt: &mut [u8]) {
        let c = self.compute(pkt);
        let n = pkt.len();
        pkt[n - ICRC_LEN..].copy_from_slice(&c.to_le_bytes());
    }

    /// True when the ICRC carried in `pkt` is right.
    pub fn verify(&self, pkt: &[u8]) -> bool {
        if pkt.len() < BTH_LEN + ICRC_LEN {
            return false;
        }
        let n = pkt.len();
        let carried = u32::from_le_bytes([pkt[n - 4], pkt[n - 3], pkt[n - 2], pkt[n - 1]]);
        carried == self.compute(pkt)
    }
}

/// The ICRC with the pseudo-header's CRC state kept across packets: the
/// production path (the send paths' [`IcrcCache::emit_sealed`], raw
/// capture's [`IcrcCache::verify_parts`]). Packets from one sender share
/// their masked IPv4/UDP pseudo-header but for its lengths and IP ID, so its
/// CRC state is hashed once per sender and kept (a new length or IP ID is
/// XORed in by table). The CRC register is linear, so the masked BTH byte is
/// folded into that start state too: the packet's bytes are read where they
/// are, in one CRC update from the BTH on. Nothing is written into the packet
/// (a store right before the CRC's wide loads read it stalls store
/// forwarding), and no short update runs before the long one (crc32fast
/// takes a scalar path under 16 bytes). The same values as
/// [`Ipv4Udp::compute_parts`].
#[derive(Clone, Default)]
pub struct IcrcCache {
    /// The last packet's context and UDP payload length.
    key: Option<(Ipv4Udp, usize)>,
    /// The CRC state after the masked pseudo-header for `key`.
    state: u32,
    /// The last sender (its context with IP ID 0).
    sender: Option<Ipv4Udp>,
    /// [`Ipv4Udp::sender_state`] of `sender`.
    sender_state: u32,
}

impl IcrcCache {
    /// The CRC state after the pseudo-header for a UDP payload of `total`
    /// bytes from `ctx`: kept for the last length and IP ID; when those
    /// change (a message's last packet, an FPGA counting IP IDs), the kept
    /// sender's state with the new fields' bytes XORed in by table
    /// ([`field_crc`]); only a new sender hashes a pseudo-header.
    #[inline]
    fn start(&mut self, ctx: &Ipv4Udp, total: usize) -> u32 {
        if self.key != Some((*ctx, total)) {
            let sender = Ipv4Udp { ip_id: 0, ..*ctx };
            if self.sender != Some(sender) {
                self.sender_state = sender.sender_state();
                self.sender = Some(sender);
            }
            self.state = self.sender_state ^ field_crc(ctx.fields(total));
            self.key = Some((*ctx, total));
        }
        self.state
    }

    /// [`Ipv4Udp::compute_parts`] through the cache.
    pub fn compute_parts(&mut self, ctx: &Ipv4Udp, parts: &[&[u8]]) -> Option<u32> {
        let total = checked_total(parts)?;
        Some(crc_from(self.start(ctx, total), parts, total))
    }

    /// True when the ICRC carried in the last 4 bytes of `parts` is right.
    pub fn verify_parts(&mut self, ctx: &Ipv4Udp, parts: &[&[u8]]) -> bool {
        self.compute_parts(ctx, parts) == Some(carried(parts))
    }

    /// [`Ipv4Udp::compute`] through the cache: the ICRC of the UDP payload
    /// `pkt` (BTH .. pad, then the 4 ICRC bytes, whose value is ignored).
    /// `pkt` must be at least BTH + ICRC long.
    #[inline]
    pub fn compute(&mut self, ctx: &Ipv4Udp, pkt: &[u8]) -> u32 {
        assert!(
            pkt.len() >= BTH_LEN + ICRC_LEN,
            "packet shorter than BTH + ICRC"
        );
        crc_from(self.start(ctx, pkt.len()), &[pkt], pkt.len())
    }

    /// [`IcrcCache::compute`], stored in the packet's last 4 bytes.
    #[inline]
    pub fn seal(&mut self, ctx: &Ipv4Udp, pkt: &mut [u8]) {
        let c = self.compute(ctx, pkt);
        let n = pkt.len();
        pkt[n - ICRC_LEN..].copy_from_slice(&c.to_le_bytes());
    }

    /// Builds a packet from `ctx` (see [`super::emit`]) into `buf`, resized
    /// to the packet's length (kept buffers do not allocate), and fills its
    /// ICRC ([`IcrcCache::seal`]): what the send paths put on the wire.
    pub fn emit_sealed(
        &mut self,
        ctx: &Ipv4Udp,
        bth: &super::Bth,
        imm: Option<u32>,
        aeth: Option<super::Aeth>,
        payload: &[u8],
        buf: &mut Vec<u8>,
    ) {
        buf.resize(super::Packet::wire_len(bth.opcode, payload.len()), 0);
        super::emit(bth, imm, aeth, payload, buf);
        self.seal(ctx, buf);
    }
}

/// A payload sent many times (the bench's frame, the same bytes in every
/// message): its share of the ICRC worked out once, so sealing a packet that
/// carries it reads only the headers and the pad, as an FPGA's ICRC costs it
/// nothing. The CRC register is linear: the register after `head ++ payload`
/// is the register after `head` advanced over `payload.len()` zero bytes
/// (four lookups in the tables below), XOR the register `payload` alone
/// leaves from zero. The same values as [`IcrcCache::compute_parts`].
pub struct KnownPayload {
    len: usize,
    /// The register `payload` leaves from register 0.
    alone: u32,
    /// The register advanced over `len` zero bytes, by each of its bytes.
    advance: Box<[[u32; 256]; 4]>,
}

impl KnownPayload {
    /// Works out `payload`'s share (a CRC of it and 32 advances of one bit
    /// over its length: about a millisecond for 4 KiB).
    pub fn new(payload: &[u8]) -> KnownPayload {
        let mut h = crc32fast::Hasher::new_with_initial(!0);
        h.update(payload);
        let bits = u32::try_from(8 * payload.len()).expect("a payload under 512 MiB");
        let base: [u32; 32] = std::array::from_fn(|i| advance(1 << i, bits));
        let mut advance = Box::new([[0u32; 256]; 4]);
        for (k, t) in advance.iter_mut().enumerate() {
            for v in 1..256usize {
                t[v] = t[v & (v - 1)] ^ base[8 * k + v.trailing_zeros() as usize];
            }
        }
        KnownPayload {
            len: payload.len(),
            alone: !h.finalize(),
            advance,
        }
    }

    /// The payload's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty payload.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The CRC state (crc32fast's: the register inverted) after the payload,
    /// from state `s`.
    #[inline]
    fn after(&self, s: u32) -> u32 {
        let r = !s;
        let mut x = self.alone;
        for (k, t) in self.advance.iter().enumerate() {
            x ^= t[((r >> (8 * k)) & 0xff) as usize];
        }
        !x
    }
}

impl IcrcCache {
    /// [`IcrcCache::compute_parts`] of the packet `head ++ payload ++ tail`
    /// (headers with the whole BTH; the payload known; the pad and the 4
    /// ICRC bytes), reading only `head` and the pad.
    pub fn compute_known(
        &mut self,
        ctx: &Ipv4Udp,
        head: &[u8],
        payload: &KnownPayload,
        tail: &[u8],
    ) -> Option<u32> {
        let total = head.len() + payload.len + tail.len();
        if head.len() < BTH_LEN || tail.len() < ICRC_LEN {
            return None;
        }
        let mut h =
            crc32fast::Hasher::new_with_initial(self.start(ctx, total) ^ mask_fix(head[MASKED_AT]));
        h.update(head);
        let mut h = crc32fast::Hasher::new_with_initial(payload.after(h.finalize()));
        h.update(&tail[..tail.len() - ICRC_LEN]);
        Some(h.finalize())
    }
}

/// The UDP payload length `parts` hold, if it can carry a BTH and an ICRC
/// and the first part holds the whole BTH.
fn checked_total(parts: &[&[u8]]) -> Option<usize> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let first = parts.first()?;
    (total >= BTH_LEN + ICRC_LEN && first.len() >= BTH_LEN).then_some(total)
}

/// The ICRC from `start` (the CRC state after the pseudo-header): every byte
/// from the BTH up to the ICRC where it lies, one update per part, with the
/// masked BTH byte folded into the start state. `parts` passed
/// [`checked_total`] (`total` bytes, the whole BTH in the first part).
#[inline]
fn crc_from(start: u32, parts: &[&[u8]], total: usize) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(start ^ mask_fix(parts[0][MASKED_AT]));
    let mut left = total - ICRC_LEN;
    for p in parts {
        let take = p.len().min(left);
        h.update(&p[..take]);
        left -= take;
    }
    h.finalize()
}

/// Where the BTH byte the ICRC masks (FECN, BECN, 6 reserved bits) lies.
const MASKED_AT: usize = 4;

/// What to XOR into the CRC state in front of a packet whose byte
/// [`MASKED_AT`] is `byte`, so that the CRC of the packet as it is equals
/// the CRC of the packet with that byte set to 0xFF.
///
/// The CRC register is linear: setting the byte to 0xFF XORs `d = byte ^
/// 0xFF` into the register just before that byte is processed, and a change
/// of the register propagates through the same later bytes wherever it was
/// made. So `d` moved back over the [`MASKED_AT`] bytes in front of it, XORed
/// into the start state, changes the result alike (for any packet length).
#[inline]
fn mask_fix(byte: u8) -> u32 {
    MASK_FIX[(byte ^ 0xff) as usize]
}

/// [`mask_fix`] for every difference `d`.
static MASK_FIX: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut d = 0;
    while d < 256 {
        t[d] = rewind(d as u32, 8 * MASKED_AT as u32);
        d += 1;
    }
    t
};

/// Where the pseudo-header's per-packet bytes lie: the IPv4 total length
/// and ID, the UDP length (big-endian, two bytes each).
const FIELDS_AT: [usize; 6] = [10, 11, 12, 13, 32, 33];

/// What the pseudo-header's bytes at [`FIELDS_AT`] being `fields` (instead of
/// zero) XOR into the CRC state after it.
#[inline]
fn field_crc(fields: [u8; 6]) -> u32 {
    let mut x = 0;
    for (k, v) in fields.into_iter().enumerate() {
        x ^= FIELD_CRC[k][v as usize];
    }
    x
}

/// [`field_crc`] per byte: a byte `v` at `at` XORs `v` into the register
/// before byte `at` is processed, which the `HEADROOM - at` bytes from there
/// on advance.
static FIELD_CRC: [[u32; 256]; 6] = {
    let mut t = [[0u32; 256]; 6];
    let mut k = 0;
    while k < 6 {
        t[k] = advanced_bytes(8 * (HEADROOM - FIELDS_AT[k]) as u32);
        k += 1;
    }
    t
};

/// `advance(v, bits)` for every byte `v`, from the 8 single-bit values (the
/// register is linear).
const fn advanced_bytes(bits: u32) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut v = 1;
    while v < 256 {
        t[v] = t[v & (v - 1)] ^ advance(1 << v.trailing_zeros(), bits);
        v += 1;
    }
    t
}

/// The CRC register `r` after `bits` zero bits: `bits` steps
/// `r -> r >> 1 ^ (POLY if r & 1)`.
const fn advance(mut r: u32, bits: u32) -> u32 {
    let mut i = 0;
    while i < bits {
        r = (r >> 1) ^ (POLY & 0u32.wrapping_sub(r & 1));
        i += 1;
    }
    r
}

/// The reflected CRC-32 polynomial (what crc32fast computes).
const POLY: u32 = 0xedb8_8320;

/// The CRC register `r` that `bits` zero bits advance to the given one: the
/// inverse of the register's step `r -> r >> 1 ^ (POLY if r & 1)` (the step's
/// result has its top bit set exactly when the low bit was, as POLY's top
/// bit is set and `r >> 1`'s is clear).
const fn rewind(mut r: u32, bits: u32) -> u32 {
    let mut i = 0;
    while i < bits {
        r = if r & 0x8000_0000 != 0 {
            ((r ^ POLY) << 1) | 1
        } else {
            r << 1
        };
        i += 1;
    }
    r
}

/// The ICRC carried in the last 4 bytes of `parts` (little-endian).
fn carried(parts: &[&[u8]]) -> u32 {
    let mut tail = [0u8; ICRC_LEN];
    let mut need = ICRC_LEN;
    for p in parts.iter().rev() {
        let take = p.len().min(need);
        tail[need - take..need].copy_from_slice(&p[p.len() - take..]);
        need -= take;
        if need == 0 {
            break;
        }
    }
    u32::from_le_bytes(tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// A known payload's ICRC is the one read from its bytes, for every
    /// payload length around the word and table boundaries, any head, pad
    /// and IP ID, and the cache's kept state across them.
    #[test]
    fn a_known_payload_seals_as_its_bytes_do() {
        let mut ctx = Ipv4Udp {
            src: Ipv4Addr::new(10, 0, 0, 2),
            dst: Ipv4Addr::new(10, 0, 0, 1),
            ip_id: 0,
            dont_fragment: true,
            src_port: 50000,
            dst_port: 4791,
        };
        let (mut known_way, mut read_way) = (IcrcCache::default(), IcrcCache::default());
        let mut x = 0x1234_5678u32;
        let mut byte = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        };
        for len in [
            0usize, 1, 3, 4, 5, 15, 16, 17, 255, 256, 1024, 4095, 4096, 4097,
        ] {
            let payload: Vec<u8> = (0..len).map(|_| byte()).collect();
            let known = KnownPayload::new(&payload);
            assert_eq!(known.len(), len);
            for (head_len, pad, ip_id) in [(12, 0, 0), (16, 3, 1), (16, 1, 7), (12, 2, 0xffff)] {
                ctx.ip_id = ip_id;
                let head: Vec<u8> = (0..head_len).map(|_| byte()).collect();
                let tail: Vec<u8> = (0..pad + ICRC_LEN).map(|_| byte()).collect();
                let by_bytes = read_way.compute_parts(&ctx, &[&head, &payload, &tail]);
                let by_known = known_way.compute_known(&ctx, &head, &known, &tail);
                assert!(by_bytes.is_some());
                assert_eq!(
                    by_known, by_bytes,
                    "payload {len} B, head {head_len}, pad {pad}"
                );
            }
        }
        let known = KnownPayload::new(&[1, 2, 3]);
        assert_eq!(
            known_way.compute_known(&ctx, &[0; 11], &known, &[0; 4]),
            None,
            "BTH cut"
        );
        assert_eq!(
            known_way.compute_known(&ctx, &[0; 12], &known, &[0; 3]),
            None,
            "no ICRC"
        );
    }

    #[test]
    fn the_cache_agrees_with_the_direct_computation_across_keys() {
        let mut cache = IcrcCache::default();
        let mut ctx = Ipv4Udp {
            src: Ipv4Addr::new(10, 0, 0, 2),
            dst: Ipv4Addr::new(10, 0, 0, 1),
            ip_id: 0,
            dont_fragment: true,
            src_port: 4791,
            dst_port: 4791,
        };
        for (i, len) in [64usize, 64, 4096 + 32, 64, 17].into_iter().enumerate() {
            ctx.ip_id = (i as u16) / 2; // the key changes now and then
            let pkt: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
            let want = ctx.compute_parts(&[&pkt]);
            assert_eq!(cache.compute_parts(&ctx, &[&pkt]), want, "len {len}");
            let (a, b) = pkt.split_at(len.min(20));
            assert_eq!(cache.compute_parts(&ctx, &[a, b]), want, "in two parts");
        }
        assert_eq!(cache.compute_parts(&ctx, &[&[0u8; 10]]), None);
        let mut pkt = vec![3u8; 100];
        ctx.seal(&mut pkt);
        assert!(cache.verify_parts(&ctx, &[&pkt]));
        pkt[50] ^= 1;
        assert!(!cache.verify_parts(&ctx, &[&pkt]));
    }

    /// The ICRC the slow way: the pseudo-header and a masked copy of the
    /// packet in one buffer, one CRC.
    fn masked_copy_icrc(ctx: &Ipv4Udp, pkt: &[u8]) -> u32 {
        let mut all = vec![0u8; HEADROOM];
        ctx.pseudo_header(pkt.len(), &mut all);
        all.extend_from_slice(&pkt[..pkt.len() - ICRC_LEN]);
        all[HEADROOM + MASKED_AT] = 0xff;
        crc32fast::hash(&all)
    }

    #[test]
    fn the_masked_byte_folded_into_the_start_state_equals_masking_it() {
        let ctx = Ipv4Udp {
            src: Ipv4Addr::new(192, 168, 1, 7),
            dst: Ipv4Addr::new(10, 0, 0, 1),
            ip_id: 0x1234,
            dont_fragment: false,
            src_port: 50000,
            dst_port: 4791,
        };
        let mut cache = IcrcCache::default();
        for len in [16usize, 17, 31, 64, 100, 255, 2048, 4116, 8212] {
            let mut pkt: Vec<u8> = (0..len).map(|b| (b * 13 + len) as u8).collect();
            for byte in 0..=255u8 {
                pkt[MASKED_AT] = byte;
                let want = masked_copy_icrc(&ctx, &pkt);
                assert_eq!(cache.compute(&ctx, &pkt), want, "len {len} byte {byte:#x}");
                assert_eq!(ctx.compute(&pkt), want, "uncached, len {len}");
                let (a, b) = pkt.split_at(BTH_LEN + (len - BTH_LEN) / 3);
                assert_eq!(cache.compute_parts(&ctx, &[a, b]), Some(want));
            }
        }
    }

    #[test]
    fn the_kept_sender_state_with_the_fields_by_table_equals_hashing_the_pseudo_header() {
        let mut ctx = Ipv4Udp {
            src: Ipv4Addr::new(172, 16, 5, 4),
            dst: Ipv4Addr::new(10, 1, 2, 3),
            ip_id: 0,
            dont_fragment: true,
            src_port: 4791,
            dst_port: 4791,
        };
        let mut cache = IcrcCache::default();
        let mut x = 0x1234_5678u32;
        for i in 0..2000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            ctx.ip_id = x as u16;
            ctx.dont_fragment = i % 7 != 0; // a new sender now and then
            let total = 16 + (x >> 16) as usize % 65000;
            assert_eq!(
                cache.start(&ctx, total),
                ctx.pseudo_header_state(total),
                "ip_id {:#x} total {total}",
                ctx.ip_id
            );
        }
    }

    #[test]
    fn emit_sealed_builds_the_packet_with_its_icrc() {
        use crate::wire::{emit, Aeth, Bth, Opcode, Packet, Syndrome};
        let ctx = Ipv4Udp {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
            ip_id: 0,
            dont_fragment: true,
            src_port: 4791,
            dst_port: 4791,
        };
        let mut cache = IcrcCache::default();
        let mut buf = vec![0xee; 9000]; // a kept, longer buffer
        for len in [0usize, 3, 4096] {
            let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut bth = Bth::new(Opcode::SendOnlyImm, 0x42, 77);
            bth.fb = 0x80; // FECN: masked in the ICRC, kept on the wire
            cache.emit_sealed(&ctx, &bth, Some(9), None, &payload, &mut buf);
            let mut want = vec![0u8; Packet::wire_len(Opcode::SendOnlyImm, len)];
            emit(&bth, Some(9), None, &payload, &mut want);
            ctx.seal(&mut want);
            assert_eq!(buf, want, "len {len}");
            assert_eq!(buf[MASKED_AT], 0x80);
        }
        let aeth = Aeth {
            syndrome: Syndrome::Ack(0x1f),
            msn: 3,
        };
        let bth = Bth::new(Opcode::Acknowledge, 9, 1);
        cache.emit_sealed(&ctx, &bth, None, Some(aeth), &[], &mut buf);
        assert_eq!(buf.len(), Packet::wire_len(Opcode::Acknowledge, 0));
        assert!(ctx.verify(&buf));
    }
}
