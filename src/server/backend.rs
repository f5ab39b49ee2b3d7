//! The contract between the core and a transport (verbs or soft): the
//! [`Backend`] trait and what it reports.

use std::os::fd::RawFd;

use std::sync::Arc;

use super::latency::Histogram;
use super::{BackendCounters, RxTimeSource};
use crate::config::ConnectParams;
use crate::error::Result;
use crate::gid::Gid;

/// Completions taken from the backend per poll.
pub(crate) const POLL_BATCH: usize = 32;

/// One receive completion reported by a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The slot the payload landed in.
    pub slot: u32,
    /// What happened.
    pub kind: CompletionKind,
    /// The kernel's receive stamp of the message's last packet,
    /// CLOCK_REALTIME ns (0: not measured).
    pub rx_ns: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompletionKind {
    /// A SEND of `len` bytes (0 allowed); its immediate in host order, when
    /// the message carried one.
    Recv { len: u32, imm: Option<u32> },
    /// A receive that completed as another opcode (e.g. an RDMA WRITE with
    /// immediate, which this server never grants).
    #[cfg_attr(not(any(feature = "verbs", test)), allow(dead_code))]
    Unexpected { opcode: u32, flags: u32 },
    /// The QP is in the error state; posted receives are flushed.
    #[cfg_attr(not(any(feature = "verbs", test)), allow(dead_code))]
    Flushed,
    /// Any other error status (`what` names it).
    #[cfg_attr(not(any(feature = "verbs", test)), allow(dead_code))]
    Error { what: &'static str, code: u32 },
}

/// What a backend reports about itself once created.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BackendInfo {
    pub qpn: u32,
    pub gid: Gid,
    pub rkey: u32,
    pub udp_port: u16,
}

/// A transport: the verbs QP or the soft responder. Used by one thread at a
/// time (the creator, then the receive thread), so it needs `Send` only.
pub(crate) trait Backend: Send {
    /// QPN, GID and rkey (fixed at creation).
    fn info(&self) -> BackendInfo;
    /// Posts (or re-posts) receive slots.
    fn post_recv(&mut self, slots: &[u32]) -> Result<()>;
    /// The FPGA's GID is known (`set_fpga_gid`, before `connect`): a
    /// backend that must tell the kernel whose packets it takes (soft: its
    /// socket shares the port) starts receiving them here, so what the FPGA
    /// sends before `connect` waits for it. Default: nothing to do.
    fn expect_peer(&mut self, _fpga_gid: Gid) -> Result<()> {
        Ok(())
    }
    /// Completes the connection (INIT -> RTR -> RTS). Every slot is posted first.
    fn connect(&mut self, params: &ConnectParams, fpga_gid: Gid, sq_psn: u32) -> Result<()>;
    /// Appends ready completions to `out` without blocking (at most POLL_BATCH).
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()>;
    /// Arms the completion notification before blocking; true when the core
    /// must poll once more before it blocks (verbs: a completion that came
    /// before the CQ was armed raises no event), false when `block` sees
    /// what is ready by itself (a socket's poll).
    fn arm(&mut self) -> Result<bool>;
    /// Blocks until a completion may be ready or `wake_fd` is readable;
    /// true when `wake_fd` may be readable (the core then clears it).
    fn block(&mut self, wake_fd: RawFd) -> Result<bool>;
    /// True when the last `poll` left nothing behind (a socket read short
    /// of its batch was emptied): the core then spins or blocks without
    /// another poll first (`block` sees anything that came since).
    fn drained(&self) -> bool {
        false
    }
    /// Bytes the transport queues for the thread besides the posted
    /// receives (soft: the receiving socket's buffer), which bound how long
    /// it may nap; None: only the posted receives do (verbs: the NIC places
    /// each message into one).
    fn queue_bytes(&self) -> Option<u64> {
        None
    }
    /// Where its own counters can be read from any thread (none by default).
    fn counters(&self) -> BackendCounters {
        BackendCounters::None
    }
    /// Measures the ACK turnaround into `turnaround` and stamps completions
    /// (`Completion::rx_ns`) from now on; an error when the transport
    /// cannot (the verbs backend: the NIC ACKs, and stamps nothing the
    /// host clock can compare with).
    fn measure_latency(&mut self, turnaround: Arc<Histogram>) -> Result<()> {
        let _ = turnaround;
        Err(crate::error::Error::new(
            crate::error::ErrorKind::Unsupported,
            "measure_latency: this backend cannot measure latency (the verbs backend's NIC ACKs \
             in hardware and stamps no receive with the host clock); use the soft backend or \
             leave measure_latency off",
        ))
    }
    /// Asks the transport to stamp every completion with the kernel's
    /// receive time of its last packet (`Completion::rx_ns`); true when it
    /// will, false when it cannot (the core then stamps the host clock at
    /// poll: the verbs backend, whose NIC delivers without the kernel).
    fn stamp_receives(&mut self) -> Result<bool> {
        Ok(false)
    }
    /// Whose stamps `Completion::rx_ns` carries when `stamp_receives` said
    /// true: the kernel's receive stamps (soft) by default.
    fn stamp_source(&self) -> RxTimeSource {
        RxTimeSource::Kernel
    }
    /// Packets seen so far, for the link's "time since the last packet"
    /// (a backend that sees only completions keeps 0: the core stamps those).
    fn packets_seen(&self) -> u64 {
        0
    }
}
