//! Benchmark harnesses for `rocev2 bench` (not a stable API: the CLI is its
//! only user). Each figure is measured against a reference in the same run.
//!
//! The reference the soft backend is measured against: the raw UDP ceiling of
//! this machine — a plain sender/receiver pair moving the same datagram sizes
//! over loopback with the same batching syscalls (sendmmsg/recvmmsg) and no
//! protocol work.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::emulator::StreamPlan;
use crate::error::Result;
use crate::net::UdpIo;

mod dispatch;
mod window;
use crate::sys::poll_readable;
pub use dispatch::dispatch_ns_per_frame;
pub use window::udp_window;

/// A measured rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    /// Datagrams (or frames) per second.
    pub per_sec: f64,
    /// Payload gigabits per second.
    pub gbit: f64,
}

impl Rate {
    /// `count` items of `bytes` each in `elapsed`.
    pub fn of(count: u64, bytes: u64, elapsed: Duration) -> Rate {
        let s = elapsed.as_secs_f64().max(1e-9);
        Rate {
            per_sec: count as f64 / s,
            gbit: bytes as f64 * 8.0 / s / 1e9,
        }
    }
}

/// Sends datagrams of `size` bytes from one thread to another over loopback
/// for `duration`, 16 per sendmmsg, and returns the receiver's rate.
pub fn udp_ceiling(size: usize, duration: Duration) -> Result<Rate> {
    ceiling(size, duration, false)
}

/// Sends datagrams of `size` bytes from one thread to another over loopback
/// for `duration` as UDP GSO datagrams (as many segments as fit 64 KiB),
/// into a receiver with UDP GRO on, and returns the receiver's rate in
/// datagrams (segments): what the kernel allows when nobody pays per packet.
pub fn gso_gro_ceiling(size: usize, duration: Duration) -> Result<Rate> {
    ceiling(size, duration, true)
}

/// A sender thread and a receiver (this thread) moving `size`-byte
/// datagrams for `duration`: plain sendmmsg/recvmmsg, or GSO into GRO.
fn ceiling(size: usize, duration: Duration, merged: bool) -> Result<Rate> {
    let mut rx = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 64)?;
    if merged {
        rx.enable_gro();
    }
    let to = rx.local_addr()?;
    let mut tx = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sender = std::thread::spawn(move || -> Result<()> {
        let bufs: Vec<Vec<u8>> = (0..if merged { 64 } else { 16 })
            .map(|_| vec![0xa5u8; size])
            .collect();
        let mut runs = Vec::new();
        if merged {
            crate::net::gso_runs(bufs.iter().map(|b| b.len()), &mut runs);
        }
        while !stop2.load(Ordering::Relaxed) {
            let sent = if merged {
                tx.send_segmented(to, &bufs, &runs)?
            } else {
                tx.send_to(to, &bufs)?
            };
            if sent < bufs.len() {
                std::thread::yield_now();
            }
        }
        Ok(())
    });
    // Warm up, then count.
    let warm = Instant::now() + Duration::from_millis(50);
    while Instant::now() < warm {
        rx.recv_batch()?;
    }
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < duration {
        let got = rx.recv_batch()?;
        if got == 0 {
            poll_readable([rx.fd()], 10)?;
        }
        n += got as u64;
    }
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    sender.join().expect("sender thread")?;
    Ok(Rate::of(n, n * size as u64, elapsed))
}

/// One end-to-end run's figures.
#[derive(Debug, Clone, Copy)]
pub struct E2e {
    /// The consumer's frame rate.
    pub rate: Rate,
    /// ACKs (and NAKs) the server sent per frame.
    pub acks_per_frame: f64,
    /// Packets copied after a missed landing guess, per frame.
    pub copied_per_frame: f64,
    /// Packets the emulator sent again (timeouts, NAKs).
    pub retransmits: u64,
    /// Sequence and RNR NAKs the server sent, and what the kernel dropped at
    /// its socket.
    pub naks: u64,
    /// Packets the kernel dropped at the server's full socket.
    pub socket_drops: u64,
    /// The server thread's CPU time per frame (ns) and its share of the
    /// run's wall time (1.0 = one core).
    pub busy_ns_per_frame: f64,
    /// The server thread's CPU time over the run's wall time (1.0 = a core).
    pub cpu: f64,
    /// The emulator's (the calling thread's) CPU time per frame (ns).
    pub emulator_ns_per_frame: f64,
    /// Times the server's thread blocked (parked) per frame.
    pub parks_per_frame: f64,
    /// Times the server's thread napped per frame.
    pub naps_per_frame: f64,
    /// The server's ACK turnaround and frame delivery latency (all 0
    /// unless [`E2eSetup::measure_latency`]).
    pub ack_turnaround: crate::server::Latency,
    /// See `ack_turnaround`.
    pub delivery: crate::server::Latency,
}

