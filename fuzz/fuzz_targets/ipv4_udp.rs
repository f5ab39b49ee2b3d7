//! Raw capture's IPv4/UDP parsing (what an AF_PACKET socket hands the soft
//! backend): any bytes, never a panic; a parse that succeeds stays inside
//! the frame, and the ICRC check over what it found never panics.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rocev2::wire::icrc::Ipv4Udp;
use rocev2::wire::ipv4udp::{parse_ipv4_udp, split_ipv4_udp};

fuzz_target!(|input: (u16, &[u8])| {
    let (pad, frame) = input;
    // A frame longer than the IP packet (link padding) or cut short.
    let frame_len = frame.len().saturating_add(pad as usize % 64);
    let head = &frame[..frame.len().min(60)];
    if let Some((ctx, at, len)) = parse_ipv4_udp(head, frame_len) {
        assert!(at >= 28 && at <= 68, "{at}");
        assert!(at + len <= frame_len);
        let _: Ipv4Udp = ctx;
    }
    if let Some((ctx, payload)) = split_ipv4_udp(frame) {
        assert!(payload.len() + 28 <= frame.len());
        let _ = ctx.verify_parts(&[payload]);
    }
});
