//! The reference for surf's window: plain UDP moving datagrams of a
//! packet's size with a window's worth of them in flight and a receiver
//! that answers, so the round trip sets the rate as the host's ACK
//! turnaround sets an FPGA's; no protocol work on either side.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{pin_to, Rate};
use crate::emulator::relax;
use crate::error::Result;
use crate::net::UdpIo;

/// Datagrams read per recvmmsg.
const BATCH: usize = 64;
/// Counted after this long.
const WARM_UP: Duration = Duration::from_millis(50);
/// No count for this long: what is in flight was lost (a full socket
/// buffer), sent anew.
const STALL: Duration = Duration::from_millis(20);

/// A sender thread keeps `window` datagrams of `size` bytes in flight to a
/// receiver thread over loopback; the receiver answers each recvmmsg batch
/// with one 8-byte datagram carrying the count received so far, and the
/// sender slides its window on that count. Both busy-poll non-blocking
/// sockets (sendmmsg/recvmmsg), the sender (the calling thread) on CPU 0 and
/// the receiver on CPU 1 with `pin`, when there are two. Returns the rate
/// the receiver confirmed over `duration`, in datagrams.
pub fn udp_window(size: usize, window: usize, duration: Duration, pin: bool) -> Result<Rate> {
    let any = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
    let rx = UdpIo::bind(any, BATCH)?;
    let mut tx = UdpIo::bind(any, BATCH)?;
    let (to, back) = (rx.local_addr()?, tx.local_addr()?);
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let receiver = std::thread::spawn(move || answer_batches(rx, back, &stop2, pin));
    let rate = {
        let _pinned = pin_to(0, pin);
        send_windowed(&mut tx, to, size, window.max(1), duration)
    };
    stop.store(true, Ordering::Relaxed);
    receiver.join().expect("receiver thread")?;
    rate
}

/// The receiver: answers each batch with the count received so far (8
/// bytes, little-endian) to `to`, busy-polling until `stop`.
fn answer_batches(mut rx: UdpIo, to: SocketAddrV4, stop: &AtomicBool, pin: bool) -> Result<()> {
    let _pinned = pin_to(1, pin);
    let (mut total, mut polls) = (0u64, 0u32);
    let mut answer = [vec![0u8; 8]];
    while !stop.load(Ordering::Relaxed) {
        let n = rx.recv_batch()?;
        if n == 0 {
            relax(&mut polls);
            continue;
        }
        total += n as u64;
        answer[0].copy_from_slice(&total.to_le_bytes());
        rx.send_to(to, &answer)?;
    }
    Ok(())
}

/// The sender: fills the window (one sendmmsg), takes in the latest count,
/// slides; the rate the counts confirm over `duration` after a warm-up.
fn send_windowed(
    tx: &mut UdpIo,
    to: SocketAddrV4,
    size: usize,
    window: usize,
    duration: Duration,
) -> Result<Rate> {
    let bufs = vec![vec![0xa5u8; size]; window];
    let (mut sent, mut counted, mut polls) = (0u64, 0u64, 0u32);
    let start = Instant::now();
    let mut progress = start;
    let mut from: Option<(Instant, u64)> = None;
    loop {
        let free = window.saturating_sub((sent - counted) as usize);
        if free > 0 {
            sent += tx.send_to(to, &bufs[..free])? as u64;
        }
        match latest_count(tx)? {
            Some(c) if c > counted => {
                counted = c;
                sent = sent.max(c);
                progress = Instant::now();
            }
            _ if progress.elapsed() > STALL => {
                sent = counted;
                progress = Instant::now();
            }
            _ => relax(&mut polls),
        }
        let now = Instant::now();
        match from {
            None if now - start >= WARM_UP => from = Some((now, counted)),
            Some((t0, c0)) if now - t0 >= duration => {
                let n = counted - c0;
                return Ok(Rate::of(n, n * size as u64, now - t0));
            }
            _ => {}
        }
    }
}

/// The highest count among the answers waiting on `io`, if any.
fn latest_count(io: &mut UdpIo) -> Result<Option<u64>> {
    let mut latest = None;
    loop {
        let n = io.recv_batch()?;
        for i in 0..n {
            if let Ok(b) = <[u8; 8]>::try_from(io.datagram(i).bytes()) {
                latest = latest.max(Some(u64::from_le_bytes(b)));
            }
        }
        if n < BATCH {
            return Ok(latest);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_window_reference_moves_datagrams_and_counts_them() {
        for window in [1, 4, 16] {
            let r = super::udp_window(4116, window, std::time::Duration::from_millis(100), false)
                .unwrap();
            assert!(r.per_sec > 0.0 && r.gbit > 0.0, "window {window}: {r:?}");
        }
    }
}
