//! The release path: a loan ends (frame dropped, token released) on any
//! thread, at any time, and its slot goes back to the receive thread for
//! re-posting.
//!
//! Two ways back:
//! - **from any thread**: the release ring (crossbeam's ArrayQueue, lock-free),
//!   then a SeqCst fence and a look at `parked`, waking the receive thread if
//!   it blocks (no lost wake-up: `tests/loom_release.rs`);
//! - **on the core's own receive thread** (a frame released inside the frame
//!   callback, the common case): a plain `Vec` in a thread-local ([`Local`]),
//!   no ring, no fence, no wake: that thread is running, and its loop takes
//!   the list before it polls or parks again. A frame released there also
//!   hands its reference to the core back, so the next frame reuses it
//!   instead of cloning the `Arc` (two locked operations per frame saved).
//!
//! Either way the loan table's compare-exchange ([`Slab::release`]) ends the
//! loan first, so a release succeeds exactly once per loan, whatever the
//! thread.

use std::cell::RefCell;

use super::*;
use frame::Token;
use stats::bump;

/// What frames released on a receive thread leave for its loop: their
/// slots, and their references to the core. Set up by [`OwnThread`]; on any
/// other thread `core` is null and the lists stay empty.
struct Local {
    /// The core this thread receives for (null: none). The thread holds a
    /// reference to it while this is set, so the address names one live core.
    core: *const ServerCore,
    /// That core's count of releases made here.
    count: Option<Arc<AtomicU64>>,
    slots: Vec<u32>,
    cores: Vec<Arc<ServerCore>>,
}

thread_local! {
    static LOCAL: RefCell<Local> = const {
        RefCell::new(Local {
            core: std::ptr::null(),
            count: None,
            slots: Vec::new(),
            cores: Vec::new(),
        })
    };
}

/// Puts released `slot` of core `me` on this thread's local list if this is
/// that core's receive thread (then `keep`, the frame's reference, goes with
/// it, and the local release count moves). False elsewhere: the caller takes
/// the ring.
#[inline]
fn push_local(me: *const ServerCore, slot: u32, keep: &mut Option<Arc<ServerCore>>) -> bool {
    LOCAL
        .try_with(|l| {
            let Ok(mut l) = l.try_borrow_mut() else {
                return false;
            };
            let l = &mut *l;
            let Some(count) = &l.count else {
                return false;
            };
            if !std::ptr::eq(l.core, me) {
                return false;
            }
            bump(count, 1);
            l.slots.push(slot);
            if let Some(keep) = keep.take() {
                l.cores.push(keep);
            }
            true
        })
        .unwrap_or(false)
}

/// Marks the current thread as `core`'s receive thread while it lives: the
/// fast release path. Dropped (also on unwinding), it unmarks the thread
/// and puts the slots released on it and not yet taken on the release ring,
/// where the next owner finds them (released exactly once, never lost).
pub(super) struct OwnThread<'a> {
    core: &'a Arc<ServerCore>,
}

impl<'a> OwnThread<'a> {
    pub fn enter(core: &'a Arc<ServerCore>) -> OwnThread<'a> {
        let depth = core.slab.slots() as usize;
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            l.core = Arc::as_ptr(core);
            l.count = Some(Arc::clone(&core.local_releases));
            l.slots.reserve(depth);
            l.cores.reserve(depth);
        });
        OwnThread { core }
    }

    /// Moves the slots released on this thread to `slots` and their frames'
    /// references to `cores`.
    pub fn take(&self, slots: &mut Vec<u32>, cores: &mut Vec<Arc<ServerCore>>) {
        LOCAL.with(|l| {
            let mut l = l.borrow_mut();
            slots.append(&mut l.slots);
            cores.append(&mut l.cores);
        });
    }
}

