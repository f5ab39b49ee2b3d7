//! The soft backend's receive path against real loopback sockets: packets
//! crafted here, payloads checked in the slab, and the zero-copy accounting
//! (which packets the kernel wrote straight into their slot, which took the
//! copy after a missed landing guess).

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::sync::Arc;

use super::*;
use crate::config::{ConnectParams, SoftConfig};
use crate::server::Slab;
use crate::server::{Backend, Completion, CompletionKind, SoftCounters};
use crate::wire::icrc::Ipv4Udp;
use crate::wire::{self, Bth, Opcode, Packet};

const FPGA_QPN: u32 = 0x77;
const PSN0: u32 = 0xff_fff0; // wraps inside most tests

struct Rig {
    be: SoftBackend,
    slab: Arc<Slab>,
    counters: Arc<SoftCounters>,
    // Sends with DF and IP ID 0 (IP_PMTUDISC_DO), as NICs and the emulator
    // do: the ICRC covers the IP ID.
    fpga: UdpIo,
    to: SocketAddrV4,
    psn: u32,
}

fn rig(slots: u32, slot_size: u32, pmtu_code: u32) -> Rig {
    rig_with(slots, slot_size, pmtu_code, IcrcCheck::Off)
}

fn rig_with(slots: u32, slot_size: u32, pmtu_code: u32, icrc: IcrcCheck) -> Rig {
    let slab = Arc::new(Slab::new(slot_size, slots).unwrap());
    let dev = SoftDevice::open(&SoftConfig {
        icrc_check: icrc,
        ..SoftConfig::ephemeral("127.0.0.1")
    })
    .unwrap();
    let mut be = SoftBackend::create(&dev, &slab).unwrap();
    let counters = Arc::clone(&be.counters);
    let fpga = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1).unwrap();
    let p = ConnectParams::new(FPGA_QPN, PSN0, pmtu_code, 12).unwrap();
    be.connect(&p, crate::gid::Gid::from_ipv4(Ipv4Addr::LOCALHOST), 0)
        .unwrap();
    be.post_recv(&(0..slots).collect::<Vec<_>>()).unwrap();
    let to = be.local;
    Rig {
        be,
        slab,
        counters,
        fpga,
        to,
        psn: PSN0,
    }
}

fn payload(tag: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag as usize * 131 + i * 7 + (i >> 8)) as u8)
        .collect()
}

/// A request packet `bth` (AckReq set) from `from` to `to`, ICRC sealed as
/// a NIC would.
fn craft(
    mut bth: Bth,
    imm: Option<u32>,
    data: &[u8],
    from: SocketAddrV4,
    to: SocketAddrV4,
) -> Vec<u8> {
    bth.ack_req = true;
    let mut buf = vec![0u8; Packet::wire_len(bth.opcode, data.len())];
    wire::emit(&bth, imm, None, data, &mut buf);
    Ipv4Udp {
        src: *from.ip(),
        dst: *to.ip(),
        ip_id: 0,
        dont_fragment: true,
        src_port: from.port(),
        dst_port: to.port(),
    }
    .seal(&mut buf);
    buf
}

