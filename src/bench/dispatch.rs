//! Dispatch-cost harness: the production server core (loan -> callback ->
//! release -> batched re-post) with the backend's completion source replaced
//! by an in-memory ring that completes every posted slot at once. What it
//! measures is the core's own cost per frame. (It reaches the server's
//! crate-private parts, `ServerCore` and the `Backend` trait, from here:
//! the benchmarks live in one place, `bench/`.)

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{ConnectParams, ServerConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::server::{Backend, BackendInfo, Completion, CompletionKind, ServerCore, POLL_BATCH};

struct RingSource {
    posted: VecDeque<u32>,
    len: u32,
    imm: u32,
}

impl Backend for RingSource {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            qpn: 2,
            gid: Gid::default(),
            rkey: 0,
            udp_port: 0,
        }
    }
    fn post_recv(&mut self, slots: &[u32]) -> Result<()> {
        self.posted.extend(slots);
        Ok(())
    }
    fn connect(&mut self, _: &ConnectParams, _: Gid, _: u32) -> Result<()> {
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        while out.len() < POLL_BATCH {
            let Some(slot) = self.posted.pop_front() else {
                break;
            };
            self.imm = self.imm.wrapping_add(1 << 8);
            out.push(Completion {
                rx_ns: 0,
                slot,
                kind: CompletionKind::Recv {
                    len: self.len,
                    imm: Some(self.imm),
                },
            });
        }
        Ok(())
    }
    fn arm(&mut self) -> Result<bool> {
        Ok(true)
    }
    fn block(&mut self, wake_fd: RawFd) -> Result<bool> {
        Ok(crate::sys::poll_readable([wake_fd], 10)?[0])
    }
}

/// Server-core cost per frame (completion -> loan -> callback -> release
/// -> batched re-post) with an in-memory completion source, in ns: for
/// `frames` frames through the core with `rx_queue_depth` slots, the
/// consumer releasing each frame in the callback.
pub fn dispatch_ns_per_frame(frames: u64, rx_queue_depth: u32) -> Result<f64> {
    let cfg = ServerConfig {
        max_payload: 4096,
        rx_queue_depth,
        ..Default::default()
    };
    let core = ServerCore::create("bench", &cfg, |_| {
        Ok(Box::new(RingSource {
            posted: VecDeque::new(),
            len: 4096,
            imm: 0,
        }) as _)
    })?;
    core.set_fpga_gid(Gid::from_ipv4(std::net::Ipv4Addr::LOCALHOST))?;
    let count = Arc::new(AtomicU64::new(0));
    let c2 = count.clone();
    let mut n = 0u64;
    // The consumer counts with a plain store (only its thread writes the
    // count): the harness adds no locked operation of its own to the cost
    // it measures.
    core.set_frame_callback(move |f| {
        n += 1;
        c2.store(n, Ordering::Relaxed);
        drop(f);
    })?;
    let t0 = Instant::now();
    core.complete_connection(&ConnectParams::new(1, 0, 5, 1)?)?;
    while count.load(Ordering::Relaxed) < frames {
        if t0.elapsed() > Duration::from_secs(120) {
            core.stop();
            return Err(Error::new(
                ErrorKind::Timeout,
                "dispatch benchmark did not finish in 120 s",
            ));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let n = count.load(Ordering::Relaxed);
    let ns = t0.elapsed().as_nanos() as f64 / n as f64;
    core.stop();
    Ok(ns)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dispatch_harness_moves_frames() {
        let ns = super::dispatch_ns_per_frame(10_000, 64).unwrap();
        assert!(ns > 0.0);
    }
}
