use super::icrc::{split_ipv4_udp, Ipv4Udp};
use super::*;
use proptest::prelude::*;
use std::net::Ipv4Addr;

fn ctx() -> Ipv4Udp {
    Ipv4Udp {
        src: Ipv4Addr::new(10, 0, 0, 20),
        dst: Ipv4Addr::new(10, 0, 0, 1),
        ip_id: 0,
        dont_fragment: true,
        src_port: 49152,
        dst_port: 4791,
    }
}

#[test]
fn bth_layout_is_bit_exact() {
    let mut b = Bth::new(Opcode::SendOnlyImm, 0x123456, 0xabcdef);
    b.ack_req = true;
    b.solicited = true;
    let mut out = [0u8; 12];
    b.emit(&mut out);
    assert_eq!(
        out,
        [0x05, 0x80, 0xff, 0xff, 0x00, 0x12, 0x34, 0x56, 0x80, 0xab, 0xcd, 0xef]
    );
    assert_eq!(Bth::parse(&out), b);
}

#[test]
fn send_only_imm_round_trip_with_pad() {
    let mut buf = [0u8; 64];
    let bth = Bth::new(Opcode::SendOnlyImm, 0x11, 7);
    let n = emit(&bth, Some(0xdead_be05), None, b"hello", &mut buf);
    assert_eq!(n, 12 + 4 + 8 + 4);
    ctx().seal(&mut buf[..n]);
    let p = Packet::parse(&buf[..n]).unwrap();
    assert_eq!(p.bth.pad, 3);
    assert_eq!(p.imm, Some(0xdead_be05));
    assert_eq!(p.payload, b"hello");
    assert!(ctx().verify(&buf[..n]));
    // Any covered byte flips the ICRC; the masked BTH byte 4 does not.
    let mut bad = buf;
    bad[20] ^= 1;
    assert!(!ctx().verify(&bad[..n]));
    let mut fecn = buf;
    fecn[4] = 0x80;
    assert!(ctx().verify(&fecn[..n]));
    let mut c2 = ctx();
    c2.ip_id = 1;
    assert!(!c2.verify(&buf[..n]), "IP ID is covered");
}

#[test]
fn ack_round_trip() {
    let mut buf = [0u8; 32];
    let bth = Bth::new(Opcode::Acknowledge, 0x22, 0xffffff);
    let aeth = Aeth {
        syndrome: Syndrome::RnrNak(12),
        msn: 0x010203,
    };
    let n = emit(&bth, None, Some(aeth), &[], &mut buf);
    assert_eq!(n, 20);
    let p = Packet::parse(&buf[..n]).unwrap();
    assert_eq!(p.aeth, Some(aeth));
    assert_eq!(p.bth.psn, 0xffffff);
    assert!(p.payload.is_empty());
}

#[test]
fn syndromes() {
    for b in 0..=255u8 {
        assert_eq!(Syndrome::from_byte(b).byte(), b, "{b:#x}");
    }
    assert_eq!(Syndrome::from_byte(0x1f), ACK_UNLIMITED);
    assert_eq!(Syndrome::from_byte(0x2c), Syndrome::RnrNak(12));
    assert_eq!(Syndrome::from_byte(0x60), Syndrome::PsnSeqErr);
}

#[test]
fn rejects_short_and_inconsistent_packets() {
    assert!(matches!(
        Packet::parse(&[]),
        Err(ParseError::Truncated { .. })
    ));
    assert!(matches!(
        Packet::parse(&[0; 15]),
        Err(ParseError::Truncated { need: 16, .. })
    ));
    let mut imm = [0u8; 16];
    imm[0] = 0x05;
    assert!(matches!(
        Packet::parse(&imm),
        Err(ParseError::Truncated { need: 20, .. })
    ));
    let mut ver = [0u8; 16];
    ver[1] = 1;
    assert_eq!(Packet::parse(&ver), Err(ParseError::BadVersion(1)));
    let mut pad = [0u8; 16];
    pad[1] = 0x30;
    assert!(matches!(
        Packet::parse(&pad),
        Err(ParseError::BadPad { pad: 3, payload: 0 })
    ));
    assert!(ParseError::BadPad { pad: 3, payload: 0 }
        .to_string()
        .contains("pad count 3"));
}

