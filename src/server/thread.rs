//! The receive thread: poll the backend, dispatch completions to the
//! callback or the pull queue, re-post released slots in batches, and when
//! idle do what the waiting policy (`spin.rs`) decides: poll again, yield,
//! nap or park. The release path that feeds it is `release.rs`.

use super::*;
use counter::{CounterCheck, Seen};
use health::{Change, Health};
use release::OwnThread;
use spin::{Spin, Wait};
use stats::bump;

/// The receive loop's working set.
struct Rx {
    completions: Vec<Completion>,
    /// Slots to re-post in the next batch.
    repost: Vec<u32>,
    /// References to the core handed back by frames released on this
    /// thread: the next frames take them instead of cloning the `Arc`.
    cores: Vec<Arc<ServerCore>>,
    /// `Backend::packets_seen` at the last poll.
    packets_seen: u64,
    /// The FPGA's frame counter check (`ServerConfig::counter_wrap`; None:
    /// off) and whether a counter beyond the wrap was logged.
    counter: Option<CounterCheck>,
    beyond_logged: bool,
    /// The link's verdicts from its counters (`health.rs`).
    health: Health,
}

impl Rx {
    /// For `depth` slots; the frame counter checked modulo `counter_wrap`
    /// (0: not checked).
    fn new(depth: usize, counter_wrap: u32) -> Rx {
        Rx {
            completions: Vec::with_capacity(POLL_BATCH),
            repost: Vec::with_capacity(depth),
            cores: Vec::with_capacity(depth),
            packets_seen: 0,
            counter: (counter_wrap > 0).then(|| CounterCheck::new(counter_wrap)),
            beyond_logged: false,
            health: Health::default(),
        }
    }
}

/// The receive thread's timer slack (ns): naps end on time.
const NAP_SLACK_NS: u64 = 1_000;

/// What a poll did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Polled {
    /// Found nothing, did nothing.
    Nothing,
    /// Found work and handed it out; `drained`: the receive emptied the
    /// backend (the next poll would find nothing).
    Work { drained: bool },
}

impl ServerCore {
    fn mark_exited(&self, end: End) {
        *self.exited.lock().unwrap_or_else(|e| e.into_inner()) = Some(end);
        self.exited_cv.notify_all();
        self.wake_all_pullers();
    }

    /// The receive thread.
    pub(super) fn run(
        self: Arc<Self>,
        mut backend: Box<dyn Backend>,
        mut callback: Option<FrameCallback>,
    ) {
        log::info!("RoCEv2 receive thread started on '{}'", self.device_name);
        if let Some(cpu) = self.cfg.cpu_affinity {
            match crate::sys::pin_current_thread(cpu) {
                Ok(()) => log::info!("receive thread pinned to CPU {cpu}"),
                Err(e) => log::warn!("{e}; the receive thread runs unpinned"),
            }
        }
        let end = match catch_unwind(AssertUnwindSafe(|| {
            self.receive_loop(backend.as_mut(), &mut callback)
        })) {
            Ok(Ok(())) => End {
                error: false,
                cause: "stopped".to_string(),
            },
            Ok(Err(e)) => {
                log::error!("RoCEv2 receive thread exiting on error: {e}");
                End {
                    error: true,
                    cause: e.to_string(),
                }
            }
            Err(_) => {
                log::error!("RoCEv2 receive thread exiting on a panic");
                End {
                    error: true,
                    cause: "panic in the receive thread (a bug: please report it)".to_string(),
                }
            }
        };
        // Tear the transport down on this thread (QP, CQ, MR before the slab).
        drop(backend);
        drop(callback);
        log::info!("RoCEv2 receive thread stopped ({})", end.cause);
        self.mark_exited(end);
    }