/// How the end-to-end run is driven.
#[derive(Debug, Clone, Copy)]
pub struct E2eSetup {
    /// Frame size.
    pub size: usize,
    /// Frames.
    pub frames: u64,
    /// Path MTU.
    pub pmtu: crate::config::Mtu,
    /// Slots.
    pub depth: u32,
    /// How the server reads packets: `Off` from the UDP socket (GRO),
    /// `Require` by raw capture with every received ICRC verified.
    pub icrc: crate::config::IcrcCheck,
    /// Messages the emulator keeps un-ACKed (surf's engine: 4).
    pub window: usize,
    /// Frames per second (None: as fast as the window allows).
    pub rate: Option<f64>,
    /// The server's spin budget (µs; None: the default).
    pub spin_us: Option<u32>,
    /// The emulator (the calling thread) on CPU 0 and the server's thread
    /// on CPU 1 for the run, when there are two: left to the scheduler, on
    /// a 2-CPU host it now and then stacks both on one CPU (the other
    /// idle) and that run is 2-5 times slower.
    pub pin: bool,
    /// The emulator waits for ACKs as surf's engine does, busy-polling its
    /// socket with its window full, and sends one packet per datagram, as
    /// through a NIC; off, it sends bursts as UDP GSO datagrams (a NIC's
    /// GRO modelled) and sleeps in poll() for ACKs.
    pub busy_wait: bool,
    /// The server measures its ACK turnaround and delivery latency
    /// (`ServerConfig::measure_latency`).
    pub measure_latency: bool,
}

impl E2eSetup {
    /// `frames` frames of `size` bytes, pmtu 4096, 256 slots, UDP socket,
    /// a 256-message window (as deep as the host's slots: a sender that
    /// never waits for an ACK while the host has room, so the host is
    /// measured), unpaced.
    pub fn new(size: usize, frames: u64) -> E2eSetup {
        E2eSetup {
            size,
            frames,
            pmtu: crate::config::Mtu::Mtu4096,
            depth: 256,
            icrc: crate::config::IcrcCheck::Off,
            window: 256,
            rate: None,
            spin_us: None,
            pin: true,
            busy_wait: false,
            measure_latency: false,
        }
    }

    /// `frames` frames of `size` bytes as surf's engine sends them through a
    /// NIC: a `window` of 4 or 16 messages, one packet per datagram, the ACK
    /// busy-polled for; the rest as [`E2eSetup::new`].
    pub fn surf(size: usize, frames: u64, window: usize) -> E2eSetup {
        E2eSetup {
            window,
            busy_wait: true,
            ..E2eSetup::new(size, frames)
        }
    }
}

/// The server's receive thread's name.
const SERVER_THREAD: &str = crate::server::RECEIVE_THREAD_NAME;

/// Frames through the whole soft path in this process: the FPGA emulator ->
/// loopback UDP -> responder -> slab -> loan -> counting callback -> release
/// -> re-post, with ICRC on every packet sent and every ACK.
pub fn soft_end_to_end(s: E2eSetup) -> Result<E2e> {
    let pinned = pin_to(0, s.pin);
    let mut link = Link::new(&s, pinned.is_some().then_some(1), 0, None)?;
    let cpu0 = thread_cpu_ns(SERVER_THREAD);
    let t0 = Instant::now();
    let emu_cpu = link.stream(&s)?;
    let elapsed = t0.elapsed();
    let cpu = thread_cpu_ns(SERVER_THREAD).saturating_sub(cpu0);
    Ok(link.figures(s.size, elapsed, cpu, emu_cpu))
}

/// The calling thread pinned to `cpu` while the guard lives, when `want`
/// and the host has two CPUs; None (logged) when it cannot be.
fn pin_to(cpu: u32, want: bool) -> Option<crate::sys::PinnedThread> {
    if !want || std::thread::available_parallelism().map_or(true, |n| n.get() < 2) {
        return None;
    }
    crate::sys::PinnedThread::pin(cpu)
        .map_err(|e| log::info!("bench: threads left unpinned: {e}"))
        .ok()
}

