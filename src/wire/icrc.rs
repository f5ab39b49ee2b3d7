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

/// Bytes in front of a packet that [`Ipv4Udp::compute_in_headroom`] uses for
/// the pseudo-header: 8 (LRH stand-in) + 20 (IPv4) + 8 (UDP).
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
    /// `pkt_len` bytes (see [`IcrcCache`]).
    fn pseudo_header_state(&self, pkt_len: usize) -> crc32fast::Hasher {
        let mut hdr = [0u8; HEADROOM];
        self.pseudo_header(pkt_len, &mut hdr);
        let mut h = crc32fast::Hasher::new();
        h.update(&hdr);
        h
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
        crc_from(self.pseudo_header_state(total), parts, total)
    }

    /// True when the ICRC carried in the last 4 bytes of `parts` (see
    /// [`Ipv4Udp::compute_parts`]) is right.
    pub fn verify_parts(&self, parts: &[&[u8]]) -> bool {
        self.compute_parts(parts) == Some(carried(parts))
    }

    /// The ICRC of the packet that starts [`HEADROOM`] bytes into `buf`, in one
    /// CRC pass: the masked IPv4/UDP pseudo-header is written into the
    /// headroom and the BTH's FECN/BECN byte is masked in place (and restored),
    /// so crc32fast's folding path covers header and payload together.
    /// Returns the same value as [`Ipv4Udp::compute`] on `&buf[HEADROOM..]`.
    pub fn compute_in_headroom(&self, buf: &mut [u8]) -> u32 {
        assert!(
            buf.len() >= HEADROOM + BTH_LEN + ICRC_LEN,
            "buffer shorter than headroom + BTH + ICRC"
        );
        let pkt_len = buf.len() - HEADROOM;
        self.pseudo_header(pkt_len, buf);
        let fb = buf[HEADROOM + 4];
        buf[HEADROOM + 4] = 0xff;
        let crc = crc32fast::hash(&buf[..buf.len() - ICRC_LEN]);
        buf[HEADROOM + 4] = fb;
        crc
    }

    /// [`Ipv4Udp::compute_in_headroom`], stored in the packet's last 4 bytes.
    pub fn seal_in_headroom(&self, buf: &mut [u8]) {
        let c = self.compute_in_headroom(buf);
        let n = buf.len();
        buf[n - ICRC_LEN..].copy_from_slice(&c.to_le_bytes());
    }

    /// Builds a packet (see [`super::emit`]) into `buf` behind [`HEADROOM`]
    /// bytes and fills its ICRC in one CRC pass: the packet is
    /// `buf[HEADROOM..]`. `buf` is resized (kept buffers do not allocate).
    pub fn emit_sealed(
        &self,
        bth: &super::Bth,
        imm: Option<u32>,
        aeth: Option<super::Aeth>,
        payload: &[u8],
        buf: &mut Vec<u8>,
    ) {
        buf.resize(
            HEADROOM + super::Packet::wire_len(bth.opcode, payload.len()),
            0,
        );
        super::emit(bth, imm, aeth, payload, &mut buf[HEADROOM..]);
        self.seal_in_headroom(buf);
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

/// The ICRC with the pseudo-header's CRC state kept across packets: packets
/// from one sender with one length (a stream of equal frames, every ACK)
/// share their masked IPv4/UDP pseudo-header, so its CRC state is computed
/// once and cloned; the masked BTH is hashed from the stack, then the
/// packet's bytes where they are. Nothing is written into the packet right
/// before the CRC reads it (a store there stalls the wide loads that follow).
/// The same values as [`Ipv4Udp::compute_parts`].
#[derive(Clone, Default)]
pub struct IcrcCache {
    key: Option<(Ipv4Udp, usize)>,
    state: crc32fast::Hasher,
}

impl IcrcCache {
    /// [`Ipv4Udp::compute_parts`] through the cache.
    pub fn compute_parts(&mut self, ctx: &Ipv4Udp, parts: &[&[u8]]) -> Option<u32> {
        let total = checked_total(parts)?;
        if self.key != Some((*ctx, total)) {
            self.state = ctx.pseudo_header_state(total);
            self.key = Some((*ctx, total));
        }
        crc_from(self.state.clone(), parts, total)
    }

    /// True when the ICRC carried in the last 4 bytes of `parts` is right.
    pub fn verify_parts(&mut self, ctx: &Ipv4Udp, parts: &[&[u8]]) -> bool {
        self.compute_parts(ctx, parts) == Some(carried(parts))
    }
}

/// The UDP payload length `parts` hold, if it can carry a BTH and an ICRC
/// and the first part holds the whole BTH.
fn checked_total(parts: &[&[u8]]) -> Option<usize> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let first = parts.first()?;
    (total >= BTH_LEN + ICRC_LEN && first.len() >= BTH_LEN).then_some(total)
}

/// The ICRC from `h` (the pseudo-header's state): the BTH masked on the
/// stack, then every byte up to the ICRC where it lies.
fn crc_from(mut h: crc32fast::Hasher, parts: &[&[u8]], total: usize) -> Option<u32> {
    let mut bth = [0u8; BTH_LEN];
    bth.copy_from_slice(&parts.first()?[..BTH_LEN]);
    bth[4] = 0xff; // FECN | BECN | resv6 masked
    h.update(&bth);
    let mut left = total - BTH_LEN - ICRC_LEN;
    for (k, p) in parts.iter().enumerate() {
        let p = if k == 0 { &p[BTH_LEN..] } else { p };
        let take = p.len().min(left);
        h.update(&p[..take]);
        left -= take;
    }
    Some(h.finalize())
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
mod cache_tests {
    use super::*;
    use std::net::Ipv4Addr;

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
}
