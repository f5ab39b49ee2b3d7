//! The backend-agnostic server core: lifecycle, the slab and its loans, the
//! receive thread, dispatch to a callback or the pull queue, and counters.
//!
//! A backend (verbs or soft) owns the transport: it registers the slab, posts
//! receives, and reports completions. The receive thread owns the backend once
//! the connection is complete, so backend objects are touched by one thread
//! only; consumers talk to the thread through the lock-free release ring and
//! an eventfd.

pub(crate) mod bench;
mod ring;
mod slab;
mod stats;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crate::config::{ConnectParams, HostParams, ServerConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::sys::{random_u32, EventFd};
use crate::wire::MASK_24;

pub(crate) use ring::SlotRing;
pub(crate) use slab::Slab;
pub(crate) use stats::{BackendCounters, Counters, SoftCounters};
pub use stats::{BackendStats, SoftStats, Stats};

/// Completions taken from the backend per poll.
pub(crate) const POLL_BATCH: usize = 32;

/// One receive completion reported by a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Completion {
    /// The slot the payload landed in.
    pub slot: u32,
    /// What happened.
    pub kind: CompletionKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CompletionKind {
    /// A SEND with immediate of `len` bytes; `imm` in host order.
    Recv { len: u32, imm: u32 },
    /// A receive that completed without an immediate or as another opcode.
    Unexpected { opcode: u32, flags: u32 },
    /// The QP is in the error state; posted receives are flushed.
    #[cfg_attr(not(any(feature = "verbs", test)), allow(dead_code))]
    Flushed,
    /// Any other error status (`what` names it).
    #[cfg_attr(not(any(feature = "verbs", test)), allow(dead_code))]
    Error { what: &'static str },
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
    /// Completes the connection (INIT -> RTR -> RTS). Every slot is posted first.
    fn connect(&mut self, params: &ConnectParams, fpga_gid: Gid, sq_psn: u32) -> Result<()>;
    /// Appends ready completions to `out` without blocking (at most POLL_BATCH).
    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()>;
    /// Arms the completion notification before blocking (the core polls once
    /// more after arming, so no completion is missed).
    fn arm(&mut self) -> Result<()>;
    /// Blocks until a completion may be ready or `wake_fd` is readable.
    fn block(&mut self, wake_fd: RawFd) -> Result<()>;
    /// Where its own counters can be read from any thread (none by default).
    fn counters(&self) -> BackendCounters {
        BackendCounters::None
    }
}

type FrameCallback = Box<dyn FnMut(Frame) + Send + 'static>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Created; connection not complete.
    Created,
    /// Receive thread running.
    Running,
    /// complete_connection failed; the QP state is unknown.
    Failed,
    /// Stopped (by stop(), or the receive thread ended on an error).
    Stopped,
}

struct Control {
    phase: Phase,
    backend: Option<Box<dyn Backend>>,
    callback: Option<FrameCallback>,
    has_callback: bool,
    fpga_gid: Option<Gid>,
    thread: Option<JoinHandle<()>>,
    thread_id: Option<ThreadId>,
}

#[derive(Clone, Copy)]
struct PendingFrame {
    slot: u32,
    gen: u32,
    len: u32,
    imm: u32,
}

/// The state shared by the server handle, its receive thread and its loans.
/// Memory of loaned slots lives here, so it stays valid until the handle is
/// gone *and* the last loan is released.
pub struct ServerCore {
    cfg: ServerConfig,
    device_name: String,
    slab: Arc<Slab>,
    host: HostParams,
    counters: Counters,
    backend_counters: BackendCounters,
    releases: SlotRing,
    wake: EventFd,
    parked: AtomicBool,
    stopping: AtomicBool,
    control: Mutex<Control>,
    pull: Mutex<VecDeque<PendingFrame>>,
    pull_cv: Condvar,
    exited: Mutex<Option<String>>,
    exited_cv: Condvar,
}

/// A received frame on loan: `data()` points into the slab (zero copy). The
/// slot is re-posted when the frame is dropped (or its token released).
pub struct Frame {
    core: Arc<ServerCore>,
    slot: u32,
    gen: u32,
    len: u32,
    imm: u32,
    armed: bool,
}

impl Frame {
    /// The payload, in place in the receive slab.
    pub fn data(&self) -> &[u8] {
        self.core
            .slab
            .loaned(self.slot, self.gen, self.len)
            .unwrap_or(&[])
    }
    /// Payload length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }
    /// True for an empty payload (never delivered: such frames are dropped).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The channel: immediate bits [7:0].
    pub fn channel(&self) -> u8 {
        (self.imm & 0xff) as u8
    }
    /// The raw immediate value (host order).
    pub fn immediate(&self) -> u32 {
        self.imm
    }
    /// The FPGA's ring position: immediate bits [31:8].
    pub fn ring_position(&self) -> u32 {
        self.imm >> 8
    }
    /// The receive slot index (its address is `mr_addr + slot * max_payload`).
    pub fn slot(&self) -> u32 {
        self.slot
    }
    /// Releases the loan now (the same as dropping the frame).
    pub fn release(self) {}