    fn receive_loop(
        self: &Arc<Self>,
        backend: &mut dyn Backend,
        callback: &mut Option<FrameCallback>,
    ) -> Result<()> {
        let own = OwnThread::enter(self);
        let mut rx = Rx::new(self.slab.slots() as usize, self.cfg.counter_wrap);
        let mut spin = self.wait_policy(backend);
        let mut drained = false;
        while !self.stopping.load(Ordering::Acquire) {
            self.repost_released(backend, &own, &mut rx)?;
            // (Cleared here, not before the poll: the park path dispatches
            // what it finds in there.)
            rx.completions.clear();
            // After a receive that emptied the socket, no poll that would
            // find nothing: spin (polling) or block (which sees what came).
            if !std::mem::take(&mut drained) {
                if let Polled::Work { drained: d } =
                    self.poll_work(backend, callback, &mut rx, &mut spin)?
                {
                    drained = d;
                    continue;
                }
            }
            match spin.idle(Instant::now) {
                Wait::Poll => std::hint::spin_loop(),
                Wait::Yield => std::thread::yield_now(),
                Wait::Nap(nap) => {
                    if let Polled::Work { drained: d } =
                        self.nap(nap, backend, callback, &mut rx, &mut spin)?
                    {
                        drained = d;
                    }
                }
                Wait::Park => self.park(backend, callback, &mut rx, &mut spin)?,
            }
        }
        Ok(())
    }

    /// The receive thread's waiting policy (`spin.rs`), naps sized to the
    /// slots and the transport's buffer.
    fn wait_policy(&self, backend: &dyn Backend) -> Spin {
        let slots = self.slab.slots() as u64;
        let room = judge::nap_room(slots, self.slab.slot_size(), backend.queue_bytes());
        if self.cfg.spin_us > 0 {
            // Naps (`judge.rs`) as long as asked: a nap sized to what the
            // buffers hold must not run 50 us over.
            if let Err(e) = crate::sys::set_timer_slack(NAP_SLACK_NS) {
                log::debug!("{e}; naps may run up to 50 us long");
            }
        }
        Spin::new(self.cfg.spin_us, room)
    }

    /// Naps (a paced sender): sleeps `nap`, then takes what came; parks
    /// only when the nap found nothing. One wake-up per nap instead of one
    /// per burst the sender releases.
    fn nap(
        self: &Arc<Self>,
        nap: Duration,
        backend: &mut dyn Backend,
        callback: &mut Option<FrameCallback>,
        rx: &mut Rx,
        spin: &mut Spin,
    ) -> Result<Polled> {
        std::thread::sleep(nap);
        bump(&self.counters.naps, 1);
        let polled = self.poll_work(backend, callback, rx, spin)?;
        if polled == Polled::Nothing {
            self.park(backend, callback, rx, spin)?;
        }
        Ok(polled)
    }