impl Rig {
    fn qpn(&self) -> u32 {
        self.be.qpn
    }
    /// Sends one packet with an explicit PSN (ICRC sealed, as a NIC would).
    fn send_at(&mut self, op: Opcode, psn: u32, imm: Option<u32>, data: &[u8]) {
        self.send_raw(op, psn, imm, data, 0)
    }
    /// As [`Rig::send_at`], with `flip` XORed into the last payload byte
    /// after the ICRC was sealed.
    fn send_raw(&mut self, op: Opcode, psn: u32, imm: Option<u32>, data: &[u8], flip: u8) {
        let from = self.fpga.local_addr().unwrap();
        let bth = Bth::new(op, self.qpn(), psn);
        let mut buf = craft(bth, imm, data, from, self.to);
        let n = buf.len();
        buf[n - wire::ICRC_LEN - 1] ^= flip;
        assert_eq!(self.fpga.send_batch(&[(self.to, &buf[..])]).unwrap(), 1);
    }
    /// Sends a message as the FPGA does (ONLY, or FIRST/MIDDLE/LAST_IMM).
    fn send_msg(&mut self, data: &[u8], imm: u32, pmtu: usize) {
        let chunks: Vec<&[u8]> = data.chunks(pmtu).collect();
        for (k, c) in chunks.iter().enumerate() {
            let op = Opcode::send_with_imm(k == 0, k + 1 == chunks.len());
            let imm = op.has_imm().then_some(imm);
            self.send_at(op, self.psn, imm, c);
            self.psn = wire::psn::add(self.psn, 1);
        }
    }
    /// Polls until `want` completions arrived (every datagram was already
    /// sent, so they are all queued on the socket).
    fn poll(&mut self, want: usize) -> Vec<Completion> {
        let mut out = Vec::new();
        for _ in 0..1000 {
            self.be.poll(&mut out).unwrap();
            if out.len() >= want {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            out.len(),
            want,
            "completions; {:?}",
            self.counters.snapshot()
        );
        out
    }
    fn check(&self, c: &Completion, want: &[u8], imm: u32) {
        self.check_opt(c, want, Some(imm))
    }
    fn check_opt(&self, c: &Completion, want: &[u8], imm: Option<u32>) {
        assert_eq!(
            c.kind,
            CompletionKind::Recv {
                len: want.len() as u32,
                imm
            }
        );
        let got = self
            .slab
            .write_slot(c.slot, |b| b[..want.len()].to_vec())
            .unwrap();
        assert!(got == want, "payload of slot {} differs", c.slot);
    }
    fn counts(&self) -> (u64, u64) {
        let s = self.counters.snapshot();
        (s.payload_direct, s.payload_copied)
    }
}

#[test]
fn single_packet_frames_land_in_their_slots_without_a_copy() {
    let mut r = rig(8, 4096, 5);
    let frames: Vec<Vec<u8>> = (0..6)
        .map(|k| payload(k, 1000 + 500 * k as usize))
        .collect();
    for (k, f) in frames.iter().enumerate() {
        r.send_msg(f, k as u32, 4096);
    }
    let done = r.poll(6);
    for (k, (c, f)) in done.iter().zip(&frames).enumerate() {
        assert_eq!(c.slot, k as u32);
        r.check(c, f, k as u32);
    }
    assert_eq!(r.counts(), (6, 0));
}

#[test]
fn empty_and_immediate_less_messages_complete_as_acked() {
    // What an RC sender sees ACKed completes: a 0-byte SEND_ONLY_WITH_IMM, a
    // SEND_ONLY without immediate, FIRST..LAST without immediate (pmtu 256).
    let mut r = rig(8, 4096, 1);
    let (p0, p1, p2) = (r.psn, wire::psn::add(r.psn, 1), wire::psn::add(r.psn, 2));
    r.send_at(Opcode::SendOnlyImm, p0, Some(0x77), &[]);
    let one = payload(1, 100);
    r.send_at(Opcode::SendOnly, p1, None, &one);
    let two = payload(2, 300);
    r.send_at(Opcode::SendFirst, p2, None, &two[..256]);
    r.send_at(Opcode::SendLast, wire::psn::add(p2, 1), None, &two[256..]);
    r.psn = wire::psn::add(p2, 2);
    let done = r.poll(3);
    r.check_opt(&done[0], &[], Some(0x77));
    r.check_opt(&done[1], &one, None);
    r.check_opt(&done[2], &two, None);
    let s = r.counters.snapshot();
    assert_eq!((s.invalid_naks_tx, s.malformed), (0, 0), "{s:?}");
}

#[test]
fn a_new_frame_size_costs_one_copy_then_is_learned() {
    // pmtu 1024: 2500-byte frames are FIRST + MIDDLE + LAST_IMM (12/12/16
    // header bytes) after three single-packet frames (16).
    let mut r = rig(16, 4096, 3);
    let small: Vec<Vec<u8>> = (0..3).map(|k| payload(k, 1024)).collect();
    let big: Vec<Vec<u8>> = (3..7).map(|k| payload(k, 2500)).collect();
    for (k, f) in small.iter().enumerate() {
        r.send_msg(f, k as u32, 1024);
    }
    let done = r.poll(3);
    for (k, c) in done.iter().enumerate() {
        r.check(c, &small[k], k as u32);
    }
    assert_eq!(r.counts(), (3, 0));
    // First big frame in its own batch: guessed as ONLY (16 B), it is a
    // FIRST (12 B): that batch takes the copy; its shape is learned.
    r.send_msg(&big[0], 3, 1024);
    let done = r.poll(1);
    r.check(&done[0], &big[0], 3);
    assert_eq!(r.counts(), (3, 3));
    for (k, f) in big.iter().enumerate().skip(1) {
        r.send_msg(f, 3 + k as u32, 1024);
    }
    let done = r.poll(3);
    for (k, c) in done.iter().enumerate() {
        r.check(c, &big[k + 1], 4 + k as u32);
    }
    assert_eq!(r.counts(), (3 + 9, 3), "learned shape: every packet direct");
}

#[test]
fn duplicates_and_gaps_inside_a_batch_fall_back_to_copies_without_damage() {
    let mut r = rig(8, 4096, 5);
    let f: Vec<Vec<u8>> = (0..4).map(|k| payload(k, 4096)).collect();
    let p0 = r.psn;
    r.send_msg(&f[0], 0, 4096);
    // A duplicate of frame 0 lands where frame 1 was guessed to go ...
    r.send_at(Opcode::SendOnlyImm, p0, Some(0), &payload(99, 4096));
    r.send_msg(&f[1], 1, 4096);
    // ... then a packet from the future (dropped, NAKed) ...
    r.send_at(
        Opcode::SendOnlyImm,
        wire::psn::add(r.psn, 1),
        Some(9),
        &payload(98, 64),
    );
    r.send_msg(&f[2], 2, 4096);
    r.send_msg(&f[3], 3, 4096);
    let done = r.poll(4);
    for (k, c) in done.iter().enumerate() {
        r.check(c, &f[k], k as u32);
    }
    let s = r.counters.snapshot();
    assert_eq!((s.duplicates, s.out_of_sequence), (1, 1));
    assert_eq!(s.seq_naks_tx, 1);
    // Frame 0 direct in slot 0. Frame 1 landed in slot 2 (slot 1 took the
    // duplicate) and stays there; frames 2 and 3 likewise one slot on (the
    // dropped packet took slot 3): no copy.
    assert_eq!(
        done.iter().map(|c| c.slot).collect::<Vec<_>>(),
        [0, 2, 4, 5]
    );
    assert_eq!(r.counts(), (4, 0));
}

#[test]
fn frames_beyond_the_posted_slots_get_rnr_and_never_touch_loaned_slots() {
    let mut r = rig(2, 4096, 5);
    let f: Vec<Vec<u8>> = (0..3).map(|k| payload(k, 3000)).collect();
    for (k, x) in f.iter().enumerate() {
        r.send_msg(x, k as u32, 4096);
    }
    let done = r.poll(2);
    let mut loans = Vec::new();
    for (k, c) in done.iter().enumerate() {
        r.check(c, &f[k], k as u32);
        loans.push((c.slot, r.slab.loan(c.slot).unwrap()));
    }
    let s = r.counters.snapshot();
    assert_eq!(s.rnr_naks_tx, 1);
    // Both slots loaned and nothing posted: the retry lands whole in staging.
    r.send_at(
        Opcode::SendOnlyImm,
        wire::psn::add(r.psn, 0xff_ffff),
        Some(2),
        &f[2],
    );
    let mut out = Vec::new();
    for _ in 0..50 {
        r.be.poll(&mut out).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(out.is_empty());
    assert_eq!(r.counters.snapshot().rnr_naks_tx, 2);
    for (k, (slot, gen)) in loans.iter().enumerate() {
        let held = r.slab.loaned(*slot, *gen, 3000).unwrap();
        assert!(held == &f[k][..], "loaned slot {slot} was written");
    }
    assert_eq!(r.counts(), (2, 0));
}

/// Raw capture needs CAP_NET_RAW. Without it these tests have nothing to
/// run on, unless ROCEV2_REQUIRE_RAW is set (CI as root): then they fail.
fn raw_allowed() -> bool {
    if super::raw_capture_allowed() {
        return true;
    }
    assert!(
        std::env::var_os("ROCEV2_REQUIRE_RAW").is_none(),
        "ROCEV2_REQUIRE_RAW is set but raw capture is not allowed (CAP_NET_RAW)"
    );
    eprintln!("raw capture not allowed (no CAP_NET_RAW): raw-mode test not run");
    false
}

#[test]
fn raw_capture_checks_every_icrc_and_drops_corrupted_packets() {
    if !raw_allowed() {
        return;
    }
    let mut r = rig_with(8, 4096, 5, IcrcCheck::Require);
    assert!(r.be.io.raw_capture());
    let f: Vec<Vec<u8>> = (0..3).map(|k| payload(k, 4000 + k as usize)).collect();
    r.send_msg(&f[0], 0, 4096);
    // Frame 1 corrupted on the way: dropped for its ICRC, never delivered ...
    r.send_raw(Opcode::SendOnlyImm, r.psn, Some(1), &f[1], 0x40);
    let done = r.poll(1);
    r.check(&done[0], &f[0], 0);
    let s = r.counters.snapshot();
    assert_eq!((s.icrc_checked, s.icrc_errors, s.icrc_unchecked), (1, 1, 0));
    assert_eq!(s.packets_rx, 2, "our own ACKs on lo are not captured");
    // ... until the requester resends it intact.
    r.send_msg(&f[1], 1, 4096);
    r.send_msg(&f[2], 2, 4096);
    let done = r.poll(2);
    r.check(&done[0], &f[1], 1);
    r.check(&done[1], &f[2], 2);
    let s = r.counters.snapshot();
    assert_eq!((s.icrc_checked, s.icrc_errors), (3, 1));
    assert!(s.payload_direct >= 2, "{s:?}");
}

#[test]
fn raw_capture_sees_only_our_port_and_reads_multi_packet_frames() {
    if !raw_allowed() {
        return;
    }
    let mut r = rig_with(8, 8192, 3, IcrcCheck::Require);
    // Traffic to another port on the same address is not ours to see.
    let other = UdpSocket::bind("127.0.0.1:0").unwrap();
    let other = match other.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        _ => unreachable!(),
    };
    assert_eq!(r.fpga.send_batch(&[(other, &[0u8; 64][..])]).unwrap(), 1);
    // Multi-packet frames (pmtu 1024: FIRST/MIDDLE/LAST_IMM, pad included).
    let f: Vec<Vec<u8>> = (0..4).map(|k| payload(k, 3001 + k as usize)).collect();
    for (k, x) in f.iter().enumerate() {
        r.send_msg(x, k as u32, 1024);
    }
    let done = r.poll(4);
    for (k, c) in done.iter().enumerate() {
        r.check(c, &f[k], k as u32);
    }
    let s = r.counters.snapshot();
    // 3 packets per frame; nothing else (not the other port's datagram, not
    // our own ACKs leaving on lo) was captured.
    assert_eq!(s.packets_rx, 12, "{s:?}");
    assert_eq!((s.icrc_checked, s.icrc_errors, s.malformed), (12, 0, 0));
    assert_eq!(s.payload_direct + s.payload_copied, 12);
}

mod differential {
    //! The scatter receive (payloads landing straight in their slots, copies
    //! after a missed guess) against the plain model: the same packets through
    //! a bare [`Responder`] with every payload copied into a model slab. Both
    //! must complete the same messages with the same bytes.
    use super::*;
    use crate::soft::responder::{Responder, ResponderConfig, Verdict};
    use proptest::prelude::*;

