//! Benchmark harnesses for `rocev2 bench` (not a stable API: the CLI is its
//! only user). Each figure is measured against a reference in the same run.
//!
//! The reference the soft backend is measured against: the raw UDP ceiling of
//! this machine — a plain sender/receiver pair moving the same datagram sizes
//! over loopback with the same batching syscalls (sendmmsg/recvmmsg) and no
//! protocol work.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Result;
use crate::net::UdpIo;

/// Server-core cost per frame (completion -> loan -> callback -> release
/// -> batched re-post) with an in-memory completion source, in ns.
pub fn dispatch_ns_per_frame(frames: u64, rx_queue_depth: u32) -> Result<f64> {
    crate::server::bench::dispatch_ns_per_frame(frames, rx_queue_depth)
}
use crate::sys::poll_readable;

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
    let mut rx = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 64)?;
    let to = rx.local_addr()?;
    let mut tx = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let sender = std::thread::spawn(move || -> Result<()> {
        let buf = vec![0xa5u8; size];
        let pkts: Vec<(SocketAddrV4, &[u8])> = (0..16).map(|_| (to, &buf[..])).collect();
        while !stop2.load(Ordering::Relaxed) {
            if tx.send_batch(&pkts)? < pkts.len() {
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
            poll_readable(&[rx.fd()], 10)?;
        }
        n += got as u64;
    }
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Relaxed);
    sender.join().expect("sender thread")?;
    Ok(Rate::of(n, n * size as u64, elapsed))
}

/// Frames through the whole soft path in this process: the FPGA emulator ->
/// loopback UDP -> responder -> slab -> loan -> counting callback -> release
/// -> re-post, with ICRC on every packet sent and every ACK. Frames of
/// `size` bytes, `frames` of them; returns the consumer's frame rate.
/// `icrc` picks how the server reads packets: `Off` from the UDP socket,
/// `Require` by raw capture with every received ICRC verified.
pub fn soft_end_to_end(
    size: usize,
    frames: u64,
    pmtu: crate::config::Mtu,
    depth: u32,
    icrc: crate::config::IcrcCheck,
) -> Result<Rate> {
    use crate::config::{ConnectParams, ServerConfig, SoftConfig};
    use crate::emulator::{EmulatorConfig, FpgaEmulator};
    use crate::{Device, Server};
    use std::sync::atomic::AtomicU64;
    let server = Server::create(
        &Device::open(
            &SoftConfig {
                icrc_check: icrc,
                ..SoftConfig::ephemeral("127.0.0.1")
            }
            .into(),
        )?,
        &ServerConfig {
            max_payload: size as u32,
            rx_queue_depth: depth,
            ..Default::default()
        },
    )?;
    let hp = server.host_params();
    let mut ecfg = EmulatorConfig::for_server(&hp)?;
    ecfg.pmtu = pmtu;
    // A deeper engine than surf's 4 messages: the bench measures the host.
    ecfg.window = 16;
    let mut emu = FpgaEmulator::new(ecfg)?;
    server.set_fpga_gid(emu.gid())?;
    let count = Arc::new(AtomicU64::new(0));
    let c2 = count.clone();
    server.set_frame_callback(move |f| {
        c2.fetch_add(1, Ordering::Relaxed);
        drop(f);
    })?;
    server.complete_connection(&ConnectParams::new(emu.qpn(), hp.sq_psn, pmtu.code(), 1)?)?;
    let template = crate::emulator::pattern::make(0, size);
    let t0 = Instant::now();
    emu.stream_with(
        frames,
        |_| template.clone(),
        &[0],
        depth as usize * 2,
        Duration::from_secs(600),
        |_| {},
    )?;
    while count.load(Ordering::Relaxed) < frames && t0.elapsed() < Duration::from_secs(600) {
        std::thread::yield_now();
    }
    let elapsed = t0.elapsed();
    let n = count.load(Ordering::Relaxed);
    Ok(Rate::of(n, n * size as u64, elapsed))
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
    fn ceiling_moves_datagrams() {
        let r = super::udp_ceiling(1024, std::time::Duration::from_millis(100)).unwrap();
        assert!(r.per_sec > 0.0 && r.gbit > 0.0);
    }
}
