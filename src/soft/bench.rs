//! The reference the soft backend is measured against: the raw UDP ceiling of
//! this machine — a plain sender/receiver pair moving the same datagram sizes
//! over loopback with the same batching syscalls (sendmmsg/recvmmsg) and no
//! protocol work.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::net::UdpIo;
use crate::error::Result;
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
    let tx = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1)?;
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

#[cfg(test)]
mod tests {
    #[test]
    fn ceiling_moves_datagrams() {
        let r = super::udp_ceiling(1024, std::time::Duration::from_millis(100)).unwrap();
        assert!(r.per_sec > 0.0 && r.gbit > 0.0);
    }
}