/// A soft server on loopback connected to an FPGA emulator of its own,
/// its consumer counting frames.
struct Link {
    server: crate::Server,
    emu: crate::emulator::FpgaEmulator,
    count: Arc<AtomicU64>,
}

impl Link {
    /// The server (its receive thread on `cpu`, on 127.0.0.1:`port`, 0 = a
    /// free port) and the emulator for `s` (from `fpga`; None: the
    /// server's address).
    fn new(
        s: &E2eSetup,
        cpu: Option<u32>,
        port: u16,
        fpga: Option<std::net::Ipv4Addr>,
    ) -> Result<Link> {
        use crate::config::{ConnectParams, ServerConfig, SoftConfig};
        use crate::emulator::{EmulatorConfig, FpgaEmulator};
        let soft = SoftConfig {
            icrc_check: s.icrc,
            udp_port: port,
            ..SoftConfig::ephemeral("127.0.0.1")
        };
        let server = crate::Server::create(
            &crate::Device::open(&soft.into())?,
            &ServerConfig {
                max_payload: s.size as u32,
                rx_queue_depth: s.depth,
                spin_us: s.spin_us.unwrap_or(ServerConfig::default().spin_us),
                cpu_affinity: cpu,
                measure_latency: s.measure_latency,
                ..Default::default()
            },
        )?;
        let hp = server.host_params();
        let mut ecfg = EmulatorConfig::for_server(&hp)?;
        if let Some(ip) = fpga {
            ecfg.bind = std::net::SocketAddrV4::new(ip, 0);
        }
        ecfg.pmtu = s.pmtu;
        ecfg.window = s.window;
        ecfg.rate = s.rate;
        // Busy-waiting: one packet per datagram, as through a NIC. Else
        // bursts as UDP GSO datagrams, merged for the server by GRO: what a
        // NIC hands a host from a fast link.
        ecfg.busy_wait = s.busy_wait;
        ecfg.gso = !s.busy_wait;
        let emu = FpgaEmulator::new(ecfg)?;
        server.set_fpga_gid(emu.gid())?;
        let count = Arc::new(AtomicU64::new(0));
        let c2 = count.clone();
        server.set_frame_callback(move |f| {
            c2.fetch_add(1, Ordering::Relaxed);
            drop(f);
        })?;
        let pmtu = s.pmtu.code();
        server.complete_connection(&ConnectParams::new(emu.qpn(), hp.sq_psn, pmtu, 1)?)?;
        Ok(Link { server, emu, count })
    }

    /// Streams `s.frames` frames and waits until the consumer has them all;
    /// returns the calling thread's (the emulator's) CPU time, ns.
    fn stream(&mut self, s: &E2eSetup) -> Result<u64> {
        let template = crate::emulator::pattern::make(0, s.size);
        let emu0 = own_cpu_ns();
        let t0 = Instant::now();
        let plan = StreamPlan {
            frames: s.frames,
            channels: &[0],
            queue: s.depth as usize * 2,
            timeout: Duration::from_secs(600),
        };
        if s.busy_wait {
            // surf's engine computes its ICRC in hardware, at no cost: the
            // sender seals from the frame's known share, so these rows
            // measure the host, not the rig.
            self.emu.stream_template(&plan, &template, |_| {})?;
        } else {
            // The GSO rows keep the sender their goals were set with: each
            // ICRC read from the bytes.
            let fill = crate::emulator::copies_of(&template);
            self.emu.stream_into(&plan, fill, |_| {})?;
        }
        while self.count.load(Ordering::Relaxed) < s.frames
            && t0.elapsed() < Duration::from_secs(600)
        {
            std::thread::yield_now();
        }
        Ok(own_cpu_ns().saturating_sub(emu0))
    }