    /// Turns the loan into a release token for [`ServerCore::release_token`].
    /// One strong reference to the core is handed to the token (returned as a
    /// raw pointer): whoever releases the token must give it back with
    /// `Arc::decrement_strong_count`. Tokens are never 0.
    pub(crate) fn into_token(mut self) -> (u64, *const ServerCore) {
        self.armed = false;
        let token = ((self.gen as u64) << 32) | self.slot as u64;
        (token, Arc::into_raw(Arc::clone(&self.core)))
    }
}

impl Drop for Frame {
    fn drop(&mut self) {
        if self.armed {
            // Cannot fail: this frame holds the live loan.
            let _ = self.core.release_loan(self.slot, self.gen);
        }
    }
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame")
            .field("slot", &self.slot)
            .field("len", &self.len)
            .field("channel", &self.channel())
            .field("imm", &format_args!("{:#010x}", self.imm))
            .finish()
    }
}

impl ServerCore {
    /// Builds the core over a backend made by `make_backend` from the slab.
    pub(crate) fn create(
        device_name: &str,
        cfg: &ServerConfig,
        make_backend: impl FnOnce(&Arc<Slab>) -> Result<Box<dyn Backend>>,
    ) -> Result<Arc<ServerCore>> {
        cfg.validate()?;
        let slab = Arc::new(Slab::new(cfg.max_payload, cfg.rx_queue_depth)?);
        let backend = make_backend(&slab)?;
        let info = backend.info();
        let host = HostParams {
            qpn: info.qpn,
            rq_psn: random_u32() & MASK_24,
            sq_psn: random_u32() & MASK_24,
            mr_addr: slab.base_addr(),
            mr_len: slab.len() as u32,
            mr_rkey: info.rkey,
            gid: info.gid,
            udp_port: info.udp_port,
        };
        log::info!(
            "RC QP ready on '{device_name}': qpn={:#08x} rqPsn={:#08x} sqPsn={:#08x} \
             MR addr={:#018x} len={} ({} slots x {} bytes) gid={}",
            host.qpn,
            host.rq_psn,
            host.sq_psn,
            host.mr_addr,
            host.mr_len,
            cfg.rx_queue_depth,
            cfg.max_payload,
            host.gid
        );
        Ok(Arc::new(ServerCore {
            cfg: cfg.clone(),
            device_name: device_name.to_string(),
            releases: SlotRing::new(cfg.rx_queue_depth as usize),
            slab,
            host,
            counters: Counters::default(),
            backend_counters: backend.counters(),
            wake: EventFd::new()?,
            parked: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            control: Mutex::new(Control {
                phase: Phase::Created,
                backend: Some(backend),
                callback: None,
                has_callback: false,
                fpga_gid: None,
                thread: None,
                thread_id: None,
            }),
            pull: Mutex::new(VecDeque::new()),
            pull_cv: Condvar::new(),
            exited: Mutex::new(None),
            exited_cv: Condvar::new(),
        }))
    }

