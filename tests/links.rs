//! Many FPGAs, one host address and port (issue 39): soft-backend servers
//! sharing 127.0.0.1:4791, each fed by its own FPGA emulator from its own
//! address (127.0.0.x: loopback routes all of 127/8), as a NIC serves
//! several FPGAs on UDP 4791. Every frame of every link is verified (its
//! pattern sequence number says which link and which frame), and each
//! server's counters are its own. Each test uses its own emulator addresses
//! (the servers of one process may not receive from the same FPGA address),
//! so the tests of this file share the port while they run in parallel.

use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocev2::emulator::{pattern, EmulatorConfig, FpgaEmulator};
use rocev2::wire::{self, Bth, Opcode, Packet};
use rocev2::{ConnectParams, Device, Frame, IcrcCheck, Server, ServerConfig, SoftConfig};

mod common;
use common::number;

/// The tests here share UDP port 4791 (one SO_REUSEPORT group), and a
/// socket joining a group makes the kernel spread packets over every member
/// until a member connects again (microseconds; a loaded machine can stretch
/// it): a test creating servers would then hand another test's stream a
/// packet or two at the wrong server (counted foreign there, resent by its
/// FPGA). The tests check that no such packet ever arrives, so they run one
/// at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// RoCEv2's port: the one every FPGA sends to.
const PORT: u16 = 4791;
const SIZE: usize = 4096;

/// One link: a server and what its callback saw.
struct Link {
    server: Server,
    /// The server's device (kept open beside it).
    _dev: Device,
    /// The emulator's address and QPN.
    fpga_ip: Ipv4Addr,
    fpga_qpn: u32,
    /// Frames seen, and the first problem (wrong link, order or bytes).
    seen: Arc<AtomicU64>,
    err: Arc<Mutex<Option<String>>>,
}

/// Frame `k` of link `i` carries pattern sequence number `i << 40 | k`.
fn first_seq(i: usize) -> u64 {
    (i as u64) << 40
}