impl Drop for OwnThread<'_> {
    fn drop(&mut self) {
        let left = LOCAL.try_with(|l| {
            let mut l = l.borrow_mut();
            l.core = std::ptr::null();
            let count = l.count.take();
            (
                std::mem::take(&mut l.slots),
                std::mem::take(&mut l.cores),
                count,
            )
        });
        // Outside the borrow (the ring's wake-up and the references' drops
        // run no frame code, but need no borrow either).
        if let Ok((slots, cores, count)) = left {
            for slot in slots {
                self.core.queue_remote(slot);
            }
            drop((cores, count));
        }
    }
}

impl ServerCore {
    /// Ends loan `(slot, serial)`: the loan table's compare-exchange, so one
    /// release wins.
    fn end_loan(&self, slot: u32, serial: u64) -> Result<()> {
        if self.slab.release(slot, serial) {
            return Ok(());
        }
        Err(self.invalid_release(format!(
            "frame loan (slot {slot}, serial {serial}) is unknown or already \
             released: release each frame exactly once"
        )))
    }

    /// A refused release: counted, and the error to return.
    fn invalid_release(&self, msg: String) -> Error {
        self.counters
            .invalid_releases
            .fetch_add(1, Ordering::Relaxed);
        Error::new(ErrorKind::UnknownToken, msg)
    }

    /// Queues released `slot` on the release ring for the receive thread,
    /// waking it if it is parked. Any thread. Never blocks.
    fn queue_remote(&self, slot: u32) {
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
    }

    /// Ends a frame's loan `(slot, serial)` (one queued for poll) and
    /// queues the slot for re-posting. Never blocks.
    pub(super) fn release_loan(&self, slot: u32, serial: u64) -> Result<()> {
        self.end_loan(slot, serial)?;
        self.requeue(slot);
        Ok(())
    }

    /// Queues a slot whose loan just ended for re-posting: on this core's
    /// receive thread its local list, elsewhere the release ring.
    fn requeue(&self, slot: u32) {
        if !push_local(self, slot, &mut None) {
            self.counters.releases.fetch_add(1, Ordering::Relaxed);
            self.queue_remote(slot);
        }
    }

    /// A dropped [`Frame`]'s release: ends the frame's loan and queues the
    /// slot; on the core's receive thread the frame's reference `core` is
    /// kept for the next frame. (A frame's loan is ended only by the frame,
    /// so this cannot fail.)
    pub(super) fn release_frame(core: Arc<ServerCore>, slot: u32, serial: u64) {
        if core.end_loan(slot, serial).is_err() {
            return;
        }
        let me = Arc::as_ptr(&core);
        let mut keep = Some(core);
        if push_local(me, slot, &mut keep) {
            return;
        }
        if let Some(core) = keep {
            core.counters.releases.fetch_add(1, Ordering::Relaxed);
            core.queue_remote(slot);
        }
    }

    /// Keeps `core`, a frame's reference, for the token the frame became
    /// ([`Frame::into_token`]): one per outstanding token, so the core
    /// outlives its handle while tokens are out.
    pub(super) fn keep_for_token(core: Arc<ServerCore>) {
        // At most one token per slot is outstanding and the queue holds one
        // per slot, so it is never full (and if it were, the reference would
        // only be dropped early: the caller's handle or frame holds another).
        let me = Arc::clone(&core);
        let kept = me.token_refs.push(core);
        debug_assert!(kept.is_ok(), "more tokens than slots");
    }