    const SLOTS: u32 = 16;
    const SLOT: u32 = 1024;
    const PMTU: usize = 256; // code 1

    #[derive(Debug, Clone)]
    enum Fault {
        None,
        Duplicate,
        Drop,
        SwapWithNext,
    }

    /// The packets of `sizes` messages as the FPGA sends them, then faults
    /// applied: (opcode, psn, imm, payload).
    fn packets(sizes: &[usize], faults: &[Fault]) -> Vec<(Opcode, u32, Option<u32>, Vec<u8>)> {
        let mut out = Vec::new();
        let mut psn = PSN0;
        for (k, &size) in sizes.iter().enumerate() {
            let data = payload(k as u32, size);
            let chunks: Vec<&[u8]> = data.chunks(PMTU).collect();
            for (j, c) in chunks.iter().enumerate() {
                let op = Opcode::send_with_imm(j == 0, j + 1 == chunks.len());
                out.push((op, psn, op.has_imm().then_some(k as u32), c.to_vec()));
                psn = wire::psn::add(psn, 1);
            }
        }
        let mut i = 0;
        let mut res = Vec::new();
        while i < out.len() {
            match faults.get(i).unwrap_or(&Fault::None) {
                Fault::None => res.push(out[i].clone()),
                Fault::Duplicate => {
                    res.push(out[i].clone());
                    res.push(out[i].clone());
                }
                Fault::Drop => {}
                Fault::SwapWithNext if i + 1 < out.len() => {
                    res.push(out[i + 1].clone());
                    res.push(out[i].clone());
                    i += 1;
                }
                Fault::SwapWithNext => res.push(out[i].clone()),
            }
            i += 1;
        }
        res
    }