#[test]
fn psn_arithmetic_wraps() {
    assert_eq!(psn::diff(0, 0xffffff), 1);
    assert_eq!(psn::diff(0xffffff, 0), -1);
    assert_eq!(psn::diff(5, 3), 2);
    assert_eq!(psn::diff(0x7fffff, 0), 0x7fffff);
    assert_eq!(psn::diff(0x800000, 0), -0x800000);
    assert_eq!(psn::add(0xffffff, 2), 1);
}

#[test]
fn raw_ipv4_udp_split() {
    let mut frame = vec![0u8; 28 + 20];
    frame[0] = 0x45;
    frame[2..4].copy_from_slice(&(48u16).to_be_bytes());
    frame[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    frame[6] = 0x40;
    frame[9] = 17;
    frame[12..16].copy_from_slice(&[10, 0, 0, 20]);
    frame[16..20].copy_from_slice(&[10, 0, 0, 1]);
    frame[20..22].copy_from_slice(&49152u16.to_be_bytes());
    frame[22..24].copy_from_slice(&4791u16.to_be_bytes());
    frame[24..26].copy_from_slice(&28u16.to_be_bytes());
    let (c, payload) = split_ipv4_udp(&frame).unwrap();
    assert_eq!(c.ip_id, 0x1234);
    assert!(c.dont_fragment);
    assert_eq!((c.src_port, c.dst_port), (49152, 4791));
    assert_eq!(payload.len(), 20);
    assert!(split_ipv4_udp(&frame[..20]).is_none());
    frame[9] = 6;
    assert!(split_ipv4_udp(&frame).is_none());
}

proptest! {
    #[test]
    fn encode_decode_is_identity(
        op in prop::sample::select(vec![0u8, 1, 2, 3, 4, 5, 0x11, 0x06, 0x0a]),
        qp in 0u32..0x1000000, p in 0u32..0x1000000, ack in any::<bool>(), se in any::<bool>(),
        imm in any::<u32>(), syn in any::<u8>(), msn in 0u32..0x1000000,
        payload in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let opcode = Opcode::from_byte(op);
        prop_assert_eq!(opcode.byte(), op);
        let mut bth = Bth::new(opcode, qp, p);
        bth.ack_req = ack;
        bth.solicited = se;
        let aeth = Aeth { syndrome: Syndrome::from_byte(syn), msn };
        let payload = if opcode.has_aeth() { vec![] } else { payload };
        let mut buf = vec![0u8; Packet::wire_len(opcode, payload.len())];
        let n = emit(&bth, Some(imm), Some(aeth), &payload, &mut buf);
        prop_assert_eq!(n, buf.len());
        ctx().seal(&mut buf);
        let parsed = Packet::parse(&buf).unwrap();
        prop_assert_eq!(parsed.bth.opcode, opcode);
        prop_assert_eq!(parsed.bth.dest_qp, qp);
        prop_assert_eq!(parsed.bth.psn, p);
        prop_assert_eq!(parsed.bth.ack_req, ack);
        prop_assert_eq!(parsed.bth.solicited, se);
        prop_assert_eq!(parsed.payload, &payload[..]);
        prop_assert_eq!(parsed.imm, opcode.has_imm().then_some(imm));
        prop_assert_eq!(parsed.aeth, opcode.has_aeth().then_some(aeth));
        prop_assert!(ctx().verify(&buf));
    }

    #[test]
    fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = Packet::parse(&bytes);
        let _ = split_ipv4_udp(&bytes);
    }
}
