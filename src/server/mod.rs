//! The backend-agnostic server core: lifecycle, the slab and its loans, the
//! receive thread, dispatch to a callback or the pull queue, and counters.
//!
//! A backend (verbs or soft) owns the transport: it registers the slab, posts
//! receives, and reports completions. The receive thread owns the backend once
//! the connection is complete, so backend objects are touched by one thread
//! only; consumers talk to the thread through a lock-free release queue
//! (crossbeam's ArrayQueue) and an eventfd.

mod backend;
mod counter;
mod frame;
mod health;
mod judge;
pub(crate) mod latency;
mod release;
mod slab;
mod spin;
mod stats;
#[cfg(test)]
mod tests;
mod thread;

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;

use crate::config::{ConnectParams, HostParams, ServerConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::sys::{random_u32, EventFd};
use crate::wire::MASK_24;

pub(crate) use backend::{Backend, BackendInfo, Completion, CompletionKind, POLL_BATCH};
pub use frame::{Frame, RxTimeSource};
use latency::Histogram;
pub use latency::Latency;
pub(crate) use slab::Slab;
#[cfg(feature = "verbs")]
pub(crate) use stats::VerbsCounters;
pub(crate) use stats::{Activity, BackendCounters, Counters, SoftCounters};
pub use stats::{BackendStats, LinkState, SoftStats, Stats, VerbsStats};

/// The receive thread's name, as `ps -L`, `/proc/<pid>/task/*/comm` and
/// rogue list it (named before `complete_connection` returns).
pub(crate) const RECEIVE_THREAD_NAME: &str = "RoCEv2Server";

type FrameCallback = Box<dyn FnMut(Frame) + Send + 'static>;

struct Control {
    /// The link as the control calls left it: Created; Connected once the
    /// receive thread started; Error when complete_connection failed (the
    /// QP state is unknown); Stopped after stop(). A receive thread that
    /// ended overrides it (see [`ServerCore::link_state`]).
    link: LinkState,
    backend: Option<Box<dyn Backend>>,
    callback: Option<FrameCallback>,
    has_callback: bool,
    fpga_gid: Option<Gid>,
    thread: Option<JoinHandle<()>>,
    thread_id: Option<ThreadId>,
    /// Why complete_connection failed (`link` Error).
    failed_cause: Option<String>,
}

#[derive(Clone, Copy)]
struct PendingFrame {
    slot: u32,
    serial: u64,
    len: u32,
    imm: Option<u32>,
    /// When its last packet was received (CLOCK_REALTIME ns), and whose
    /// stamp that is.
    rx_ns: u64,
    rx_src: RxTimeSource,
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
    /// Releases made on the receive thread (its fast path): written by that
    /// thread only; `Stats::releases` is `counters.releases` plus this.
    local_releases: Arc<AtomicU64>,
    backend_counters: BackendCounters,
    /// Released slots, pushed from any thread, drained by the receive
    /// thread (crossbeam's bounded MPMC queue: capacity = slot count).
    releases: ArrayQueue<u32>,
    /// One reference to this core per outstanding C token (the frame's,
    /// kept by `Frame::into_token`; `release_token` takes one back): while
    /// tokens are out, the core outlives its handle. Capacity = slot count.
    token_refs: ArrayQueue<Arc<ServerCore>>,
    wake: EventFd,
    parked: AtomicBool,
    stopping: AtomicBool,
    control: Mutex<Control>,
    pull: Mutex<VecDeque<PendingFrame>>,
    pull_cv: Condvar,
    /// Threads waiting on `pull_cv`: changed only under the `pull` lock,
    /// so the receive thread, which reads it after queueing frames under
    /// that lock, wakes nobody (no futex call) when nobody waits.
    pull_waiting: AtomicUsize,
    exited: Mutex<Option<End>>,
    exited_cv: Condvar,
    activity: Activity,
    /// The soft backend's ACK turnaround (its receive thread records).
    turnaround: Arc<Histogram>,
    /// Whose receive times the backend stamps completions with (the
    /// kernel's, soft; the NIC's, verbs on a device that stamps); None: the
    /// core stamps the host clock at poll.
    stamp_source: Option<RxTimeSource>,
    /// Kernel receive stamp to the callback's entry or the poll's return.
    delivery: Histogram,
    #[cfg(test)]
    test_hooks: tests::Hooks,
}

/// How the receive thread ended.
#[derive(Debug, Clone)]
struct End {
    /// On an error (else by stop()).
    error: bool,
    /// What happened, for an operator.
    cause: String,
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
        let mut backend = make_backend(&slab)?;
        let turnaround = Arc::new(Histogram::default());
        let stamp_source = match backend.stamp_receives() {
            Ok(k) => k.then(|| backend.stamp_source()),
            Err(e) => {
                log::warn!(
                    "{e}; frames carry the host clock at poll as their receive time instead of \
                     the kernel's receive stamp"
                );
                None
            }
        };
        if cfg.measure_latency {
            backend.measure_latency(Arc::clone(&turnaround))?;
        }
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
            releases: ArrayQueue::new(cfg.rx_queue_depth as usize),
            token_refs: ArrayQueue::new(cfg.rx_queue_depth as usize),
            slab,
            host,
            counters: Counters::default(),
            local_releases: Arc::new(AtomicU64::new(0)),
            backend_counters: backend.counters(),
            wake: EventFd::new()?,
            parked: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
            control: Mutex::new(Control {
                link: LinkState::Created,
                backend: Some(backend),
                callback: None,
                has_callback: false,
                fpga_gid: None,
                thread: None,
                thread_id: None,
                failed_cause: None,
            }),
            pull: Mutex::new(VecDeque::new()),
            pull_cv: Condvar::new(),
            pull_waiting: AtomicUsize::new(0),
            exited: Mutex::new(None),
            exited_cv: Condvar::new(),
            activity: Activity::new(),
            turnaround,
            stamp_source,
            delivery: Histogram::default(),
            #[cfg(test)]
            test_hooks: Default::default(),
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
        let (since_last_packet, since_last_frame) = self.activity.ages();
        let counters = self.counters.snapshot();
        Stats {
            releases: counters.releases + self.local_releases.load(Ordering::Acquire),
            loans_outstanding: self.slab.loans_outstanding() as u64,
            link: self.link_state(),
            since_last_packet,
            since_last_frame,
            backend: self.backend_counters.snapshot(),
            ack_turnaround: self.turnaround.snapshot(),
            delivery_latency: self.delivery.snapshot(),
            ..counters
        }
    }
    /// The link's state.
    pub fn link_state(&self) -> LinkState {
        if let Some(end) = self.exited() {
            return if end.error {
                LinkState::Error
            } else {
                LinkState::Stopped
            };
        }
        self.control().link
    }
    /// True while the receive thread runs.
    pub fn is_running(&self) -> bool {
        self.control().link == LinkState::Connected && self.exited().is_none()
    }
    fn exited(&self) -> Option<End> {
        self.exited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    /// Why the receive thread ended, once it has ("stopped" after stop()).
    pub fn exited_reason(&self) -> Option<String> {
        self.exited().map(|e| e.cause)
    }
    /// Why the link is down, for an operator: the receive thread's end cause,
    /// or why complete_connection failed; None while created or connected.
    pub fn end_cause(&self) -> Option<String> {
        self.exited_reason()
            .or_else(|| self.control().failed_cause.clone())
    }

    /// Stores the FPGA's GID (the destination of the host QP's path).
    pub fn set_fpga_gid(&self, gid: Gid) -> Result<()> {
        let mut c = self.control();
        if c.link != LinkState::Created {
            return Err(Error::state(
                "setFpgaGid must be called before completeConnection",
            ));
        }
        if let Some(b) = c.backend.as_mut() {
            b.expect_peer(gid)?;
        }
        c.fpga_gid = Some(gid);
        log::info!("FPGA GID stored: {gid}");
        Ok(())
    }

    /// Registers the frame callback (before `complete_connection`). It runs on
    /// the receive thread with each frame on loan; dropping the frame releases it.
    pub fn set_frame_callback(&self, cb: impl FnMut(Frame) + Send + 'static) -> Result<()> {
        let mut c = self.control();
        if c.link != LinkState::Created {
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
        match c.link {
            LinkState::Created => {}
            LinkState::Connected | LinkState::Error => {
                return Err(Error::state(
                    "completeConnection already invoked; destroy and recreate Server to \
                     re-establish the RC connection",
                ))
            }
            LinkState::Stopped => {
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
            c.link = LinkState::Error;
            c.failed_cause = Some(format!("complete_connection failed: {e}"));
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
        // The thread names itself as it starts (std sets the name inside the
        // new thread, before the closure runs): wait for that start, so the
        // name is listed when this returns (rogue looks for it right away).
        let (started, has_started) = std::sync::mpsc::sync_channel::<()>(1);
        let handle = std::thread::Builder::new()
            .name(RECEIVE_THREAD_NAME.into())
            .spawn(move || {
                let _ = started.send(());
                core.run(backend, callback)
            })
            .map_err(|e| Error::io("spawning the receive thread", e))?;
        // An error here means the thread ended without sending: nothing to wait for.
        let _ = has_started.recv();
        c.thread_id = Some(handle.thread().id());
        c.thread = Some(handle);
        c.link = LinkState::Connected;
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
        self.wake_all_pullers();
        let (thread, on_rx_thread, backend) = {
            let mut c = self.control();
            let was = c.link;
            c.link = LinkState::Stopped;
            if was != LinkState::Stopped {
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

    /// Wakes every `poll_frame` waiter after a change to what they check
    /// (`stopping`, `exited`). The pull lock is taken first (and let go at
    /// once): a poller holds it from its checks until `wait` releases it, so
    /// the notification cannot fall between the two (a lost wake-up).
    fn wake_all_pullers(&self) {
        drop(self.pull.lock().unwrap_or_else(|e| e.into_inner()));
        self.pull_cv.notify_all();
    }

    fn drain_pull_queue(&self) {
        let pending: Vec<PendingFrame> = self
            .pull
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for p in pending {
            let _ = self.release_loan(p.slot, p.serial);
        }
    }

    /// The loan of a frame taken from the pull queue.
    /// A frame taken from the pull queue: its delivery latency ends here.
    fn queued_frame(self: &Arc<Self>, p: PendingFrame) -> Frame {
        if self.measures_delivery(p.rx_src) {
            self.delivery.since(p.rx_ns, latency::now_ns());
        }
        Frame {
            core: Some(Arc::clone(self)),
            slot: p.slot,
            serial: p.serial,
            len: p.len,
            imm: p.imm,
            rx_ns: p.rx_ns,
            rx_src: p.rx_src,
        }
    }

    /// Whether a frame's delivery latency is measured: asked for
    /// (`measure_latency`), from a kernel receive stamp.
    fn measures_delivery(&self, src: RxTimeSource) -> bool {
        self.cfg.measure_latency && src == RxTimeSource::Kernel
    }

    /// Up to `max` frames: waits like `poll_frame` for the first, then hands
    /// `each` those already queued, without waiting. Returns how many (0 on
    /// timeout).
    pub fn poll_batch(
        self: &Arc<Self>,
        timeout: Option<Duration>,
        max: usize,
        mut each: impl FnMut(Frame),
    ) -> Result<usize> {
        if max == 0 {
            return Ok(0);
        }
        let Some(first) = self.poll_frame(timeout)? else {
            return Ok(0);
        };
        each(first);
        Ok(1 + self.take_ready(max - 1, each))
    }

    /// Frames already queued for `poll_frame`, up to `max`, without waiting
    /// (the rest of a batch after `poll_frame` returned one): one lock.
    fn take_ready(self: &Arc<Self>, max: usize, mut each: impl FnMut(Frame)) -> usize {
        let mut q = self.pull.lock().unwrap_or_else(|e| e.into_inner());
        for n in 0..max {
            let Some(p) = q.pop_front() else {
                return n;
            };
            each(self.queued_frame(p));
        }
        max
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
                return Ok(Some(self.queued_frame(p)));
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
            let wait = match deadline {
                None => None,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Ok(None);
                    }
                    Some(d - now)
                }
            };
            #[cfg(test)]
            self.test_hooks.before_pull_wait();
            self.pull_waiting.fetch_add(1, Ordering::SeqCst);
            q = match wait {
                None => self.pull_cv.wait(q).unwrap_or_else(|e| e.into_inner()),
                Some(w) => {
                    self.pull_cv
                        .wait_timeout(q, w)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
            self.pull_waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