    impl Rig {
        /// Sends `pkts` as UDP GSO datagrams of equal-length runs, segment
        /// k sealed for IP ID k.
        fn send_merged(&mut self, pkts: &[(Opcode, u32, Option<u32>, Vec<u8>)]) {
            let mut bufs: Vec<Vec<u8>> = pkts
                .iter()
                .map(|(op, psn, imm, data)| {
                    let mut bth = Bth::new(*op, self.qpn(), *psn);
                    bth.ack_req = op.ends_message();
                    let mut buf = vec![0u8; Packet::wire_len(*op, data.len())];
                    wire::emit(&bth, *imm, None, data, &mut buf);
                    buf
                })
                .collect();
            self.send_sealed_runs(&mut bufs);
        }
    }

    /// The model: completions (slot, len, imm) and each completed slot's bytes.
    fn model(pkts: &[(Opcode, u32, Option<u32>, Vec<u8>)], qpn: u32) -> Vec<(u32, Vec<u8>, u32)> {
        let mut r = Responder::new(
            ResponderConfig {
                qpn,
                pmtu: PMTU as u32,
                slot_size: SLOT,
                min_rnr_timer: 12,
                ack_every: 8,
            },
            PSN0,
        );
        (0..SLOTS).for_each(|s| r.post(s));
        let mut slab = vec![vec![0u8; SLOT as usize]; SLOTS as usize];
        let mut done = Vec::new();
        for (op, psn, imm, data) in pkts {
            let bth = Bth::new(*op, qpn, *psn);
            if let Verdict::Place {
                slot,
                offset,
                done: d,
            } = r.on_packet(&bth, *imm, data.len())
            {
                let at = offset as usize;
                slab[slot as usize][at..at + data.len()].copy_from_slice(data);
                if let Some(d) = d {
                    let bytes = slab[d.slot as usize][..d.len as usize].to_vec();
                    done.push((d.slot, bytes, d.imm.unwrap_or(u32::MAX)));
                }
            }
        }
        done
    }