    /// The figures of a run of `elapsed` of `size`-byte frames in which the
    /// server's thread used `cpu` ns and the emulator `emu_cpu`; stops the
    /// server.
    fn figures(self, size: usize, elapsed: Duration, cpu: u64, emu_cpu: u64) -> E2e {
        let n = self.count.load(Ordering::Relaxed);
        let st = self.server.stats();
        let soft = st.soft();
        let es = self.emu.stats();
        self.server.stop();
        let per = |x: u64| x as f64 / n.max(1) as f64;
        E2e {
            rate: Rate::of(n, n * size as u64, elapsed),
            acks_per_frame: per(soft.packets_tx),
            copied_per_frame: per(soft.payload_copied),
            retransmits: es.requester.retransmits,
            naks: soft.seq_naks_tx + soft.rnr_naks_tx,
            socket_drops: soft.socket_drops,
            busy_ns_per_frame: per(cpu),
            cpu: cpu as f64 / elapsed.as_nanos().max(1) as f64,
            emulator_ns_per_frame: per(emu_cpu),
            parks_per_frame: per(st.parks),
            naps_per_frame: per(st.naps),
            ack_turnaround: st.ack_turnaround,
            delivery: st.delivery_latency,
        }
    }
}

/// Several links' run.
#[derive(Debug, Clone)]
pub struct Links {
    /// All links' frames over the time until the last of them arrived.
    pub rate: Rate,
    /// Each link's figures over its own time; the servers' threads' CPU
    /// time (read for all of them together) split evenly among the links.
    pub each: Vec<E2e>,
}

/// `links` soft servers in this process, each fed by its own emulator (on a
/// thread of its own) as `s` says, all at once: the emulators' threads on
/// CPU 0, the servers' on CPU 1 (with `s.pin`, when there are two). Each
/// server on a port of its own, each emulator from 127.0.0.1.
pub fn soft_links(s: E2eSetup, links: usize) -> Result<Links> {
    let all = (0..links.max(1))
        .map(|_| Link::new(&s, pinned_cpu(s.pin), 0, None))
        .collect::<Result<Vec<_>>>()?;
    run_links(s, all)
}

/// How `links` servers listen: all on one address and port, or each on a
/// port of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// One port for all (`SO_REUSEPORT`, each socket connected to its FPGA).
    Shared,
    /// A free port each.
    Separate,
}

/// [`soft_links`] with emulators from 127.0.0.2, 127.0.0.3, ... (one
/// address per FPGA, as a shared port needs) and the servers' `ports`.
pub fn soft_links_on(s: E2eSetup, links: usize, ports: Ports) -> Result<Links> {
    let mut all: Vec<Link> = Vec::new();
    for i in 0..links.max(1) as u32 {
        let port = match (ports, all.first()) {
            (Ports::Shared, Some(l)) => l.server.host_params().udp_port,
            _ => 0,
        };
        let ip = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(127, 0, 0, 2)) + i);
        all.push(Link::new(&s, pinned_cpu(s.pin), port, Some(ip))?);
    }
    run_links(s, all)
}

/// CPU 1 for the servers' threads with `pin`, when there are two.
fn pinned_cpu(pin: bool) -> Option<u32> {
    let two = std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2);
    (pin && two).then_some(1)
}

