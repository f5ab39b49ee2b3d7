//! The receive thread: poll the backend, dispatch completions to the
//! callback or the pull queue, re-post released slots in batches, park when
//! idle; and the release path (any thread) that feeds it.

use super::*;
use stats::bump;

impl ServerCore {
    /// Ends loan `(slot, gen)` and queues the slot for re-posting. Never blocks.
    pub(super) fn release_loan(&self, slot: u32, gen: u32) -> Result<()> {
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
        // loan, so the queue cannot be full.
        let queued = self.releases.push(slot);
        debug_assert!(queued.is_ok(), "release queue overflow");
        // Pairs with the fence after `parked.store(true)` in the receive
        // loop: either this thread sees `parked` and wakes it, or the receive
        // thread sees this slot in the queue and does not block.
        fence(Ordering::SeqCst);
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

    fn mark_exited(&self, end: End) {
        *self.exited.lock().unwrap_or_else(|e| e.into_inner()) = Some(end);
        self.exited_cv.notify_all();
        self.pull_cv.notify_all();
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
        let spin = Duration::from_micros(self.cfg.spin_us as u64);
        let mut completions = Vec::with_capacity(POLL_BATCH);
        let mut repost: Vec<u32> = Vec::with_capacity(self.slab.slots() as usize);
        let mut idle_since: Option<Instant> = None;
        let mut idle_polls: u32 = 0;
        let mut packets_seen = 0u64;
        while !self.stopping.load(Ordering::Acquire) {
            self.repost_released(backend, &mut repost)?;
            completions.clear();
            backend.poll(&mut completions)?;
            self.note_activity(backend, &mut packets_seen, &completions);
            if !completions.is_empty() {
                idle_since = None;
                idle_polls = 0;
                self.dispatch(&completions, callback, &mut repost)?;
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
            fence(Ordering::SeqCst);
            if !self.releases.is_empty() || self.stopping.load(Ordering::SeqCst) {
                self.parked.store(false, Ordering::SeqCst);
                continue;
            }
            backend.arm()?;
            backend.poll(&mut completions)?;
            if completions.is_empty() {
                bump(&self.counters.parks, 1);
                backend.block(self.wake.raw())?;
            }
            self.parked.store(false, Ordering::SeqCst);
            self.wake.drain();
            idle_since = None;
            self.note_activity(backend, &mut packets_seen, &completions);
            self.dispatch(&completions, callback, &mut repost)?;
        }
        Ok(())
    }

    /// Stamps the last packet's time when the backend saw packets (soft:
    /// any datagram from the FPGA, even one that completes nothing) or
    /// completions arrived (verbs), and the last frame's when completions
    /// arrived (before they are handed out, so a consumer holding a frame
    /// reads a stamp). One clock read per busy poll.
    fn note_activity(&self, backend: &dyn Backend, seen: &mut u64, completions: &[Completion]) {
        let now_seen = backend.packets_seen();
        if now_seen != *seen || !completions.is_empty() {
            *seen = now_seen;
            let now = Instant::now();
            self.activity.packet(now);
            if !completions.is_empty() {
                self.activity.frame(now);
            }
        }
    }

    fn repost_released(&self, backend: &mut dyn Backend, repost: &mut Vec<u32>) -> Result<()> {
        while let Some(slot) = self.releases.pop() {
            repost.push(slot);
        }
        if repost.is_empty() {
            return Ok(());
        }
        backend.post_recv(repost)?;
        bump(&self.counters.reposts, repost.len() as u64);
        bump(&self.counters.repost_batches, 1);
        repost.clear();
        Ok(())
    }

    /// Hands completions to the consumer. A completion error or a flush
    /// means the QP is in the error state (an RC QP receives nothing more):
    /// counted, and the loop ends with the cause (the thread logs it once).
    fn dispatch(
        self: &Arc<Self>,
        completions: &[Completion],
        callback: &mut Option<FrameCallback>,
        repost: &mut Vec<u32>,
    ) -> Result<()> {
        for c in completions {
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
            self.deliver(c.slot, len, imm, callback)?;
        }
        Ok(())
    }

    /// Loans `slot` to the consumer: the callback, or the pull queue.
    fn deliver(
        self: &Arc<Self>,
        slot: u32,
        len: u32,
        imm: Option<u32>,
        callback: &mut Option<FrameCallback>,
    ) -> Result<()> {
        let Some(gen) = self.slab.loan(slot) else {
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
                    gen,
                    len,
                    imm,
                });
            self.pull_cv.notify_one();
            return Ok(());
        };
        let frame = Frame {
            core: Arc::clone(self),
            slot,
            gen,
            len,
            imm,
            armed: true,
        };
        if catch_unwind(AssertUnwindSafe(|| cb(frame))).is_err() {
            bump(&self.counters.callback_panics, 1);
            log::error!("frame callback panicked (slot={slot}); frame released");
        }
        Ok(())
    }
}
