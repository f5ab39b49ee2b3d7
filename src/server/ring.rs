//! A bounded lock-free multi-producer queue of slot indices (Vyukov's bounded
//! MPMC design, values held in atomics): consumers release loans from any
//! thread without blocking, the receive thread drains them in batches.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

struct Cell {
    seq: AtomicUsize,
    val: AtomicU32,
}

/// Fixed-capacity queue; `push` fails only when full.
pub(crate) struct SlotRing {
    cells: Box<[Cell]>,
    mask: usize,
    head: AtomicUsize,
    tail: AtomicUsize,
}

impl SlotRing {
    /// A queue holding at least `min_capacity` values.
    pub fn new(min_capacity: usize) -> Self {
        let cap = min_capacity.max(2).next_power_of_two();
        let cells = (0..cap)
            .map(|i| Cell {
                seq: AtomicUsize::new(i),
                val: AtomicU32::new(0),
            })
            .collect();
        SlotRing {
            cells,
            mask: cap - 1,
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    /// Appends `v`; false when the queue is full.
    pub fn push(&self, v: u32) -> bool {
        let mut pos = self.tail.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq as isize - pos as isize;
            if diff == 0 {
                match self.tail.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        cell.val.store(v, Ordering::Relaxed);
                        cell.seq.store(pos + 1, Ordering::Release);
                        return true;
                    }
                    Err(p) => pos = p,
                }
            } else if diff < 0 {
                return false;
            } else {
                pos = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// Removes the oldest value.
    pub fn pop(&self) -> Option<u32> {
        let mut pos = self.head.load(Ordering::Relaxed);
        loop {
            let cell = &self.cells[pos & self.mask];
            let seq = cell.seq.load(Ordering::Acquire);
            let diff = seq as isize - (pos + 1) as isize;
            if diff == 0 {
                match self.head.compare_exchange_weak(
                    pos,
                    pos + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        let v = cell.val.load(Ordering::Relaxed);
                        cell.seq.store(pos + self.mask + 1, Ordering::Release);
                        return Some(v);
                    }
                    Err(p) => pos = p,
                }
            } else if diff < 0 {
                return None;
            } else {
                pos = self.head.load(Ordering::Relaxed);
            }
        }
    }

    /// True when nothing is queued (a snapshot).
    pub fn is_empty(&self) -> bool {
        self.head.load(Ordering::SeqCst) == self.tail.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fifo_and_capacity() {
        let r = SlotRing::new(3);
        assert!(r.is_empty());
        for i in 0..4 {
            assert!(r.push(i));
        }
        assert!(!r.push(99), "full at capacity 4");
        assert_eq!(r.pop(), Some(0));
        assert!(r.push(4));
        let got: Vec<u32> = std::iter::from_fn(|| r.pop()).collect();
        assert_eq!(got, vec![1, 2, 3, 4]);
        assert!(r.is_empty());
    }

    #[test]
    fn concurrent_producers_lose_nothing() {
        let r = Arc::new(SlotRing::new(1024));
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u32 {
                        while !r.push(t * 1_000_000 + i) {
                            std::hint::spin_loop();
                        }
                    }
                })
            })
            .collect();
        let mut seen = [0u32; 4];
        let mut total = 0;
        while total < 40_000 {
            if let Some(v) = r.pop() {
                let (t, i) = ((v / 1_000_000) as usize, v % 1_000_000);
                assert_eq!(i, seen[t], "per-producer order kept");
                seen[t] += 1;
                total += 1;
            }
        }
        for t in threads {
            t.join().unwrap();
        }
        assert!(r.is_empty());
    }
}