/// A server on 127.0.0.1:`port` (0: a free port of its own) whose FPGA is
/// 127.0.0.`ip_last`, connected, with a callback that checks each frame is
/// its link's next one. Odd links read the UDP socket (icrc_check off),
/// even ones the raw capture where the process may (auto): both ways of
/// receiving share the port.
fn open_link(i: usize, port: u16, ip_last: u8) -> Link {
    let dev = Device::open(
        &SoftConfig {
            udp_port: port,
            peer_udp_port: 0,
            icrc_check: if i % 2 == 1 {
                IcrcCheck::Off
            } else {
                IcrcCheck::Auto
            },
            ..SoftConfig::new("127.0.0.1")
        }
        .into(),
    )
    .unwrap_or_else(|e| panic!("link {i}: {e}"));
    let server = Server::create(
        &dev,
        &ServerConfig {
            max_payload: SIZE as u32,
            rx_queue_depth: 64,
            spin_us: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let (seen, err) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(None)));
    let (s2, e2) = (seen.clone(), err.clone());
    server
        .set_frame_callback(move |f: Frame| {
            let want = first_seq(i) + s2.load(Ordering::SeqCst);
            let problem = match pattern::check(f.data()) {
                Err(e) => Some(e),
                Ok(seq) if seq >> 40 != i as u64 => {
                    Some(format!("link {i} got link {}'s frame", seq >> 40))
                }
                Ok(seq) if seq != want => Some(format!("link {i}: frame {seq} where {want}")),
                Ok(_) if f.channel() != i as u8 => {
                    Some(format!("link {i}: channel {}", f.channel()))
                }
                Ok(_) => None,
            };
            if let Some(p) = problem {
                e2.lock().unwrap().get_or_insert(p);
            }
            s2.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let fpga_ip = Ipv4Addr::new(127, 0, 0, ip_last);
    let fpga_qpn = 0x100 + i as u32;
    let hp = server.host_params();
    server
        .set_fpga_gid(rocev2::Gid::from_ipv4(fpga_ip))
        .unwrap();
    server
        .complete_connection(&ConnectParams::new(fpga_qpn, hp.sq_psn, 5, 12).unwrap())
        .unwrap();
    Link {
        server,
        _dev: dev,
        fpga_ip,
        fpga_qpn,
        seen,
        err,
    }
}

impl Link {
    /// An emulator for this link from its FPGA address (a free port),
    /// its frames numbered from `next` on.
    fn emulator(&self, i: usize, next: u64) -> FpgaEmulator {
        let hp = self.server.host_params();
        let host = SocketAddrV4::new(Ipv4Addr::LOCALHOST, hp.udp_port);
        let mut c =
            EmulatorConfig::new(SocketAddrV4::new(self.fpga_ip, 0), host, hp.qpn, hp.sq_psn);
        c.qpn = self.fpga_qpn;
        // 1.07 s x 7 retries: no fault is injected, so a timeout only fires when
        // a loaded machine keeps the host from answering for that long.
        c.timeout_code = 18;
        c.first_seq = first_seq(i) + next;
        FpgaEmulator::new(c).unwrap()
    }

    /// Waits (bounded, generous) for `n` frames, then checks them and the
    /// server's counters.
    fn check(&self, i: usize, n: u64, restarts: u64) {
        let t0 = Instant::now();
        while self.seen.load(Ordering::SeqCst) < n && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(*self.err.lock().unwrap(), None, "link {i}");
        assert_eq!(self.seen.load(Ordering::SeqCst), n, "link {i}");
        let s = self.server.stats();
        let soft = s.soft();
        assert_eq!((s.frames, s.bytes), (n, n * SIZE as u64), "link {i}: {s:?}");
        assert_eq!(
            (soft.foreign_packets, soft.malformed, soft.icrc_errors),
            (0, 0, 0),
            "link {i}: only its FPGA's packets reach it: {soft:?}"
        );
        assert_eq!(s.peer_restarts(), restarts, "link {i}: {soft:?}");
        if restarts == 0 {
            assert_eq!(soft.stale_packets, 0, "link {i}: {soft:?}");
        }
    }
}

/// Streams `frames` frames on link `i` from a new emulator.
fn stream(link: &Link, i: usize, next: u64, frames: u64) {
    stream_on(&mut link.emulator(i, next), i, frames);
}

/// Streams `frames` frames of link `i` from `emu`.
fn stream_on(emu: &mut FpgaEmulator, i: usize, frames: u64) {
    emu.stream(
        frames,
        SIZE,
        &[i as u8],
        64,
        Duration::from_secs(120),
        |_| {},
    )
    .unwrap_or_else(|e| panic!("link {i}: {e}"));
}

/// `n` links on one port, each streamed at once by its own emulator.
fn links_on_one_port(n: usize, port: u16, first_ip: u8, frames: u64) {
    let links: Vec<Link> = (0..n)
        .map(|i| open_link(i, port, first_ip + i as u8))
        .collect();
    if port != 0 {
        for l in &links {
            assert_eq!(l.server.host_params().udp_port, port);
        }
    }
    std::thread::scope(|s| {
        for (i, l) in links.iter().enumerate() {
            s.spawn(move || stream(l, i, 0, frames));
        }
    });
    for (i, l) in links.iter().enumerate() {
        l.check(i, frames, 0);
    }
}

#[test]
fn two_servers_share_port_4791() {
    let _serial = serial();
    links_on_one_port(2, PORT, 2, 3000);
}

#[test]
fn eight_servers_share_port_4791() {
    let _serial = serial();
    links_on_one_port(8, PORT, 10, 1000);
}

#[test]
fn servers_on_ports_of_their_own_still_work() {
    let _serial = serial();
    links_on_one_port(2, 0, 20, 2000);
}

/// Link 0's FPGA restarts (a new emulator: a new source port, the first PSN
/// again) while the others stream: its server re-synchronises (one peer
/// restart) and no other link sees anything of it.
#[test]
fn one_fpga_restarting_disturbs_no_other_link() {
    let _serial = serial();
    const N: usize = 4;
    const CHUNK: u64 = 500;
    let links: Vec<Link> = (0..N).map(|i| open_link(i, PORT, 30 + i as u8)).collect();
    let done = AtomicBool::new(false);
    let chunks: Vec<AtomicU64> = (0..N).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for (i, l) in links.iter().enumerate().skip(1) {
            let (done, chunks) = (&done, &chunks);
            s.spawn(move || {
                // One emulator, stream after stream, until link 0 is
                // through its restart.
                let mut emu = l.emulator(i, 0);
                while !done.load(Ordering::SeqCst) || chunks[i].load(Ordering::SeqCst) < 2 {
                    stream_on(&mut emu, i, CHUNK);
                    chunks[i].fetch_add(1, Ordering::SeqCst);
                }
            });
        }
        let l0 = &links[0];
        stream(l0, 0, 0, CHUNK);
        // Restart while every other link is streaming.
        while chunks[1..].iter().any(|c| c.load(Ordering::SeqCst) == 0) {
            std::thread::sleep(Duration::from_millis(1));
        }
        stream(l0, 0, CHUNK, CHUNK);
        done.store(true, Ordering::SeqCst);
    });
    links[0].check(0, 2 * CHUNK, 1);
    for (i, l) in links.iter().enumerate().skip(1) {
        l.check(i, chunks[i].load(Ordering::SeqCst) * CHUNK, 0);
    }
}