/// Streams every link at once, each emulator on a thread of its own.
fn run_links(s: E2eSetup, mut all: Vec<Link>) -> Result<Links> {
    let pin = pinned_cpu(s.pin).is_some();
    let cpu0 = thread_cpu_ns(SERVER_THREAD);
    let t0 = Instant::now();
    let runs = std::thread::scope(|scope| {
        let threads: Vec<_> = all
            .iter_mut()
            .map(|link| {
                scope.spawn(move || {
                    let _pinned = pin_to(0, pin);
                    let cpu = link.stream(&s)?;
                    Ok((t0.elapsed(), cpu))
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("emulator thread"))
            .collect::<Result<Vec<(Duration, u64)>>>()
    })?;
    let elapsed = t0.elapsed();
    let cpu = thread_cpu_ns(SERVER_THREAD).saturating_sub(cpu0) / all.len() as u64;
    let n: u64 = all.iter().map(|l| l.count.load(Ordering::Relaxed)).sum();
    let each: Vec<E2e> = all
        .into_iter()
        .zip(runs)
        .map(|(link, (took, emu_cpu))| link.figures(s.size, took, cpu, emu_cpu))
        .collect();
    Ok(Links {
        rate: Rate::of(n, n * s.size as u64, elapsed),
        each,
    })
}

/// CPU time (ns) so far of the calling thread.
fn own_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// CPU time (ns) so far of this process's thread named `name` (the
/// server's receive thread is "RoCEv2Server"), from its schedstat; 0 when
/// there is none.
pub fn thread_cpu_ns(name: &str) -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.filter_map(|t| t.ok())
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name)
        })
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// GB/s of the ICRC (pseudo-header + payload) over `len`-byte SEND packets
/// and of crc32fast's raw CRC-32 over the same bytes, `iters` times each.
/// The ICRC side is what the send paths run on each packet they build
/// ([`IcrcCache::seal`](crate::wire::icrc::IcrcCache::seal), called by
/// `emit_sealed`): the kept pseudo-header state, one CRC update over the
/// packet, the ICRC stored. The two alternate in 50 rounds over the same
/// buffer and each keeps its fastest round, so a noisy neighbour slows both
/// alike instead of one of them.
pub fn icrc_vs_raw_crc(len: usize, iters: u32) -> (f64, f64) {
    use crate::wire::{icrc::IcrcCache, icrc::Ipv4Udp, Bth, Opcode};
    let payload = crate::emulator::pattern::make(1, len);
    let ctx = Ipv4Udp {
        src: Ipv4Addr::LOCALHOST,
        dst: Ipv4Addr::LOCALHOST,
        ip_id: 0,
        dont_fragment: true,
        src_port: 1,
        dst_port: 4791,
    };
    let mut cache = IcrcCache::default();
    let mut pkt = Vec::new();
    let bth = Bth::new(Opcode::SendOnlyImm, 1, 1);
    cache.emit_sealed(&ctx, &bth, Some(5), None, &payload, &mut pkt);
    let n = pkt.len();
    const ROUNDS: u32 = 50;
    let per_round = (iters / ROUNDS).max(1);
    let mut acc = 0u32;
    let (mut best_icrc, mut best_raw) = (Duration::MAX, Duration::MAX);
    for _ in 0..ROUNDS {
        let t0 = Instant::now();
        for _ in 0..per_round {
            let p = std::hint::black_box(&mut pkt[..]);
            cache.seal(&ctx, p);
            acc ^= u32::from_le_bytes([p[n - 4], p[n - 3], p[n - 2], p[n - 1]]);
        }
        best_icrc = best_icrc.min(t0.elapsed());
        let t0 = Instant::now();
        for _ in 0..per_round {
            acc ^= crc32fast::hash(std::hint::black_box(&pkt[..]));
        }
        best_raw = best_raw.min(t0.elapsed());
    }
    std::hint::black_box(acc);
    let gbs = |t: Duration| n as f64 * per_round as f64 / t.as_secs_f64().max(1e-12) / 1e9;
    (gbs(best_icrc), gbs(best_raw))
}

#[cfg(test)]
mod tests {
    #[test]
    fn ceilings_move_datagrams() {
        let r = super::udp_ceiling(1024, std::time::Duration::from_millis(100)).unwrap();
        assert!(r.per_sec > 0.0 && r.gbit > 0.0);
        let g = super::gso_gro_ceiling(1024, std::time::Duration::from_millis(100)).unwrap();
        assert!(g.per_sec > 0.0 && g.gbit > 0.0);
    }

    #[test]
    fn an_end_to_end_run_delivers_and_measures_the_server_thread() {
        let e = super::soft_end_to_end(super::E2eSetup::new(1024, 2000)).unwrap();
        assert!(e.rate.per_sec > 0.0);
        assert!(
            e.busy_ns_per_frame > 0.0,
            "the receive thread's CPU time is read"
        );
        assert!(e.acks_per_frame > 0.0 && e.acks_per_frame <= 1.0, "{e:?}");
    }

    #[test]
    fn a_surf_run_acks_at_least_once_per_window() {
        let e = super::soft_end_to_end(super::E2eSetup::surf(1024, 2000, 4)).unwrap();
        assert!(e.rate.per_sec > 0.0);
        // An ACK frees at most the window's 4 messages, and the server ACKs
        // a receive batch once: at most one ACK per frame.
        assert!((0.25..=1.0).contains(&e.acks_per_frame), "{e:?}");
    }

    #[test]
    fn links_at_surfs_window_each_deliver_all_their_frames() {
        let l = super::soft_links(super::E2eSetup::surf(1024, 2000, 4), 2).unwrap();
        assert_eq!(l.each.len(), 2);
        assert!(l.rate.per_sec > 0.0);
        for e in &l.each {
            assert!(e.rate.per_sec > 0.0);
            // An ACK frees at most the window's 4 messages.
            assert!(e.acks_per_frame >= 0.25, "{e:?}");
        }
    }
}
