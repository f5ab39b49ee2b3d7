//! rocev2's ICRC against an independent implementation: scapy's
//! `scapy.contrib.roce`, both ways. Packets scapy builds must verify here;
//! packets built here must verify in scapy. Needs python3 with scapy (CI
//! installs it); without scapy the test is skipped locally and fails in CI.

use std::io::Write;
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use rocev2::wire::icrc::{split_ipv4_udp, IcrcCache, Ipv4Udp};
use rocev2::wire::{emit, Aeth, Bth, Opcode, Packet, Syndrome};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/scapy_oracle.py");

fn scapy_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import scapy.contrib.roce"])
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "scapy is required in CI (pip install scapy)"
        );
        eprintln!("SKIPPED: python3 with scapy not found (pip install scapy)");
    }
    ok
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// An IPv4 + UDP header in front of `udp_payload`, as the kernel would build it.
fn ip_packet(ctx: &Ipv4Udp, tos: u8, ttl: u8, udp_payload: &[u8]) -> Vec<u8> {
    let total = 28 + udp_payload.len();
    let mut p = vec![0u8; total];
    p[0] = 0x45;
    p[1] = tos;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&ctx.ip_id.to_be_bytes());
    p[6] = if ctx.dont_fragment { 0x40 } else { 0 };
    p[8] = ttl;
    p[9] = 17;
    p[12..16].copy_from_slice(&ctx.src.octets());
    p[16..20].copy_from_slice(&ctx.dst.octets());
    let mut sum: u32 = 0;
    for i in (0..20).step_by(2) {
        sum += u16::from_be_bytes([p[i], p[i + 1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    p[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
    p[20..22].copy_from_slice(&ctx.src_port.to_be_bytes());
    p[22..24].copy_from_slice(&ctx.dst_port.to_be_bytes());
    p[24..26].copy_from_slice(&((8 + udp_payload.len()) as u16).to_be_bytes());
    p[28..].copy_from_slice(udp_payload);
    p
}

#[test]
fn scapy_packets_verify_here() {
    if !scapy_available() {
        return;
    }
    let out = Command::new("python3")
        .args([SCRIPT, "gen"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut n = 0;
    for line in text.lines() {
        let ip = unhex(line.trim());
        let (ctx, udp) = split_ipv4_udp(&ip).expect("IPv4/UDP");
        let pkt = Packet::parse(udp).expect("parses");
        assert!(
            ctx.verify(udp),
            "scapy packet {n} ({:?}) fails our ICRC check",
            pkt.bth.opcode
        );
        let mut bad = udp.to_vec();
        let last = bad.len() - 5;
        bad[last] ^= 0x01;
        assert!(!ctx.verify(&bad));
        n += 1;
    }
    assert!(n >= 12, "only {n} packets from scapy");
}

/// opcode, payload, immediate, AETH, IP ID, DF, TOS, TTL
type Case = (
    Opcode,
    Vec<u8>,
    Option<u32>,
    Option<Aeth>,
    u16,
    bool,
    u8,
    u8,
);

#[test]
fn our_packets_verify_in_scapy() {
    if !scapy_available() {
        return;
    }
    let mut lines = Vec::new();
    let cases: Vec<Case> = vec![
        (
            Opcode::SendOnlyImm,
            (0..4096).map(|i| i as u8).collect(),
            Some(0x305),
            None,
            0,
            true,
            0,
            64,
        ),
        (
            Opcode::SendOnlyImm,
            b"abc".to_vec(),
            Some(1),
            None,
            0x4321,
            false,
            0xb8,
            1,
        ),
        (Opcode::SendFirst, vec![9; 4096], None, None, 0, true, 0, 64),
        (Opcode::SendLast, vec![1; 7], None, None, 7, true, 0, 64),
        (Opcode::SendOnly, vec![], None, None, 0, true, 0, 64),
        (
            Opcode::Acknowledge,
            vec![],
            None,
            Some(Aeth {
                syndrome: Syndrome::Ack(0x1f),
                msn: 3,
            }),
            0,
            true,
            0,
            64,
        ),
        (
            Opcode::Acknowledge,
            vec![],
            None,
            Some(Aeth {
                syndrome: Syndrome::RnrNak(12),
                msn: 0xffffff,
            }),
            0,
            true,
            0,
            64,
        ),
        (
            Opcode::Acknowledge,
            vec![],
            None,
            Some(Aeth {
                syndrome: Syndrome::PsnSeqErr,
                msn: 1,
            }),
            0,
            true,
            0,
            64,
        ),
    ];
    for (i, (op, payload, imm, aeth, ip_id, df, tos, ttl)) in cases.iter().enumerate() {
        let ctx = Ipv4Udp {
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 20),
            ip_id: *ip_id,
            dont_fragment: *df,
            src_port: 4791,
            dst_port: 4791,
        };
        let mut bth = Bth::new(*op, 0x22 + i as u32, 0xfffff0 + i as u32);
        bth.ack_req = true;
        let mut buf = vec![0u8; Packet::wire_len(*op, payload.len())];
        emit(&bth, *imm, *aeth, payload, &mut buf);
        ctx.seal(&mut buf);
        // The send paths' builder puts the same bytes on the wire.
        let mut sent = Vec::new();
        IcrcCache::default().emit_sealed(&ctx, &bth, *imm, *aeth, payload, &mut sent);
        assert_eq!(sent, buf, "case {i}: IcrcCache::emit_sealed differs");
        lines.push(hex(&ip_packet(&ctx, *tos, *ttl, &buf)));
    }
    let mut child = Command::new("python3")
        .args([SCRIPT, "check"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all((lines.join("\n") + "\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let verdicts: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(verdicts.len(), cases.len());
    for (i, v) in verdicts.iter().enumerate() {
        assert_eq!(v, "ok", "case {i} ({:?})", cases[i].0);
    }
}