    fn fault() -> impl Strategy<Value = Fault> {
        prop_oneof![
            8 => Just(Fault::None),
            1 => Just(Fault::Duplicate),
            1 => Just(Fault::Drop),
            1 => Just(Fault::SwapWithNext),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn scatter_receive_matches_the_copying_model(
            sizes in proptest::collection::vec(
                prop_oneof![1usize..=256, Just(256usize), 257usize..=1024, Just(768usize)], 1..12),
            faults in proptest::collection::vec(fault(), 0..48),
            merged in any::<bool>(),
        ) {
            let mut r = rig(SLOTS, SLOT, 1);
            let pkts = packets(&sizes, &faults);
            let want = model(&pkts, r.qpn());
            if merged {
                // Runs of equal packets as UDP GSO datagrams: the receiver
                // gets them merged (GRO) and splits them.
                r.send_merged(&pkts);
            } else {
                for (op, psn, imm, data) in &pkts {
                    r.send_at(*op, *psn, *imm, data);
                }
            }
            // Everything is queued on the socket: poll until it is drained.
            let mut got = Vec::new();
            let mut idle = 0;
            while idle < 20 {
                let before = r.counters.snapshot().packets_rx;
                r.be.poll(&mut got).unwrap();
                if r.counters.snapshot().packets_rx == before {
                    idle += 1;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                } else {
                    idle = 0;
                }
            }
            prop_assert_eq!(r.counters.snapshot().packets_rx, pkts.len() as u64);
            prop_assert_eq!(got.len(), want.len());
            // Which posted slot a message fills is the receiver's choice (a
            // payload that landed in a posted slot stays there); each slot
            // completes at most once here (nothing is re-posted).
            let mut slots: Vec<u32> = got.iter().map(|c| c.slot).collect();
            slots.sort_unstable();
            slots.dedup();
            prop_assert_eq!(slots.len(), got.len());
            for (c, (_, bytes, imm)) in got.iter().zip(&want) {
                prop_assert_eq!(c.kind, CompletionKind::Recv { len: bytes.len() as u32, imm: Some(*imm) });
                let have = r.slab.write_slot(c.slot, |b| b[..bytes.len()].to_vec()).unwrap();
                prop_assert!(&have == bytes, "slot {} bytes differ", c.slot);
            }
            let s = r.counters.snapshot();
            let accepted = s.payload_direct + s.payload_copied;
            prop_assert!(accepted <= pkts.len() as u64);
        }
    }
}

/// A local, non-loopback IPv4 address of this host, if it has one.
fn other_local_ipv4() -> Option<Ipv4Addr> {
    let out = std::process::Command::new("ip")
        .args(["-4", "-o", "addr", "show"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().skip_while(|w| *w != "inet").nth(1))
        .filter_map(|a| a.split('/').next()?.parse::<Ipv4Addr>().ok())
        .find(|ip| !ip.is_loopback())
}

#[test]
fn raw_capture_loses_nothing_that_enters_through_another_interface() {
    if !raw_allowed() {
        return;
    }
    let Some(ip) = other_local_ipv4() else {
        eprintln!("no non-loopback IPv4 address here: test not run");
        return;
    };
    // Bound to (say) eth0's address, the capture sits on eth0; but traffic
    // from this host to that address enters through lo. It must still arrive
    // (through the UDP socket), counted unchecked.
    let slab = Arc::new(Slab::new(4096, 4).unwrap());
    let dev = SoftDevice::open(&SoftConfig {
        icrc_check: IcrcCheck::Require,
        ..SoftConfig::ephemeral(ip.to_string())
    })
    .unwrap();
    let mut be = SoftBackend::create(&dev, &slab).unwrap();
    let counters = Arc::clone(&be.counters);
    assert!(be.io.raw_capture());
    let mut fpga = UdpIo::bind(SocketAddrV4::new(ip, 0), 1).unwrap();
    let p = ConnectParams::new(FPGA_QPN, PSN0, 5, 12).unwrap();
    be.connect(&p, crate::gid::Gid::from_ipv4(ip), 0).unwrap();
    be.post_recv(&[0, 1, 2, 3]).unwrap();
    let data = payload(5, 3000);
    let mut bth = Bth::new(Opcode::SendOnlyImm, be.qpn, PSN0);
    bth.ack_req = true;
    let mut buf = vec![0u8; Packet::wire_len(Opcode::SendOnlyImm, data.len())];
    wire::emit(&bth, Some(9), None, &data, &mut buf);
    Ipv4Udp {
        src: ip,
        dst: ip,
        ip_id: 0,
        dont_fragment: true,
        src_port: fpga.local_addr().unwrap().port(),
        dst_port: be.local.port(),
    }
    .seal(&mut buf);
    assert_eq!(fpga.send_batch(&[(be.local, &buf[..])]).unwrap(), 1);
    let mut out = Vec::new();
    for _ in 0..1000 {
        be.poll(&mut out).unwrap();
        if !out.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(out.len(), 1, "{:?}", counters.snapshot());
    let s = counters.snapshot();
    assert_eq!((s.icrc_unchecked, s.icrc_checked, s.icrc_errors), (1, 0, 0));
    assert_eq!(be.io.via_udp(), 1);
    let got = slab
        .write_slot(out[0].slot, |b| b[..3000].to_vec())
        .unwrap();
    assert!(got == data);
}

#[test]
fn kernel_drops_at_a_full_socket_are_counted() {
    // No polling while 3000 datagrams of 4 KiB arrive: the socket buffer
    // (capped by net.core.rmem_max) overflows; every datagram is either
    // received or counted as dropped by the kernel.
    let mut r = rig_with(4, 4096, 5, IcrcCheck::Off);
    let data = payload(1, 4000);
    let sent = 3000u64;
    for k in 0..sent as u32 {
        r.send_at(Opcode::SendOnlyImm, wire::psn::add(PSN0, k), Some(k), &data);
    }
    let mut out = Vec::new();
    for _ in 0..2000 {
        r.be.poll(&mut out).unwrap();
    }
    let s = r.counters.snapshot();
    assert!(s.socket_drops > 0, "{s:?}");
    assert_eq!(s.packets_rx + s.socket_drops, sent, "{s:?}");
}

impl Rig {
    /// Polls until `f.len()` frames completed, checks each against `f`
    /// (immediates from `tag`), and posts their slots again.
    fn expect_and_repost(&mut self, f: &[Vec<u8>], tag: u32) {
        let done = self.poll(f.len());
        for (k, c) in done.iter().enumerate() {
            self.check(c, &f[k], tag + k as u32);
        }
        let slots: Vec<u32> = done.iter().map(|c| c.slot).collect();
        self.be.post_recv(&slots).unwrap();
    }

    /// Sends `bufs` (packets, ICRC unsealed) as UDP GSO datagrams of
    /// equal-length runs, segment k sealed for IP ID k as the kernel numbers
    /// the segments.
    fn send_sealed_runs(&mut self, bufs: &mut [Vec<u8>]) {
        let from = self.fpga.local_addr().unwrap();
        let mut runs = Vec::new();
        crate::net::gso_runs(bufs.iter().map(|b| b.len()), &mut runs);
        for &(first, count) in &runs {
            for k in 0..count {
                let ctx = Ipv4Udp {
                    src: *from.ip(),
                    dst: *self.to.ip(),
                    ip_id: k as u16,
                    dont_fragment: true,
                    src_port: from.port(),
                    dst_port: self.to.port(),
                };
                ctx.seal(&mut bufs[first + k]);
            }
        }
        let sent = self.fpga.send_segmented(self.to, bufs, &runs).unwrap();
        assert_eq!(sent, bufs.len());
    }
}

impl Rig {
    /// Sends `frames` as SEND_ONLY_WITH_IMMEDIATE packets through UDP GSO
    /// (one datagram per run of equal sizes, segment k sealed for IP ID k,
    /// as the kernel numbers the segments); immediates from `imm`.
    fn send_gso(&mut self, frames: &[Vec<u8>], imm: u32) {
        let mut bufs = Vec::new();
        for (k, f) in frames.iter().enumerate() {
            let mut bth = Bth::new(Opcode::SendOnlyImm, self.qpn(), self.psn);
            bth.ack_req = true;
            let mut buf = vec![0u8; Packet::wire_len(Opcode::SendOnlyImm, f.len())];
            wire::emit(&bth, Some(imm + k as u32), None, f, &mut buf);
            bufs.push(buf);
            self.psn = wire::psn::add(self.psn, 1);
        }
        self.send_sealed_runs(&mut bufs);
    }
}

impl Rig {
    /// Sends 2-packet messages (FIRST + LAST_WITH_IMMEDIATE, `pmtu` bytes
    /// each) through UDP GSO as a NIC's GRO would merge them: FIRST alone,
    /// then each LAST with the next (shorter) FIRST.
    fn send_gso_pairs(&mut self, frames: &[Vec<u8>], imm: u32, pmtu: usize) {
        let mut bufs = Vec::new();
        for (k, f) in frames.iter().enumerate() {
            for (j, c) in f.chunks(pmtu).enumerate() {
                let op = Opcode::send_with_imm(j == 0, j == 1);
                let mut bth = Bth::new(op, self.qpn(), self.psn);
                bth.ack_req = j == 1;
                let mut buf = vec![0u8; Packet::wire_len(op, c.len())];
                wire::emit(
                    &bth,
                    op.has_imm().then_some(imm + k as u32),
                    None,
                    c,
                    &mut buf,
                );
                bufs.push(buf);
                self.psn = wire::psn::add(self.psn, 1);
            }
        }
        self.send_sealed_runs(&mut bufs);
    }
}

#[test]
fn merges_that_begin_mid_message_are_learned_and_land_in_place() {
    let mut r = rig(64, 512, 1);
    let mut tag = 0;
    let mut counts = Vec::new();
    for n in [6usize, 6, 6, 10] {
        let f: Vec<Vec<u8>> = (0..n).map(|k| payload(tag + k as u32, 512)).collect();
        r.send_gso_pairs(&f, tag, 256);
        r.expect_and_repost(&f, tag);
        tag += n as u32;
        counts.push(r.counts());
    }
    // Once the pattern (LAST + next FIRST per datagram) is learnt, every
    // packet lands in place.
    let (d2, c2) = counts[1];
    assert_eq!(counts[3], (d2 + 32, c2), "{counts:?}");
}

#[test]
fn merged_datagrams_land_segment_by_segment_in_their_slots() {
    let mut r = rig(64, 4096, 5);
    let mut tag = 0;
    let mut batch = |r: &mut Rig, n: usize| {
        let f: Vec<Vec<u8>> = (0..n).map(|k| payload(tag + k as u32, 1000)).collect();
        r.send_gso(&f, tag);
        r.expect_and_repost(&f, tag);
        tag += n as u32;
    };
    // The first merged datagram teaches the size and that datagrams merge
    // (planned one packet per entry: the rest of it is copied) ...
    batch(&mut r, 12);
    let (direct, copied) = r.counts();
    assert_eq!(direct + copied, 12);
    assert!(copied >= 11, "({direct}, {copied})");
    // ... after that each segment lands in its own slot, none copied ...
    batch(&mut r, 12);
    assert_eq!(r.counts(), (direct + 12, copied));
    // ... a larger merge than planned: its last packets are copied, then
    // it is planned for.
    batch(&mut r, 16);
    let (direct, copied) = r.counts();
    batch(&mut r, 16);
    batch(&mut r, 10);
    assert_eq!(r.counts(), (direct + 26, copied));
    let s = r.counters.snapshot();
    assert_eq!((s.seq_naks_tx, s.duplicates), (0, 0));
}

#[test]
fn merged_segments_of_another_size_are_copied_not_lost() {
    let mut r = rig(64, 4096, 5);
    let f: Vec<Vec<u8>> = (0..6).map(|k| payload(k, 1000)).collect();
    r.send_gso(&f, 0);
    let done = r.poll(6);
    r.be.post_recv(&done.iter().map(|c| c.slot).collect::<Vec<_>>())
        .unwrap();
    let before = r.counts();
    // Planned for 1000-byte frames; 600 and 1200 bytes arrive, merged.
    for size in [600usize, 1200] {
        let g: Vec<Vec<u8>> = (0..8).map(|k| payload(100 + k, size)).collect();
        r.send_gso(&g, 100);
        r.expect_and_repost(&g, 100);
    }
    let (direct, copied) = r.counts();
    assert_eq!(direct + copied, before.0 + before.1 + 16);
    assert!(copied > before.1, "a wrong size costs copies");
}

#[test]
fn raw_capture_splits_gso_super_packets_and_checks_each_segment() {
    if !raw_allowed() {
        return;
    }
    let mut r = rig_with(64, 4096, 5, IcrcCheck::Require);
    let dropped_before = r.be.io.udp_socket_drops();
    for round in 0..3u32 {
        let f: Vec<Vec<u8>> = (0..10).map(|k| payload(round * 10 + k, 2000)).collect();
        r.send_gso(&f, round * 10);
        r.expect_and_repost(&f, round * 10);
    }
    let s = r.counters.snapshot();
    assert_eq!(
        (s.icrc_checked, s.icrc_errors, s.icrc_unchecked),
        (30, 0, 0)
    );
    assert!(s.payload_direct >= 20, "{s:?}");
    // On loopback the UDP socket has GRO on: its filter drops each
    // 10-segment datagram whole, not segmented into 10 first.
    assert_eq!(r.be.io.udp_socket_drops() - dropped_before, 3);
}

fn local_socket() -> (UdpSocket, SocketAddrV4) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(a) = s.local_addr().unwrap() else {
        unreachable!()
    };
    (s, a)
}

/// With `peer_udp_port` 0 the ACKs go to the port of the FPGA's stream:
/// packets the responder rejects (another QP's, out of sequence, stale),
/// even from the FPGA's IP and later in the same batch, do not steer them
/// (finding 3 of the hardening issue: before, the batch's last packet that
/// parsed chose the port).
#[test]
fn packets_the_responder_rejects_do_not_steer_the_acks() {
    let mut r = rig(4, 4096, 5);
    let ((fpga, fpga_at), (attacker, attacker_at)) = (local_socket(), local_socket());
    let send = |s: &UdpSocket, at, qpn, psn| {
        let bth = Bth::new(Opcode::SendOnlyImm, qpn, psn);
        let buf = craft(bth, Some(1), &payload(1, 64), at, r.to);
        s.send_to(&buf, r.to).unwrap();
    };
    send(&fpga, fpga_at, r.qpn(), PSN0);
    send(&attacker, attacker_at, r.qpn() ^ 1, PSN0 + 1);
    send(&attacker, attacker_at, r.qpn(), wire::psn::add(PSN0, 9));
    send(
        &attacker,
        attacker_at,
        r.qpn(),
        wire::psn::add(PSN0, 0x40_0000),
    );
    let c = r.poll(1);
    r.check(&c[0], &payload(1, 64), 1);
    fpga.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 256];
    let n = fpga.recv(&mut buf).expect("the FPGA gets its ACK");
    let ack = Packet::parse(&buf[..n]).unwrap();
    assert_eq!(ack.bth.opcode, Opcode::Acknowledge);
    attacker.set_nonblocking(true).unwrap();
    let stolen = attacker.recv(&mut buf);
    assert!(stolen.is_err(), "a reply went to the rejected sender");
}

/// Issue 38 finding 8: with `peer_udp_port` 0, a duplicate (a PSN behind)
/// from another port of the FPGA's IP, later in the same batch as the
/// stream's packet, used to steer the batch's ACKs to itself. Only a packet
/// that advances the stream sets where ACKs go; the duplicate's re-ACK goes
/// to the stream's port.
#[test]
fn a_duplicate_from_another_port_does_not_steer_the_acks() {
    let mut r = rig(4, 4096, 5);
    let ((fpga, fpga_at), (other, other_at)) = (local_socket(), local_socket());
    let (qpn, to) = (r.qpn(), r.to);
    let send = |s: &UdpSocket, at, psn, tag| {
        let bth = Bth::new(Opcode::SendOnlyImm, qpn, psn);
        let buf = craft(bth, Some(tag), &payload(tag, 64), at, to);
        s.send_to(&buf, to).unwrap();
    };
    send(&fpga, fpga_at, PSN0, 1);
    let c = r.poll(1);
    r.check(&c[0], &payload(1, 64), 1);
    // The next packet and, behind it in the same batch, a copy of the first.
    send(&fpga, fpga_at, wire::psn::add(PSN0, 1), 2);
    send(&other, other_at, PSN0, 1);
    let c = r.poll(1);
    r.check(&c[0], &payload(2, 64), 2);
    // The copy, when a later batch took it (bounded wait).
    let mut more = Vec::new();
    for _ in 0..5000 {
        if r.counters.snapshot().duplicates == 1 {
            break;
        }
        r.be.poll(&mut more).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let s = r.counters.snapshot();
    assert_eq!(
        (s.duplicates, more.len()),
        (1, 0),
        "the copy was seen: {s:?}"
    );
    fpga.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 256];
    for _ in 0..2 {
        let n = fpga.recv(&mut buf).expect("the FPGA gets its ACKs");
        assert_eq!(
            Packet::parse(&buf[..n]).unwrap().bth.opcode,
            Opcode::Acknowledge
        );
    }
    other.set_nonblocking(true).unwrap();
    assert!(
        other.recv(&mut buf).is_err(),
        "a reply went to the duplicate's port"
    );
}

/// ACKs leave from the port the server receives on: surf's UDP engine sends
/// its next requests to the port the last datagram it got came from
/// (UdpEngineRx latches the server port's remote port), so an ACK from any
/// other port would steer the FPGA's stream away from the server.
#[test]
fn acks_leave_from_the_port_the_server_receives_on() {
    let mut r = rig(4, 4096, 5);
    let (fpga, fpga_at) = local_socket();
    let bth = Bth::new(Opcode::SendOnlyImm, r.qpn(), PSN0);
    let buf = craft(bth, Some(1), &payload(1, 64), fpga_at, r.to);
    fpga.send_to(&buf, r.to).unwrap();
    let c = r.poll(1);
    r.check(&c[0], &payload(1, 64), 1);
    fpga.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut ack = [0u8; 256];
    let (n, from) = fpga.recv_from(&mut ack).expect("the FPGA gets its ACK");
    assert_eq!(
        Packet::parse(&ack[..n]).unwrap().bth.opcode,
        Opcode::Acknowledge
    );
    assert_eq!(
        from,
        std::net::SocketAddr::V4(r.to),
        "the ACK came from another port than the server's"
    );
}