    /// Parks: announces it, re-checks the release ring, arms (and polls once
    /// more if the backend needs it), then blocks until a completion or a
    /// wake-up (release or stop), and hands out what came.
    /// (The local list is empty here: taken by the loop, and no frame was
    /// handed out since.)
    fn park(
        self: &Arc<Self>,
        backend: &mut dyn Backend,
        callback: &mut Option<FrameCallback>,
        rx: &mut Rx,
        spin: &mut Spin,
    ) -> Result<()> {
        spin.parked();
        self.parked.store(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !self.releases.is_empty() || self.stopping.load(Ordering::SeqCst) {
            self.parked.store(false, Ordering::SeqCst);
            return Ok(());
        }
        if backend.arm()? {
            backend.poll(&mut rx.completions)?;
        }
        let mut woken = true;
        if rx.completions.is_empty() {
            bump(&self.counters.parks, 1);
            woken = backend.block(self.wake.raw())?;
        }
        self.parked.store(false, Ordering::SeqCst);
        if woken {
            self.wake.drain();
        }
        if let Some(now) = self.note_activity(backend, rx) {
            spin.work(now, rx.completions.len());
        }
        self.dispatch(callback, rx)
    }

    /// Polls; when that found work, hands it out.
    fn poll_work(
        self: &Arc<Self>,
        backend: &mut dyn Backend,
        callback: &mut Option<FrameCallback>,
        rx: &mut Rx,
        spin: &mut Spin,
    ) -> Result<Polled> {
        backend.poll(&mut rx.completions)?;
        let Some(now) = self.note_activity(backend, rx) else {
            return Ok(Polled::Nothing);
        };
        spin.work(now, rx.completions.len());
        self.dispatch(callback, rx)?;
        Ok(Polled::Work {
            drained: backend.drained(),
        })
    }

    /// Stamps the last packet's time when the backend saw packets (soft:
    /// any datagram from the FPGA, even one that completes nothing) or
    /// completions arrived (verbs), and the last frame's when completions
    /// arrived (before they are handed out, so a consumer holding a frame
    /// reads a stamp). One clock read per busy poll, returned (the spin
    /// policy's "work"); None for a poll that found nothing.
    fn note_activity(&self, backend: &dyn Backend, rx: &mut Rx) -> Option<Instant> {
        let now_seen = backend.packets_seen();
        if now_seen == rx.packets_seen && rx.completions.is_empty() {
            return None;
        }
        rx.packets_seen = now_seen;
        let now = Instant::now();
        self.activity.packet(now);
        if !rx.completions.is_empty() {
            self.activity.frame(now);
        }
        self.judge_health(now, &mut rx.health);
        Some(now)
    }

    /// Feeds the link's verdicts (`health.rs`) the totals at `now` (they
    /// judge a window at most every 500 ms); counts and logs what changed.
    fn judge_health(&self, now: Instant, health: &mut Health) {
        let totals = self
            .backend_counters
            .health_totals(self.counters.frames.load(Ordering::Relaxed));
        let judged = health.sample(now, totals);
        for change in [judged.duplicating, judged.storm].into_iter().flatten() {
            self.report_health(change);
        }
    }

    fn report_health(&self, change: Change) {
        let c = &self.counters;
        match change {
            Change::Duplicating { dups, frames, secs } => {
                bump(&c.duplicating_peers, 1);
                c.duplicating_peer.store(1, Ordering::Release);
                log::warn!(
                    "duplicating peer on '{}': {dups} duplicate packets against {frames} frames \
                     delivered in {secs:.1} s: the FPGA sends every message twice (surf's sticky \
                     half-bandwidth latch after RNR back-pressure); each copy is re-ACKed and \
                     dropped, nothing is lost, but the link runs at half rate. Remedy: toggle the \
                     FPGA's TxEn or soft-reset its RoCEv2 engine; avoid the RNR back-pressure that \
                     sets it (enough slots, a consumer that keeps up, min_rnr_timer 12)",
                    self.device_name
                );
            }
            Change::DuplicatingCleared => {
                c.duplicating_peer.store(0, Ordering::Release);
                log::info!(
                    "duplicating peer on '{}': duplicates back to normal, the verdict is cleared",
                    self.device_name
                );
            }
            Change::Storm { naks, secs } => {
                bump(&c.rnr_storms, 1);
                c.rnr_storm.store(1, Ordering::Release);
                let depth = self.slab.slots() as u64;
                let loans = self.slab.loans_outstanding() as u64;
                log::warn!(
                    "RNR storm on '{}': {naks} RNR NAKs sent in {secs:.1} s ({:.0}/s, above {:.0}/s): \
                     messages keep arriving with no receive slot free, and the FPGA retries after \
                     each NAK (surf's RNR retry is unproven). Check: slots free ({} of \
                     rx_queue_depth {depth}), loans outstanding ({loans}: frames the consumer \
                     holds), a slow consumer (callback or poll loop slower than the stream), \
                     min_rnr_timer (12 = 0.64 ms; a short one makes the FPGA retry into a full \
                     queue), rx_queue_depth (more slots absorb a consumer's pauses)",
                    self.device_name,
                    naks as f64 / secs,
                    health::RNR_STORM_PER_S,
                    depth.saturating_sub(loans),
                );
            }
            Change::StormCleared => {
                c.rnr_storm.store(0, Ordering::Release);
                log::info!(
                    "RNR storm on '{}' is over: the verdict is cleared",
                    self.device_name
                );
            }
        }
    }

    /// Re-posts the slots released since the last batch: from other threads
    /// (the ring) and from this one (the local list), in one call.
    fn repost_released(
        &self,
        backend: &mut dyn Backend,
        own: &OwnThread,
        rx: &mut Rx,
    ) -> Result<()> {
        if !self.releases.is_empty() {
            while let Some(slot) = self.releases.pop() {
                rx.repost.push(slot);
            }
        }
        own.take(&mut rx.repost, &mut rx.cores);
        if rx.repost.is_empty() {
            return Ok(());
        }
        backend.post_recv(&rx.repost)?;
        bump(&self.counters.reposts, rx.repost.len() as u64);
        bump(&self.counters.repost_batches, 1);
        rx.repost.clear();
        Ok(())
    }

    /// Hands completions to the consumer. A completion error or a flush
    /// means the QP is in the error state (an RC QP receives nothing more):
    /// counted, and the loop ends with the cause (the thread logs it once).
    fn dispatch(self: &Arc<Self>, callback: &mut Option<FrameCallback>, rx: &mut Rx) -> Result<()> {
        let Rx {
            completions,
            repost,
            cores,
            counter,
            beyond_logged,
            ..
        } = rx;
        let mut queued = 0;
        // The host clock at poll, for completions the backend did not stamp
        // (read once per batch, when one needs it).
        let mut poll_ns = 0;
        for c in completions.iter() {
            if self.stopping.load(Ordering::Acquire) {
                break;
            }
            let (len, imm) = match c.kind {
                CompletionKind::Recv { len, imm } => (len, imm),
                CompletionKind::Flushed => {
                    bump(&self.counters.flush_errors, 1);
                    return Err(Error::new(
                        ErrorKind::Device,
                        "the QP entered the error state: the NIC flushed the posted receives \
                         (IBV_WC_WR_FLUSH_ERR) and the link receives nothing more. Re-create the \
                         server and program the FPGA with its new host params",
                    ));
                }
                CompletionKind::Error { what, code } => {
                    bump(&self.counters.completion_errors, 1);
                    return Err(Error::new(
                        ErrorKind::Device,
                        format!(
                            "receive completion error on slot {}: {what} (ibv_wc_status {code}); \
                             the QP is now in the error state and the link receives nothing more. Re-create the \
                             server and program the FPGA with its new host params",
                            c.slot
                        ),
                    ));
                }
                CompletionKind::Unexpected { opcode, flags } => {
                    bump(&self.counters.unexpected_opcode, 1);
                    log::warn!(
                        "Unexpected opcode {opcode} / wc_flags {flags:#x} (slot={}); re-posting",
                        c.slot
                    );
                    repost.push(c.slot);
                    continue;
                }
            };
            if len > self.slab.slot_size() {
                bump(&self.counters.bad_length, 1);
                log::warn!("Bad payload len={len} (slot={}); re-posting", c.slot);
                repost.push(c.slot);
                continue;
            }
            if let (Some(check), Some(imm)) = (counter.as_mut(), imm) {
                self.check_counter(check, imm >> 8, beyond_logged);
            }
            let rx = if let (Some(src), true) = (self.stamp_source, c.rx_ns != 0) {
                (c.rx_ns, src)
            } else {
                if poll_ns == 0 {
                    poll_ns = latency::now_ns();
                }
                (poll_ns, RxTimeSource::Poll)
            };
            self.deliver(c, len, imm, rx, callback, cores)?;
            queued += callback.is_none() as usize;
        }
        self.wake_pullers(queued);
        Ok(())
    }

    /// Checks a delivered frame's counter (immediate bits \[31:8\]): a gap
    /// or a reset is counted and logged once, with the positions (frame
    /// numbers are the core's delivery count: the frame about to be
    /// delivered is `frames + 1`).
    fn check_counter(&self, check: &mut CounterCheck, got: u32, beyond_logged: &mut bool) {
        let frame = self.counters.frames.load(Ordering::Relaxed) + 1;
        match check.frame(got) {
            Seen::InOrder => {}
            Seen::Gap {
                expected,
                got,
                missing,
            } => {
                bump(&self.counters.counter_gaps, 1);
                bump(&self.counters.counter_gap_frames, missing as u64);
                log::warn!(
                    "FPGA frame counter gap: frame {frame} carries counter {got} where {expected} \
                     was due: {missing} frame(s) the FPGA numbered never arrived (it dropped them \
                     before sending, or skipped numbers); every frame the host ACKed was delivered"
                );
            }
            Seen::Reset { expected } => {
                bump(&self.counters.counter_resets, 1);
                log::warn!(
                    "FPGA frame counter reset: frame {frame} carries counter 0 where {expected} \
                     was due: the FPGA re-armed its dispatch (or restarted); counting goes on \
                     from 0"
                );
            }
            Seen::Beyond { got } => {
                if !std::mem::replace(beyond_logged, true) {
                    log::warn!(
                        "FPGA frame counter {got} (frame {frame}) is at or above counter_wrap {}: \
                         the FPGA's AddrWrapCount is not the server's counter_wrap, or it puts \
                         other things in immediate bits [31:8]; set counter_wrap to its \
                         AddrWrapCount, or 0 to turn the check off (said once)",
                        self.cfg.counter_wrap
                    );
                }
            }
        }
    }

    /// After `queued` frames went to the pull queue: wakes waiting pollers,
    /// once per batch and only when one waits (a futex call per frame cost
    /// the receive thread more than a small frame's whole dispatch). Several
    /// waiters and several frames: all of them, each takes its share.
    fn wake_pullers(&self, queued: usize) {
        if queued == 0 {
            return;
        }
        match self.pull_waiting.load(Ordering::SeqCst) {
            0 => {}
            1 => self.pull_cv.notify_one(),
            _ if queued == 1 => self.pull_cv.notify_one(),
            _ => self.pull_cv.notify_all(),
        }
    }

    /// Loans `slot` to the consumer: the callback (the frame holds a
    /// reference to the core: one handed back by an earlier frame, or a
    /// clone), or the pull queue.
    fn deliver(
        self: &Arc<Self>,
        c: &Completion,
        len: u32,
        imm: Option<u32>,
        (rx_ns, rx_src): (u64, RxTimeSource),
        callback: &mut Option<FrameCallback>,
        cores: &mut Vec<Arc<ServerCore>>,
    ) -> Result<()> {
        let slot = c.slot;
        let Some(serial) = self.slab.loan(slot) else {
            if self.slab.serials_exhausted() {
                return Err(Error::new(
                    ErrorKind::Stopped,
                    format!(
                        "this process has made {} frame loans, all the loan serials there are \
                         (a release token is never reused, so none is made twice): restart the \
                         process to receive again",
                        slab::SERIAL_LIMIT
                    ),
                ));
            }
            return Err(Error::new(
                ErrorKind::Internal,
                format!("completion for slot {slot} which is on loan"),
            ));
        };
        bump(&self.counters.frames, 1);
        bump(&self.counters.bytes, len as u64);
        log::trace!("RX slot={slot} imm={imm:?} len={len}");
        let Some(cb) = callback else {
            self.pull
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push_back(PendingFrame {
                    slot,
                    serial,
                    len,
                    imm,
                    rx_ns,
                    rx_src,
                });
            // Waiting pollers are woken once for the batch (`wake_pullers`).
            return Ok(());
        };
        let frame = Frame {
            core: Some(cores.pop().unwrap_or_else(|| Arc::clone(self))),
            slot,
            serial,
            len,
            imm,
            rx_ns,
            rx_src,
        };
        if self.measures_delivery(rx_src) {
            self.delivery.since(rx_ns, latency::now_ns());
        }
        if catch_unwind(AssertUnwindSafe(|| cb(frame))).is_err() {
            bump(&self.counters.callback_panics, 1);
            log::error!("frame callback panicked (slot={slot}); frame released");
        }
        Ok(())
    }
}