    fn control(&self) -> MutexGuard<'_, Control> {
        // A panic while holding the lock cannot leave Control inconsistent
        // (every update is a single assignment), so poisoning is ignored.
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configuration the server was created with.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }
    /// The device (or `soft`) the server runs on.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }
    /// Host parameters for programming the FPGA.
    pub fn host_params(&self) -> HostParams {
        self.host
    }
    /// Counter snapshot.
    pub fn stats(&self) -> Stats {
        Stats {
            loans_outstanding: self.slab.loans_outstanding() as u64,
            backend: self.backend_counters.snapshot(),
            ..self.counters.snapshot()
        }
    }
    /// True while the receive thread runs.
    pub fn is_running(&self) -> bool {
        self.control().phase == Phase::Running && self.exited_reason().is_none()
    }
    /// Why the receive thread ended, once it has.
    pub fn exited_reason(&self) -> Option<String> {
        self.exited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stores the FPGA's GID (the destination of the host QP's path).
    pub fn set_fpga_gid(&self, gid: Gid) -> Result<()> {
        let mut c = self.control();
        if c.phase != Phase::Created {
            return Err(Error::state(
                "setFpgaGid must be called before completeConnection",
            ));
        }
        c.fpga_gid = Some(gid);
        log::info!("FPGA GID stored: {gid}");
        Ok(())
    }

    /// Registers the frame callback (before `complete_connection`). It runs on
    /// the receive thread with each frame on loan; dropping the frame releases it.
    pub fn set_frame_callback(&self, cb: impl FnMut(Frame) + Send + 'static) -> Result<()> {
        let mut c = self.control();
        if c.phase != Phase::Created {
            return Err(Error::state(
                "the frame callback must be registered before completeConnection",
            ));
        }
        c.callback = Some(Box::new(cb));
        c.has_callback = true;
        Ok(())
    }

    /// Pre-posts every slot, takes the QP to RTS and starts the receive thread.
    /// Only once per server.
    pub fn complete_connection(self: &Arc<Self>, params: &ConnectParams) -> Result<()> {
        let mut c = self.control();
        match c.phase {
            Phase::Created => {}
            Phase::Running | Phase::Failed => {
                return Err(Error::state(
                    "completeConnection already invoked; destroy and recreate Server to \
                     re-establish the RC connection",
                ))
            }
            Phase::Stopped => {
                return Err(Error::new(
                    ErrorKind::Stopped,
                    "server is stopped; create a new server to connect again",
                ))
            }
        }
        let fpga_gid = match c.fpga_gid {
            Some(g) => g,
            None => {
                log::warn!("completeConnection without setFpgaGid: the FPGA GID is all-zero");
                Gid::default()
            }
        };
        log::info!(
            "completeConnection: fpgaQpn={:#08x} fpgaRqPsn={:#08x} pmtu={} ({} bytes) \
             minRnrTimer={} ({} ms)",
            params.fpga_qpn,
            params.fpga_rq_psn,
            params.pmtu.code(),
            params.pmtu.bytes(),
            params.min_rnr_timer.code(),
            params.min_rnr_timer.millis()
        );
        let mut backend = c
            .backend
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Internal, "backend missing in state Created"))?;
        let all: Vec<u32> = (0..self.cfg.rx_queue_depth).collect();
        let res = backend
            .post_recv(&all)
            .and_then(|_| backend.connect(params, fpga_gid, self.host.sq_psn));
        if let Err(e) = res {
            c.phase = Phase::Failed;
            c.backend = Some(backend);
            let hint = if fpga_gid.is_zero() {
                " (the FPGA GID is not set: call setFpgaGid first)"
            } else {
                ""
            };
            return Err(Error::new(e.kind(), format!("{e}{hint}")));
        }
        log::info!(
            "Pre-posted {} receive slots; QP -> RTS",
            self.cfg.rx_queue_depth
        );
        let callback = c.callback.take();
        let core = Arc::clone(self);
        let handle = std::thread::Builder::new()
            .name("RoCEv2Server".into())
            .spawn(move || core.run(backend, callback))
            .map_err(|e| Error::io("spawning the receive thread", e))?;
        c.thread_id = Some(handle.thread().id());
        c.thread = Some(handle);
        c.phase = Phase::Running;
        Ok(())
    }

    /// Stops receiving: no callback starts after this returns, the receive
    /// thread is joined (or detached when called from it, or when a callback
    /// is still blocked after `stop_timeout_ms`), frames still queued for
    /// `poll_frame` are released, and the transport is torn down. Loaned
    /// frames stay valid until released. Idempotent.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake.signal();
        self.pull_cv.notify_all();
        let (thread, on_rx_thread, backend) = {
            let mut c = self.control();
            let was = c.phase;
            c.phase = Phase::Stopped;
            if was != Phase::Stopped {
                log::info!("stopping server on '{}'", self.device_name);
            }
            let on_rx = c.thread_id == Some(std::thread::current().id());
            (c.thread.take(), on_rx, c.backend.take())
        };
        drop(backend);
        if let Some(handle) = thread {
            if on_rx_thread {
                // Called from the frame callback: the thread ends when it returns.
                drop(handle);
            } else {
                let limit = Duration::from_millis(self.cfg.stop_timeout_ms as u64);
                let guard = self.exited.lock().unwrap_or_else(|e| e.into_inner());
                let (guard, res) = self
                    .exited_cv
                    .wait_timeout_while(guard, limit, |e| e.is_none())
                    .unwrap_or_else(|e| e.into_inner());
                drop(guard);
                if res.timed_out() {
                    log::warn!(
                        "receive thread still inside the frame callback after {} ms; detaching it \
                         (no further callback will start; its resources are freed when it returns)",
                        self.cfg.stop_timeout_ms
                    );
                } else if handle.join().is_err() {
                    log::error!("receive thread panicked");
                }
            }
        }
        self.drain_pull_queue();
    }

    fn drain_pull_queue(&self) {
        let pending: Vec<PendingFrame> = self
            .pull
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for p in pending {
            let _ = self.release_loan(p.slot, p.gen);
        }
    }

    /// Waits up to `timeout` (forever for `None`) for the next frame when no
    /// callback is registered. `Ok(None)` on timeout; `Stopped` once the
    /// server is stopped and the queue is empty.
    pub fn poll_frame(self: &Arc<Self>, timeout: Option<Duration>) -> Result<Option<Frame>> {
        {
            let c = self.control();
            if c.has_callback {
                return Err(Error::state(
                    "a frame callback is registered: frames go to the callback, not to poll_frame",
                ));
            }
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut q = self.pull.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(p) = q.pop_front() {
                return Ok(Some(Frame {
                    core: Arc::clone(self),
                    slot: p.slot,
                    gen: p.gen,
                    len: p.len,
                    imm: p.imm,
                    armed: true,
                }));
            }
            if self.stopping.load(Ordering::SeqCst) {
                return Err(Error::new(ErrorKind::Stopped, "server is stopped"));
            }
            if let Some(reason) = self.exited_reason() {
                return Err(Error::new(
                    ErrorKind::Stopped,
                    format!("receive thread ended: {reason}"),
                ));
            }
            match deadline {
                None => q = self.pull_cv.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    q = self
                        .pull_cv
                        .wait_timeout(q, d - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
    }
}

impl ServerCore {
    /// Ends loan `(slot, gen)` and queues the slot for re-posting. Never blocks.
    fn release_loan(&self, slot: u32, gen: u32) -> Result<()> {
        if !self.slab.release(slot, gen) {
            self.counters
                .invalid_releases
                .fetch_add(1, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::UnknownToken,
                format!(
                    "release token (slot {slot}, generation {gen}) is unknown or already \
                     released: release each frame exactly once"
                ),
            ));
        }
        self.counters.releases.fetch_add(1, Ordering::Relaxed);
        // Capacity equals the slot count and a slot is queued at most once per
        // loan, so the ring cannot be full.
        let queued = self.releases.push(slot);
        debug_assert!(queued, "release ring overflow");
        if self.parked.load(Ordering::SeqCst) {
            self.wake.signal();
        }
        Ok(())
    }

    /// Releases a token made by [`Frame::into_token`]. On success the caller
    /// owns one strong reference to give back (see `into_token`).
    pub(crate) fn release_token(&self, token: u64) -> Result<()> {
        let (slot, gen) = (token as u32, (token >> 32) as u32);
        if token == 0 || slot >= self.slab.slots() {
            self.counters
                .invalid_releases
                .fetch_add(1, Ordering::Relaxed);
            return Err(Error::new(
                ErrorKind::UnknownToken,
                format!("release token {token:#x} is not a token of this server"),
            ));
        }
        self.release_loan(slot, gen)
    }

    fn mark_exited(&self, reason: String) {
        *self.exited.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        self.exited_cv.notify_all();
        self.pull_cv.notify_all();
    }

    /// The receive thread.
    fn run(self: Arc<Self>, mut backend: Box<dyn Backend>, mut callback: Option<FrameCallback>) {
        log::info!("RoCEv2 receive thread started on '{}'", self.device_name);
        if let Some(cpu) = self.cfg.cpu_affinity {
            match crate::sys::pin_current_thread(cpu) {
                Ok(()) => log::info!("receive thread pinned to CPU {cpu}"),
                Err(e) => log::warn!("{e}; the receive thread runs unpinned"),
            }
        }
        let reason = match catch_unwind(AssertUnwindSafe(|| {
            self.receive_loop(backend.as_mut(), &mut callback)
        })) {
            Ok(Ok(())) => "stopped".to_string(),
            Ok(Err(e)) => {
                log::error!("RoCEv2 receive thread exiting on error: {e}");
                e.to_string()
            }
            Err(_) => {
                log::error!("RoCEv2 receive thread exiting on a panic");
                "panic in the receive thread".to_string()
            }
        };
        // Tear the transport down on this thread (QP, CQ, MR before the slab).
        drop(backend);
        drop(callback);
        log::info!("RoCEv2 receive thread stopped ({reason})");
        self.mark_exited(reason);
    }

    fn receive_loop(
        self: &Arc<Self>,
        backend: &mut dyn Backend,
        callback: &mut Option<FrameCallback>,
    ) -> Result<()> {
        let spin = Duration::from_micros(self.cfg.spin_us as u64);
        let mut completions = Vec::with_capacity(POLL_BATCH);
        let mut repost: Vec<u32> = Vec::with_capacity(self.slab.slots() as usize);
        let mut idle_since: Option<Instant> = None;
        let mut idle_polls: u32 = 0;
        while !self.stopping.load(Ordering::Acquire) {
            self.repost_released(backend, &mut repost)?;
            completions.clear();
            backend.poll(&mut completions)?;
            if !completions.is_empty() {
                idle_since = None;
                idle_polls = 0;
                if self.dispatch(&completions, callback, &mut repost)? {
                    return Ok(()); // flushed: the QP is in the error state
                }
                continue;
            }
            // Idle: spin for the budget (reading the clock every 64 polls).
            idle_polls = idle_polls.wrapping_add(1);
            if !spin.is_zero() {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if idle_polls % 64 != 0 || since.elapsed() < spin {
                    std::hint::spin_loop();
                    continue;
                }
            }
            // Park: announce it, re-check the release ring, arm, poll once more,
            // then block until a completion or a wake-up (release or stop).
            self.parked.store(true, Ordering::SeqCst);
            if !self.releases.is_empty() || self.stopping.load(Ordering::SeqCst) {
                self.parked.store(false, Ordering::SeqCst);
                continue;
            }
            backend.arm()?;
            backend.poll(&mut completions)?;
            if completions.is_empty() {
                self.counters.parks.fetch_add(1, Ordering::Relaxed);
                backend.block(self.wake.raw())?;
            }
            self.parked.store(false, Ordering::SeqCst);
            self.wake.drain();
            idle_since = None;
            if !completions.is_empty() && self.dispatch(&completions, callback, &mut repost)? {
                return Ok(());
            }
        }
        Ok(())
    }

    fn repost_released(&self, backend: &mut dyn Backend, repost: &mut Vec<u32>) -> Result<()> {
        while let Some(slot) = self.releases.pop() {
            repost.push(slot);
        }
        if repost.is_empty() {
            return Ok(());
        }
        backend.post_recv(repost)?;
        self.counters
            .reposts
            .fetch_add(repost.len() as u64, Ordering::Relaxed);
        self.counters.repost_batches.fetch_add(1, Ordering::Relaxed);
        repost.clear();
        Ok(())
    }

    /// Hands completions to the consumer; returns true when the QP flushed.
    fn dispatch(
        self: &Arc<Self>,
        completions: &[Completion],
        callback: &mut Option<FrameCallback>,
        repost: &mut Vec<u32>,
    ) -> Result<bool> {
        for c in completions {
            if self.stopping.load(Ordering::Acquire) {
                return Ok(false);
            }
            let (len, imm) = match c.kind {
                CompletionKind::Recv { len, imm } => (len, imm),
                CompletionKind::Flushed => {
                    self.counters.flush_errors.fetch_add(1, Ordering::Relaxed);
                    log::error!("QP in ERROR state (WR_FLUSH_ERR); exiting receive thread");
                    return Ok(true);
                }
                CompletionKind::Error { what } => {
                    self.counters
                        .completion_errors
                        .fetch_add(1, Ordering::Relaxed);
                    log::warn!("CQ error: {what} (slot={}); re-posting", c.slot);
                    repost.push(c.slot);
                    continue;
                }
                CompletionKind::Unexpected { opcode, flags } => {
                    self.counters
                        .unexpected_opcode
                        .fetch_add(1, Ordering::Relaxed);
                    log::warn!(
                        "Unexpected opcode {opcode} / wc_flags {flags:#x} (slot={}); re-posting",
                        c.slot
                    );
                    repost.push(c.slot);
                    continue;
                }
            };
            if len == 0 || len > self.slab.slot_size() {
                self.counters.bad_length.fetch_add(1, Ordering::Relaxed);
                log::warn!("Bad payload len={len} (slot={}); re-posting", c.slot);
                repost.push(c.slot);
                continue;
            }
            let Some(gen) = self.slab.loan(c.slot) else {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("completion for slot {} which is on loan", c.slot),
                ));
            };
            self.counters.frames.fetch_add(1, Ordering::Relaxed);
            self.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
            log::trace!("RX slot={} channel={} len={len}", c.slot, imm & 0xff);
            match callback {
                Some(cb) => {
                    let frame = Frame {
                        core: Arc::clone(self),
                        slot: c.slot,
                        gen,
                        len,
                        imm,
                        armed: true,
                    };
                    if catch_unwind(AssertUnwindSafe(|| cb(frame))).is_err() {
                        self.counters
                            .callback_panics
                            .fetch_add(1, Ordering::Relaxed);
                        log::error!("frame callback panicked (slot={}); frame released", c.slot);
                    }
                }
                None => {
                    self.pull
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push_back(PendingFrame {
                            slot: c.slot,
                            gen,
                            len,
                            imm,
                        });
                    self.pull_cv.notify_one();
                }
            }
        }
        Ok(false)
    }
}