/// A hostile sender on the port (its own address): garbage, ACKs, and
/// requests forged with every server's QPN at PSNs around its stream's.
/// The kernel hands a connected server its FPGA's packets only (and a
/// server not connected yet nothing): no link loses a frame or counts one
/// of the forgeries, here or in the tests running beside it on the port.
#[test]
fn a_hostile_sender_on_the_port_loses_no_frame() {
    let _serial = serial();
    const N: usize = 3;
    let links: Vec<Link> = (0..N).map(|i| open_link(i, PORT, 40 + i as u8)).collect();
    let targets: Vec<(u32, u32)> = links
        .iter()
        .map(|l| {
            let hp = l.server.host_params();
            (hp.qpn, hp.sq_psn)
        })
        .collect();
    let done = AtomicBool::new(false);
    let sent = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let sock = UdpSocket::bind("127.0.0.250:0").unwrap();
            let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT);
            let mut k = 0u32;
            while !done.load(Ordering::SeqCst) {
                let (qpn, psn0) = targets[k as usize % N];
                let psn = wire::psn::add(psn0, k.wrapping_mul(7) % 64);
                let op =
                    [Opcode::SendOnlyImm, Opcode::SendFirst, Opcode::Acknowledge][k as usize % 3];
                let bth = Bth::new(op, qpn, psn);
                let mut buf = vec![0u8; Packet::wire_len(op, 64)];
                let aeth = (op == Opcode::Acknowledge).then_some(wire::Aeth {
                    syndrome: wire::Syndrome::Ack(0x1f),
                    msn: k,
                });
                wire::emit(&bth, Some(k), aeth, &[0xa5; 64], &mut buf);
                let _ = sock.send_to(&buf, to);
                let _ = sock.send_to(&[0xff; 7][..(k as usize % 7) + 1], to);
                sent.fetch_add(2, Ordering::Relaxed);
                k = k.wrapping_add(1);
                if k % 64 == 0 {
                    std::thread::yield_now();
                }
            }
        });
        std::thread::scope(|s2| {
            for (i, l) in links.iter().enumerate() {
                s2.spawn(move || stream(l, i, 0, 2000));
            }
        });
        done.store(true, Ordering::SeqCst);
    });
    assert!(sent.load(Ordering::Relaxed) > 0);
    for (i, l) in links.iter().enumerate() {
        l.check(i, 2000, 0);
    }
}

/// Servers in two processes on one port: `rocev2 recv` in a child beside
/// two servers here, each with its own emulator.
#[test]
fn servers_in_two_processes_share_the_port() {
    let _serial = serial();
    const FRAMES: u64 = 2000;
    let child_fpga = Ipv4Addr::new(127, 0, 0, 50);
    let mut recv = Command::new(env!("CARGO_BIN_EXE_rocev2"))
        .args(["recv", "--port", &PORT.to_string(), "--peer-port", "0"])
        .args(["--fpga-ip", &child_fpga.to_string(), "--fpga-qpn", "0x4242"])
        .args(recv_stream_args(FRAMES))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(recv.stdout.take().unwrap());
    let mut params = String::new();
    out.read_line(&mut params).unwrap();
    assert_eq!(number(&params, "udp_port"), PORT as u64, "{params}");
    let links: Vec<Link> = (0..2).map(|i| open_link(i, PORT, 51 + i as u8)).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut c = EmulatorConfig::new(
                SocketAddrV4::new(child_fpga, 0),
                SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT),
                number(&params, "qpn") as u32,
                number(&params, "sq_psn") as u32,
            );
            c.qpn = 0x4242;
            // 1.07 s x 7 retries: no fault is injected, so a timeout only fires when
            // a loaded machine keeps the host from answering for that long.
            c.timeout_code = 18;
            let mut emu = FpgaEmulator::new(c).unwrap();
            emu.stream(FRAMES, SIZE, &[0], 64, Duration::from_secs(120), |_| {})
                .unwrap();
        });
        for (i, l) in links.iter().enumerate() {
            s.spawn(move || stream(l, i, 0, FRAMES));
        }
    });
    let mut summary = String::new();
    out.read_to_string(&mut summary).unwrap();
    let mut err = String::new();
    recv.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(recv.wait().unwrap().success(), "{summary}{err}");
    assert_eq!(number(&summary, "frames"), FRAMES, "{summary}");
    assert_eq!(number(&summary, "verify_errors"), 0, "{summary}");
    for (i, l) in links.iter().enumerate() {
        l.check(i, FRAMES, 0);
    }
}

