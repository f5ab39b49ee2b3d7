//! The IPv4 and UDP header fields a RoCEv2 packet's ICRC covers, and their
//! parsing from a raw capture (the only place the IP header is seen).

use std::net::Ipv4Addr;

/// The IPv4 and UDP fields the ICRC covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv4Udp {
    /// IPv4 source.
    pub src: Ipv4Addr,
    /// IPv4 destination.
    pub dst: Ipv4Addr,
    /// IPv4 identification (0 for what Linux sends from an unconnected UDP
    /// socket with IP_PMTUDISC_DO).
    pub ip_id: u16,
    /// The DF flag.
    pub dont_fragment: bool,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port (4791).
    pub dst_port: u16,
}

/// The IPv4 + UDP header at the start of `head`, in front of a RoCEv2
/// payload (raw capture mode), of a frame `frame_len` bytes long (link
/// padding allowed): the ICRC context, where the UDP payload starts and its
/// length. `None` when it is not IPv4/UDP, is a fragment, or the lengths
/// disagree. `head` must hold the IP and UDP headers.
pub fn parse_ipv4_udp(head: &[u8], frame_len: usize) -> Option<(Ipv4Udp, usize, usize)> {
    if head.len() < 20 || head[0] >> 4 != 4 || head[9] != 17 {
        return None;
    }
    let ihl = (head[0] & 0xf) as usize * 4;
    if ihl < 20 || head.len() < ihl + 8 || u16::from_be_bytes([head[6], head[7]]) & 0x3fff != 0 {
        return None;
    }
    let ip_len = u16::from_be_bytes([head[2], head[3]]) as usize;
    let udp = &head[ihl..];
    let udp_len = u16::from_be_bytes([udp[4], udp[5]]) as usize;
    if ip_len > frame_len || udp_len < 8 || ihl + udp_len > ip_len {
        return None;
    }
    let ctx = Ipv4Udp {
        src: Ipv4Addr::new(head[12], head[13], head[14], head[15]),
        dst: Ipv4Addr::new(head[16], head[17], head[18], head[19]),
        ip_id: u16::from_be_bytes([head[4], head[5]]),
        dont_fragment: head[6] & 0x40 != 0,
        src_port: u16::from_be_bytes([udp[0], udp[1]]),
        dst_port: u16::from_be_bytes([udp[2], udp[3]]),
    };
    Some((ctx, ihl + 8, udp_len - 8))
}

/// [`parse_ipv4_udp`] of a whole frame: the ICRC context and the UDP payload.
pub fn split_ipv4_udp(frame: &[u8]) -> Option<(Ipv4Udp, &[u8])> {
    let (ctx, at, len) = parse_ipv4_udp(frame, frame.len())?;
    Some((ctx, &frame[at..at + len]))
}
