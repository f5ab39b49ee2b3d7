//! Model check (loom) of the release path racing the receive thread's park
//! and `stop()`: every interleaving the memory model allows, not the ones a
//! test run happens to hit.
//!
//! This is a model of `src/server/thread.rs` and `slab.rs`, statement for
//! statement, on loom's atomics: the loan table's CAS (`Slab::loan` /
//! `Slab::release`), the release queue (as crossbeam's ArrayQueue does it:
//! a SeqCst compare-exchange on the tail, a Release store of the slot's
//! stamp, SeqCst loads of head and tail in `is_empty`; a lock there would
//! order the two sides by itself and hide a missing fence), the `parked`
//! flag with its SeqCst fences, the eventfd (a counter and a condvar: signal
//! adds, drain clears, block waits for non-zero) and `stopping`; and the
//! receive thread's own release list (`server/release.rs`: a frame released
//! inside the callback goes on a thread-private list, no ring, no fence, no
//! wake; the loop takes it with the ring before it polls or parks, and
//! leaves what is on it on the ring when it ends). Change it with the code
//! it models.
//!
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_release`
//!
//! Bounded: at most 3 preemptions per execution (loom's recommended bound;
//! the races here need 1 or 2), so the runs end in seconds.
#![cfg(loom)]

use loom::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// The eventfd: readable while its counter is non-zero.
struct EventFd {
    count: Mutex<u64>,
    cv: Condvar,
}

impl EventFd {
    fn signal(&self) {
        *self.count.lock().unwrap() += 1;
        self.cv.notify_all();
    }
    fn drain(&self) {
        *self.count.lock().unwrap() = 0;
    }
    /// `Backend::block`: poll() on the completion channel and the eventfd;
    /// the model has no completions, so it waits for the eventfd.
    fn block(&self) {
        let mut c = self.count.lock().unwrap();
        while *c == 0 {
            c = self.cv.wait(c).unwrap();
        }
    }
}

/// The release queue's shape as ArrayQueue has it, with one consumer (the
/// receive thread; crossbeam's pop is multi-consumer, ours has one).
struct Queue {
    head: AtomicU64,
    tail: AtomicU64,
    /// slot + 1 once written; 0 before.
    stamps: Vec<AtomicU64>,
}

impl Queue {
    fn new(cap: usize) -> Queue {
        Queue {
            head: AtomicU64::new(0),
            tail: AtomicU64::new(0),
            stamps: (0..cap).map(|_| AtomicU64::new(0)).collect(),
        }
    }
    fn push(&self, slot: u32) {
        let mut t = self.tail.load(Ordering::Relaxed);
        loop {
            match self
                .tail
                .compare_exchange_weak(t, t + 1, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => t = now,
            }
        }
        self.stamps[t as usize].store(slot as u64 + 1, Ordering::Release);
    }
    fn pop(&self) -> Option<u32> {
        let h = self.head.load(Ordering::Relaxed);
        if h == self.tail.load(Ordering::Acquire) {
            return None;
        }
        loop {
            match self.stamps[h as usize].load(Ordering::Acquire) {
                0 => thread::yield_now(), // claimed, not written yet
                v => {
                    self.head.store(h + 1, Ordering::Release);
                    return Some((v - 1) as u32);
                }
            }
        }
    }
    fn is_empty(&self) -> bool {
        let head = self.head.load(Ordering::SeqCst);
        let tail = self.tail.load(Ordering::SeqCst);
        head == tail
    }
    fn remaining(&self) -> Vec<u32> {
        let (h, t) = (
            self.head.load(Ordering::Acquire),
            self.tail.load(Ordering::Acquire),
        );
        (h..t)
            .map(|i| self.stamps[i as usize].load(Ordering::Acquire) as u32 - 1)
            .collect()
    }
}

struct Core {
    /// Slab::state, frame loans only (a token's loan differs by one bit
    /// that this model's paths never set): generation << 1 | loaned.
    loans: Vec<AtomicU64>,
    releases: Queue,
    wake: EventFd,
    parked: AtomicBool,
    stopping: AtomicBool,
}

impl Core {
    fn new(slots: usize) -> Core {
        Core {
            loans: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            releases: Queue::new(4),
            wake: EventFd {
                count: Mutex::new(0),
                cv: Condvar::new(),
            },
            parked: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        }
    }

    /// Slab::loan (on the receive thread, at delivery: a plain store).
    fn loan(&self, slot: u32) -> Option<u32> {
        let st = &self.loans[slot as usize];
        let cur = st.load(Ordering::Acquire);
        if cur & 1 == 1 {
            return None;
        }
        let gen = ((cur >> 1) as u32).wrapping_add(1).max(1);
        st.store(((gen as u64) << 1) | 1, Ordering::Release);
        Some(gen)
    }

    /// ServerCore::release_loan from any thread but the receive thread's
    /// callback (`end_loan`, then `queue_remote`).
    fn release(&self, slot: u32, gen: u32) -> bool {
        self.release_on(slot, gen, None)
    }

    /// ServerCore::release_loan / release_frame: `local` is the receive
    /// thread's own list when called on it (`push_local` succeeds), None
    /// elsewhere.
    fn release_on(&self, slot: u32, gen: u32, local: Option<&mut Vec<u32>>) -> bool {
        let ok = self.loans[slot as usize]
            .compare_exchange(
                ((gen as u64) << 1) | 1,
                (gen as u64) << 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if !ok {
            return false;
        }
        if let Some(local) = local {
            local.push(slot);
            return true;
        }
        self.queue_remote(slot);
        true
    }

    /// ServerCore::queue_remote.
    fn queue_remote(&self, slot: u32) {
        self.releases.push(slot);
        fence(Ordering::SeqCst);
        if self.parked.load(Ordering::SeqCst) {
            self.wake.signal();
        }
    }

    /// ServerCore::stop's signalling half (the join is the test's).
    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wake.signal();
    }

    /// ServerCore::receive_loop with spin 0 and no completions: re-post
    /// what was released, park when idle. Returns the slots it re-posted;
    /// ends at stop, or once `until` slots were re-posted.
    fn receive_loop(&self, until: usize) -> Vec<u32> {
        self.receive_loop_with(until, Vec::new(), |_, _, _, _| {})
    }

    /// ServerCore::receive_loop (spin 0): `completions` are the slots the
    /// backend completes, one per poll; each is loaned (`deliver`) and
    /// handed to `callback` with the thread's own release list. The list
    /// is taken with the ring (`repost_released`), and left on the ring
    /// when the loop ends (`OwnThread::drop`).
    fn receive_loop_with(
        &self,
        until: usize,
        mut completions: Vec<u32>,
        mut callback: impl FnMut(&Core, u32, u32, &mut Vec<u32>),
    ) -> Vec<u32> {
        let mut local = Vec::new();
        let mut reposted = Vec::new();
        while !self.stopping.load(Ordering::Acquire) {
            if !self.releases.is_empty() {
                while let Some(s) = self.releases.pop() {
                    reposted.push(s);
                }
            }
            reposted.append(&mut local);
            if reposted.len() >= until {
                break;
            }
            if let Some(slot) = completions.pop() {
                // dispatch: no callback starts after stop.
                if self.stopping.load(Ordering::Acquire) {
                    break;
                }
                let gen = self.loan(slot).unwrap();
                callback(self, slot, gen, &mut local);
                continue;
            }
            self.parked.store(true, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if !self.releases.is_empty() || self.stopping.load(Ordering::SeqCst) {
                self.parked.store(false, Ordering::SeqCst);
                continue;
            }
            self.wake.block();
            self.parked.store(false, Ordering::SeqCst);
            self.wake.drain();
        }
        for slot in local {
            self.queue_remote(slot);
        }
        reposted
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// No lost wake-up: a release from another thread always reaches a receive
/// thread that is parking (else the model deadlocks and loom says so).
#[test]
fn a_release_always_wakes_the_parking_receive_thread() {
    model(|| {
        let core = Arc::new(Core::new(2));
        let g0 = core.loan(0).unwrap();
        let g1 = core.loan(1).unwrap();
        let rx = {
            let core = core.clone();
            thread::spawn(move || core.receive_loop(2))
        };
        let other = {
            let core = core.clone();
            thread::spawn(move || assert!(core.release(1, g1)))
        };
        assert!(core.release(0, g0));
        other.join().unwrap();
        let mut got = rx.join().unwrap();
        got.sort();
        assert_eq!(got, vec![0, 1]);
    });
}

/// A release racing stop(): the thread always ends, and the slot is either
/// re-posted by it or still queued for the next owner: once, never lost. The
/// consumer's handle keeps the core alive past the owner's drop.
#[test]
fn a_release_racing_stop_ends_the_thread_and_keeps_the_slot_once() {
    model(|| {
        let core = Arc::new(Core::new(1));
        let gen = core.loan(0).unwrap();
        let rx = {
            let core = core.clone();
            thread::spawn(move || core.receive_loop(usize::MAX))
        };
        let consumer = {
            let core = core.clone();
            thread::spawn(move || assert!(core.release(0, gen)))
        };
        core.stop();
        let reposted = rx.join().unwrap();
        let owner = core.clone();
        drop(core); // the server handle goes; the consumer may still be releasing
        consumer.join().unwrap();
        let queued = owner.releases.remaining();
        let mut all = reposted;
        all.extend(queued);
        assert_eq!(all, vec![0], "the released slot, exactly once");
        assert_eq!(owner.loans[0].load(Ordering::Acquire), (gen as u64) << 1);
    });
}

/// A token released twice, from two threads at once: one release wins, the
/// slot is queued once.
#[test]
fn a_double_release_queues_the_slot_once() {
    model(|| {
        let core = Arc::new(Core::new(1));
        let gen = core.loan(0).unwrap();
        let t = {
            let core = core.clone();
            thread::spawn(move || core.release(0, gen))
        };
        let here = core.release(0, gen);
        let there = t.join().unwrap();
        assert!(here ^ there, "exactly one release succeeds");
        assert_eq!(core.releases.remaining(), vec![0]);
        // The next loan of the slot gets a new generation: the old token is dead.
        let next = core.loan(0).unwrap();
        assert_ne!(next, gen);
        assert!(!core.release(0, gen));
    });
}

/// A frame released inside the callback takes the local list (no fence, no
/// wake) while another thread releases a held frame through the ring: the
/// loop re-posts both, each once, and never parks on a released slot (it
/// would deadlock: loom reports it).
#[test]
fn a_release_inside_the_callback_and_one_from_another_thread_are_both_reposted() {
    model(|| {
        let core = Arc::new(Core::new(2));
        let g1 = core.loan(1).unwrap();
        let rx = {
            let core = core.clone();
            thread::spawn(move || {
                core.receive_loop_with(2, vec![0], |core, slot, gen, local| {
                    assert!(core.release_on(slot, gen, Some(local)));
                })
            })
        };
        assert!(core.release(1, g1));
        let mut got = rx.join().unwrap();
        got.sort();
        assert_eq!(got, vec![0, 1]);
        assert!(core.releases.remaining().is_empty());
    });
}

/// A forged token (the live loan's slot and generation) released from
/// another thread races the callback's own release: one wins, the slot is
/// re-posted once.
#[test]
fn a_forged_release_racing_the_callbacks_release_wins_once() {
    model(|| {
        let core = Arc::new(Core::new(1));
        let won = Arc::new(AtomicU64::new(0));
        let rx = {
            let (core, won) = (core.clone(), won.clone());
            thread::spawn(move || {
                core.receive_loop_with(1, vec![0], |core, slot, gen, local| {
                    if core.release_on(slot, gen, Some(local)) {
                        won.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
        };
        // The first loan of slot 0 has generation 1: a guessable token.
        if core.release(0, 1) {
            won.fetch_add(1, Ordering::Relaxed);
        }
        // (A forged release before the loan fails: the callback's wins.)
        let got = rx.join().unwrap();
        assert_eq!(won.load(Ordering::Relaxed), 1, "exactly one release wins");
        let mut all = got;
        all.extend(core.releases.remaining());
        assert_eq!(all, vec![0], "re-posted (or queued) once");
    });
}

/// stop() races a frame released inside the callback: the thread ends, and
/// the slot is re-posted or left on the ring for the next owner, once
/// (without the hand-over at the end of the loop it would be lost).
#[test]
fn a_release_inside_the_callback_racing_stop_keeps_the_slot_once() {
    model(|| {
        let core = Arc::new(Core::new(1));
        let rx = {
            let core = core.clone();
            thread::spawn(move || {
                core.receive_loop_with(usize::MAX, vec![0], |core, slot, gen, local| {
                    assert!(core.release_on(slot, gen, Some(local)));
                })
            })
        };
        core.stop();
        let mut all = rx.join().unwrap();
        all.extend(core.releases.remaining());
        let delivered = core.loans[0].load(Ordering::Acquire) != 0;
        let want: Vec<u32> = if delivered { vec![0] } else { vec![] };
        assert_eq!(all, want, "the released slot, exactly once");
        if delivered {
            assert_eq!(core.loans[0].load(Ordering::Acquire), 1 << 1, "released");
        }
    });
}