/// The servers of one process cannot tell two FPGAs on one address apart
/// by its source port when either takes any port (peer_udp_port 0): the
/// second is refused when it names its FPGA (set_fpga_gid), saying what to
/// do; another address is taken.
#[test]
fn two_servers_of_one_fpga_address_are_refused() {
    let _serial = serial();
    let _a = open_link(0, PORT, 60);
    let dev = Device::open(
        &SoftConfig {
            udp_port: PORT,
            peer_udp_port: 0,
            ..SoftConfig::new("127.0.0.1")
        }
        .into(),
    )
    .unwrap();
    let b = Server::create(&dev, &ServerConfig::default()).unwrap();
    let e = b
        .set_fpga_gid(rocev2::Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 60)))
        .unwrap_err();
    assert!(
        e.message()
            .contains("already receives from FPGA 127.0.0.60"),
        "{e}"
    );
    assert!(e.message().contains("its own IP address"), "{e}");
    b.set_fpga_gid(rocev2::Gid::from_ipv4(Ipv4Addr::new(127, 0, 0, 61)))
        .unwrap();
}

/// `rocev2 recv` serving two FPGAs (`--fpga IP:QPN` twice) on one port:
/// a host params line per FPGA, then a summary line per FPGA, each its own.
#[test]
fn recv_serves_several_fpgas_each_with_its_summary() {
    let _serial = serial();
    const FRAMES: u64 = 1000;
    let fpgas = [
        (Ipv4Addr::new(127, 0, 0, 70), 0x70u32),
        (Ipv4Addr::new(127, 0, 0, 71), 0x71),
    ];
    let mut recv = Command::new(env!("CARGO_BIN_EXE_rocev2"))
        .args(["recv", "--port", &PORT.to_string(), "--peer-port", "0"])
        .args(
            fpgas
                .iter()
                .flat_map(|(ip, q)| ["--fpga".to_string(), format!("{ip}:{q:#x}")]),
        )
        .args(recv_stream_args(FRAMES))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(recv.stdout.take().unwrap());
    let params: Vec<String> = (0..2)
        .map(|_| {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            l
        })
        .collect();
    std::thread::scope(|s| {
        for (i, ((ip, qpn), p)) in fpgas.iter().zip(&params).enumerate() {
            assert_eq!(number(p, "link"), i as u64, "{p}");
            assert_eq!(number(p, "udp_port"), PORT as u64, "{p}");
            s.spawn(move || {
                let mut c = EmulatorConfig::new(
                    SocketAddrV4::new(*ip, 0),
                    SocketAddrV4::new(Ipv4Addr::LOCALHOST, PORT),
                    number(p, "qpn") as u32,
                    number(p, "sq_psn") as u32,
                );
                c.qpn = *qpn;
                c.timeout_code = 18;
                let mut emu = FpgaEmulator::new(c).unwrap();
                emu.stream(FRAMES, SIZE, &[0], 64, Duration::from_secs(120), |_| {})
                    .unwrap();
            });
        }
    });
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    recv.stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(recv.wait().unwrap().success(), "{rest}{err}");
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines.len(), 2, "{rest}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(number(l, "link"), i as u64, "{l}");
        assert!(l.contains(&format!("\"fpga\": \"{}\"", fpgas[i].0)), "{l}");
        assert_eq!(number(l, "frames"), FRAMES, "{l}");
        assert_eq!(number(l, "verify_errors"), 0, "{l}");
    }
}

/// What both `recv` children of these tests receive: `frames` verified frames
/// of SIZE bytes into 64 slots, giving up after 60 s idle, without spinning.
fn recv_stream_args(frames: u64) -> Vec<String> {
    let (frames, size) = (frames.to_string(), SIZE.to_string());
    [
        "--frames",
        &frames,
        "--verify",
        "--idle-timeout",
        "60",
        "--depth",
        "64",
        "--max-payload",
        &size,
        "--spin-us",
        "0",
    ]
    .map(String::from)
    .to_vec()
}