    /// Releases a token made by [`Frame::into_token`]: only a token whose
    /// loan this server handed out as a token and did not release yet (a
    /// token of another server, or a stale one, names a serial none of its
    /// loans carries), and gives back the reference `into_token` kept for
    /// it. On failure nothing was touched.
    pub(crate) fn release_token(&self, token: u64) -> Result<()> {
        let t = Token::decode(token).filter(|t| t.slot < self.slab.slots());
        let Some(t) = t else {
            return Err(self.invalid_release(format!(
                "release token {token:#x} is no token of this server (slot {} of {} slots): \
                 release each token with the server that gave it",
                token & 0xffff,
                self.slab.slots()
            )));
        };
        if !self.slab.release_token(t.slot, t.serial) {
            return Err(self.invalid_release(format!(
                "release token {token:#x} (slot {}, serial {}) is unknown, already released \
                 or another server's: release each frame exactly once, with the server that \
                 gave it",
                t.slot, t.serial
            )));
        }
        // The caller reached `self` through a reference of its own, so this
        // one is never the last.
        let kept = self.token_refs.pop();
        debug_assert!(kept.is_some(), "a token's reference was kept");
        self.requeue(t.slot);
        drop(kept);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{wait_until, Harness};
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn frames_released_in_the_callback_are_counted_at_once_and_reposted() {
        let h = Harness::new(4, 64);
        let core = h.core.clone();
        let (tx, rx) = mpsc::channel();
        h.core
            .set_frame_callback(move |f: Frame| {
                let before = core.stats();
                drop(f);
                let after = core.stats();
                let refs = Arc::strong_count(&core);
                tx.send((before.releases, after.releases, after.frames, refs))
                    .unwrap();
            })
            .unwrap();
        h.connect();
        for i in 0..50u32 {
            h.send(b"abc", i);
        }
        for i in 1..=50u64 {
            let (before, after, frames, refs) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(
                (before, after, frames),
                (i - 1, i, i),
                "exact inside the callback"
            );
            // handle + this callback + the receive thread + its handed-back
            // references (at most one per slot): reused, not piling up.
            assert!(refs <= 3 + 4, "{refs} references");
        }
        wait_until(|| h.core.stats().reposts == 50);
        let s = h.core.stats();
        assert_eq!((s.frames, s.releases, s.loans_outstanding), (50, 50, 0));
        h.core.stop();
    }

    #[test]
    fn a_frame_of_another_server_dropped_in_a_callback_goes_back_to_its_own() {
        let a = Harness::new(2, 64);
        let b = Harness::new(2, 64);
        let (tx, rx) = mpsc::channel::<Frame>();
        a.core
            .set_frame_callback(move |f| tx.send(f).unwrap())
            .unwrap();
        let (held_tx, held_rx) = mpsc::channel::<Frame>();
        let held = Mutex::new(held_rx);
        b.core
            .set_frame_callback(move |_f| {
                // B's receive thread drops a frame of A: A's ring, A's wake-up.
                drop(held.lock().unwrap().recv().unwrap());
            })
            .unwrap();
        a.connect();
        b.connect();
        for i in 0..6u32 {
            a.send(b"from a", i);
            let f = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            assert_eq!(
                f.immediate(),
                Some(i),
                "A keeps flowing: its slots come back"
            );
            held_tx.send(f).unwrap();
            b.send(b"from b", i);
            wait_until(|| a.core.stats().releases == i as u64 + 1);
        }
        wait_until(|| a.core.stats().reposts == 6 && b.core.stats().reposts == 6);
        assert_eq!(a.core.stats().loans_outstanding, 0);
        a.core.stop();
        b.core.stop();
    }

    #[test]
    fn a_frame_released_in_the_callback_after_stop_is_released_once() {
        let h = Harness::new(2, 64);
        let core = h.core.clone();
        h.core
            .set_frame_callback(move |f| {
                core.stop();
                drop(f);
            })
            .unwrap();
        h.connect();
        h.send(b"last", 1);
        wait_until(|| h.core.exited_reason().is_some());
        let s = h.core.stats();
        assert_eq!((s.frames, s.releases, s.loans_outstanding), (1, 1, 0));
        // Not re-posted (the transport is gone): left on the ring, once.
        assert_eq!(s.reposts, 0);
        assert_eq!(h.core.releases.len(), 1);
        // No reference left behind once the thread is gone.
        wait_until(|| Arc::strong_count(&h.core) == 1);
    }
}
