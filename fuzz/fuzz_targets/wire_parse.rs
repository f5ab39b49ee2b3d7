//! Arbitrary bytes into the wire parser (UDP payloads and raw IPv4 frames):
//! never panics; whatever parses re-encodes to the same packet.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rocev2::wire::{emit, icrc::split_ipv4_udp, Packet};

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Packet::parse(data) {
        let mut buf = vec![0u8; Packet::wire_len(p.bth.opcode, p.payload.len())];
        let n = emit(&p.bth, p.imm, p.aeth, p.payload, &mut buf);
        let q = Packet::parse(&buf[..n]).expect("re-encoded packet parses");
        assert_eq!(
            (
                q.bth.opcode,
                q.bth.dest_qp,
                q.bth.psn,
                q.imm,
                q.aeth,
                q.payload
            ),
            (
                p.bth.opcode,
                p.bth.dest_qp,
                p.bth.psn,
                p.imm,
                p.aeth,
                p.payload
            )
        );
    }
    if let Some((ctx, udp)) = split_ipv4_udp(data) {
        let _ = ctx.verify(udp);
    }
});
