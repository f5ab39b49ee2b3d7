//! The receive slab: `rx_queue_depth` slots the NIC (verbs) or the soft
//! backend writes and consumers read in place, and its loan table. Memory
//! shared with the NIC and the kernel, hence the one `unsafe` file of the
//! core: the slab hands out slot memory only under the loan discipline kept
//! here, so every other module reads and writes slots through safe methods
//! (the soft backend's receive path takes raw ranges through
//! [`Slab::receive_region`], which refuses loaned slots).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, ErrorKind, Result};

/// Slab alignment: page size, as the NIC and rogue expect.
pub const SLAB_ALIGN: usize = 4096;

/// Loans are numbered by *serials*: 48 bits, so that a C token holds serial
/// and slot in 64 bits (see `frame.rs`). Every loan of the process, of any
/// server, has its own serial, never reused: a token of another server, or
/// of an earlier loan of the same slot, names a serial no live loan carries,
/// so the loan table refuses it (not "probably": no two loans ever share
/// one). Serials run out after 2^48 loans in one process (about 325 days at
/// 10 million frames a second); loans are refused then (`Slab::loan`).
pub(crate) const SERIAL_LIMIT: u64 = 1 << 48;
/// Serials go to a slab in blocks of this many (one atomic operation on the
/// process-wide counter per block, not per loan), each block to one slab.
const BLOCK: u64 = 256;
/// The process's next block of serials (serial = block * BLOCK + i). Block 0
/// is never handed out, so no serial (and no token) is 0.
static NEXT_BLOCK: AtomicU64 = AtomicU64::new(1);
/// Loan state bits: the slot is on loan...
const LOANED: u64 = 1;
/// ... and that loan was handed to C as a token.
const TOKENED: u64 = 2;

/// A slot's loan state word.
fn state(serial: u64, bits: u64) -> u64 {
    (serial << 2) | bits
}

/// `rx_queue_depth` slots of `slot_size` bytes in one page-aligned, zeroed
/// allocation, plus a per-slot loan state `serial << 2 | tokened << 1 |
/// loaned`.
///
/// A slot is either *owned by the receiver* (posted to the NIC, or waiting to
/// be re-posted) or *loaned* to a consumer under a serial (48 bits, never 0,
/// unique in the process, see [`SERIAL_LIMIT`]: it travels in a C release
/// token). A loan is held either by
/// a Rust [`Frame`](super::Frame) or, once handed to C, by a *token*
/// ([`Slab::to_token`]); each kind of release ends only its own kind of loan,
/// so a token can never release a loan a `Frame` still holds. Only a loaned
/// slot may be read through [`Slab::loaned`]; only a slot that is not loaned
/// may be written through [`Slab::write_slot`].
pub(crate) struct Slab {
    mem: NonNull<u8>,
    layout: Layout,
    slot_size: u32,
    slots: u32,
    state: Box<[AtomicU64]>,
    /// The next serial of this slab's block, and the block's end (equal: no
    /// block yet, or used up). Written by the loaning thread only.
    next_serial: AtomicU64,
    block_end: AtomicU64,
    /// Where blocks come from: [`NEXT_BLOCK`] (a test's own counter to
    /// force the end of the serial space).
    blocks: &'static AtomicU64,
}

// SAFETY: the slab is plain memory; concurrent access is governed by the loan
// states (atomics): readers only see loaned slots, the single writer (the
// receive thread or the NIC) only slots that are not loaned.
unsafe impl Send for Slab {}
// SAFETY: as above; every method takes &self and synchronises through `state`.
unsafe impl Sync for Slab {}

impl Slab {
    /// Allocates `slots * slot_size` zeroed bytes, page aligned.
    pub fn new(slot_size: u32, slots: u32) -> Result<Slab> {
        let bytes = slot_size as usize * slots as usize;
        if bytes == 0 {
            return Err(Error::invalid("slab size must be non-zero"));
        }
        let rounded = bytes.div_ceil(SLAB_ALIGN) * SLAB_ALIGN;
        let layout = Layout::from_size_align(rounded, SLAB_ALIGN)
            .map_err(|e| Error::invalid(format!("slab layout {rounded} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size (checked above).
        let ptr = unsafe { alloc_zeroed(layout) };
        let mem = NonNull::new(ptr).ok_or_else(|| {
            Error::new(
                ErrorKind::NoMemory,
                format!("Failed to allocate RX slab ({bytes} bytes)"),
            )
        })?;
        let state = (0..slots).map(|_| AtomicU64::new(0)).collect();
        Ok(Slab {
            mem,
            layout,
            slot_size,
            slots,
            state,
            next_serial: AtomicU64::new(0),
            block_end: AtomicU64::new(0),
            blocks: &NEXT_BLOCK,
        })
    }

    /// Bytes per slot.
    pub fn slot_size(&self) -> u32 {
        self.slot_size
    }
    /// Number of slots.
    pub fn slots(&self) -> u32 {
        self.slots
    }
    /// Length of the registered region: `slots * slot_size`.
    pub fn len(&self) -> u64 {
        self.slot_size as u64 * self.slots as u64
    }
    /// Virtual address of the slab (the MR address).
    pub fn base_addr(&self) -> u64 {
        self.mem.as_ptr() as u64
    }
    /// Raw base pointer, for registering the region with the NIC.
    #[cfg_attr(not(feature = "verbs"), allow(dead_code))]
    pub fn base_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    /// Marks the receiver-owned `slot` loaned (to a `Frame`); returns the
    /// loan's serial, or `None` if the slot is out of range or already
    /// loaned, or the process's serials are used up
    /// ([`Slab::serials_exhausted`]). Receive thread only.
    pub fn loan(&self, slot: u32) -> Option<u64> {
        let st = self.state.get(slot as usize)?;
        let cur = st.load(Ordering::Acquire);
        if cur & LOANED != 0 {
            return None;
        }
        let serial = self.next_serial()?;
        // A plain store, no compare-exchange: only the receive thread loans,
        // and while a slot is receiver-owned no release can succeed on it
        // (a release CAS expects the loaned state of its own serial).
        st.store(state(serial, LOANED), Ordering::Release);
        Some(serial)
    }

    /// The next serial: from this slab's block, or a new block (`None` once
    /// the process's serials are used up). One thread loans at a time, so
    /// plain loads and stores of the cursor suffice.
    fn next_serial(&self) -> Option<u64> {
        let mut s = self.next_serial.load(Ordering::Relaxed);
        if s == self.block_end.load(Ordering::Relaxed) {
            let block = self
                .blocks
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                    (b < SERIAL_LIMIT / BLOCK).then_some(b + 1)
                })
                .ok()?;
            s = block * BLOCK;
            self.block_end.store(s + BLOCK, Ordering::Relaxed);
        }
        self.next_serial.store(s + 1, Ordering::Relaxed);
        Some(s)
    }

    /// Moves this slab's serials on as `n` loans would (a test forcing
    /// what would take hours of traffic).
    #[cfg(test)]
    pub fn skip_loans(&self, n: u64) {
        let blocks = n.div_ceil(BLOCK).max(1);
        let last = self.blocks.fetch_add(blocks, Ordering::Relaxed) + blocks - 1;
        self.next_serial.store(last * BLOCK, Ordering::Relaxed);
        self.block_end.store((last + 1) * BLOCK, Ordering::Relaxed);
    }

    /// True once this slab can make no more loans: the process handed out
    /// all [`SERIAL_LIMIT`] serials (and this slab's block is used up).
    pub fn serials_exhausted(&self) -> bool {
        self.next_serial.load(Ordering::Relaxed) == self.block_end.load(Ordering::Relaxed)
            && self.blocks.load(Ordering::Relaxed) >= SERIAL_LIMIT / BLOCK
    }

    /// One compare-exchange of `slot`'s state from `from` to `to`.
    fn swap_state(&self, slot: u32, from: u64, to: u64) -> bool {
        self.state.get(slot as usize).is_some_and(|st| {
            st.compare_exchange(from, to, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        })
    }

    /// Ends a `Frame`'s loan `(slot, serial)`; false if the slot is not
    /// loaned to a frame under that serial (released, or handed to a token).
    pub fn release(&self, slot: u32, serial: u64) -> bool {
        self.swap_state(slot, state(serial, LOANED), state(serial, 0))
    }

    /// Hands a `Frame`'s loan `(slot, serial)` to a C token; false if it is
    /// not such a loan.
    pub fn to_token(&self, slot: u32, serial: u64) -> bool {
        self.swap_state(slot, state(serial, LOANED), state(serial, LOANED | TOKENED))
    }

    /// Ends a token's loan `(slot, serial)`; false unless that loan was
    /// handed out as a token ([`Slab::to_token`]) and not yet released.
    pub fn release_token(&self, slot: u32, serial: u64) -> bool {
        self.swap_state(slot, state(serial, LOANED | TOKENED), state(serial, 0))
    }

    /// True while `(slot, serial)` is on loan (to a frame or a token).
    pub fn is_loaned(&self, slot: u32, serial: u64) -> bool {
        self.state.get(slot as usize).is_some_and(|st| {
            let s = st.load(Ordering::Acquire);
            s & LOANED != 0 && s >> 2 == serial
        })
    }

    /// Number of slots currently on loan.
    pub fn loans_outstanding(&self) -> u32 {
        self.state
            .iter()
            .filter(|s| s.load(Ordering::Relaxed) & LOANED != 0)
            .count() as u32
    }

    /// The first `len` bytes of loaned slot `(slot, serial)`, or `None` if
    /// that loan is not live or `len` exceeds the slot.
    pub fn loaned(&self, slot: u32, serial: u64, len: u32) -> Option<&[u8]> {
        if len > self.slot_size || !self.is_loaned(slot, serial) {
            return None;
        }
        // SAFETY: slot < slots (is_loaned checked the index) and len <= slot_size,
        // so the range lies inside the allocation. The slot is loaned: the NIC
        // and the receive thread do not write it until the loan is released, and
        // the loan is released only by consuming the `Frame` (or token) that
        // borrows this slice.
        Some(unsafe {
            std::slice::from_raw_parts(
                self.mem
                    .as_ptr()
                    .add(slot as usize * self.slot_size as usize),
                len as usize,
            )
        })
    }

    /// Runs `f` on the whole of receiver-owned `slot` (the soft backend's copy
    /// from the socket). Returns `None` if the slot is out of range or loaned.
    /// Only the receive thread calls this, so there is a single writer.
    pub fn write_slot<R>(&self, slot: u32, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let st = self.state.get(slot as usize)?;
        if st.load(Ordering::Acquire) & LOANED != 0 {
            return None;
        }
        // SAFETY: slot is in range; it is not loaned, so no consumer holds a
        // slice of it, and the receive thread is its only writer.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                self.mem
                    .as_ptr()
                    .add(slot as usize * self.slot_size as usize),
                self.slot_size as usize,
            )
        };
        Some(f(buf))
    }
}

impl Slab {
    /// A pointer to `len` bytes at `offset` inside receiver-owned `slot`, for
    /// the kernel to receive into (the soft backend's scatter receive), or
    /// `None` if the range leaves the slot or the slot is loaned. Only the
    /// receive thread calls this, and it uses the pointer before it loans the
    /// slot, so the kernel is the region's single writer meanwhile.
    pub fn receive_region(&self, slot: u32, offset: u32, len: u32) -> Option<NonNull<u8>> {
        let st = self.state.get(slot as usize)?;
        if offset.checked_add(len)? > self.slot_size || st.load(Ordering::Acquire) & LOANED != 0 {
            return None;
        }
        let at = slot as usize * self.slot_size as usize + offset as usize;
        // SAFETY: slot < slots and offset + len <= slot_size, so `at` is inside
        // the allocation (or one past it for len 0 at the very end).
        NonNull::new(unsafe { self.mem.as_ptr().add(at) })
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with exactly this layout, freed once.
        unsafe { dealloc(self.mem.as_ptr(), self.layout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slab_geometry_and_alignment() {
        let s = Slab::new(9000, 3).unwrap();
        assert_eq!(s.base_addr() % SLAB_ALIGN as u64, 0);
        assert_eq!(s.len(), 27000);

        assert!(Slab::new(0, 3).is_err());
    }

    #[test]
    fn loan_release_generations() {
        let s = Slab::new(64, 2).unwrap();
        s.write_slot(1, |b| b[..3].copy_from_slice(b"abc")).unwrap();
        let g1 = s.loan(1).unwrap();
        assert_eq!(s.loan(1), None, "double loan refused");
        assert!(s.write_slot(1, |_| ()).is_none(), "no writes while loaned");
        assert_eq!(s.loaned(1, g1, 3).unwrap(), b"abc");
        assert!(s.loaned(1, g1, 65).is_none());
        assert!(s.loaned(1, g1 + 1, 3).is_none());
        assert_eq!(s.loans_outstanding(), 1);
        assert!(!s.release(1, g1 + 1), "wrong generation");
        assert!(s.release(1, g1));
        assert!(!s.release(1, g1), "double release");
        assert!(s.loaned(1, g1, 3).is_none());
        let g2 = s.loan(1).unwrap();
        assert_ne!(g1, g2);
        assert!(!s.release(1, g1), "stale token");
        assert!(!s.release(7, 1), "out of range");
        assert_eq!(s.loan(7), None);
        assert_eq!(s.loans_outstanding(), 1);
    }

    #[test]
    fn a_token_ends_only_a_loan_handed_out_as_a_token() {
        let s = Slab::new(64, 2).unwrap();
        let g = s.loan(0).unwrap();
        assert!(!s.release_token(0, g), "a frame's loan is no token's");
        assert!(s.is_loaned(0, g));
        assert!(s.to_token(0, g));
        assert!(!s.to_token(0, g), "handed out once");
        assert!(!s.release(0, g), "a token's loan is no frame's");
        assert!(
            s.loaned(0, g, 8).is_some(),
            "still readable through the token"
        );
        assert!(s.release_token(0, g));
        assert!(!s.release_token(0, g), "released once");
        assert_eq!(s.loans_outstanding(), 0);
    }

    /// A slab drawing serials from its own counter, `left` blocks before
    /// the end of the serial space.
    fn slab_near_the_end(slots: u32, left: u64) -> Slab {
        let mut s = Slab::new(64, slots).unwrap();
        s.blocks = Box::leak(Box::new(AtomicU64::new(SERIAL_LIMIT / BLOCK - left)));
        s
    }

    #[test]
    fn serials_never_repeat_and_run_out_instead_of_wrapping() {
        // Issue 38 finding 5: 24-bit generations wrapped after 2^24 loans of
        // a slot, and a stale token's loan came back. Serials are unique in
        // the process: at the end of their space loans are refused.
        let s = slab_near_the_end(1, 1);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..BLOCK {
            let serial = s.loan(0).expect("serials left");
            assert!(serial != 0 && serial < SERIAL_LIMIT);
            assert!(seen.insert(serial), "serial {serial} repeated");
            assert!(s.release(0, serial));
            assert!(!s.serials_exhausted() || seen.len() as u64 == BLOCK);
        }
        assert!(s.serials_exhausted());
        assert_eq!(
            s.loan(0),
            None,
            "no serial left: no loan (never a reused one)"
        );
        assert_eq!(s.loans_outstanding(), 0);
    }

    #[test]
    fn two_slabs_never_share_a_serial() {
        let (a, b) = (Slab::new(64, 2).unwrap(), Slab::new(64, 2).unwrap());
        let (mut sa, mut sb) = (Vec::new(), Vec::new());
        for _ in 0..3 * BLOCK {
            sa.push(a.loan(0).unwrap());
            assert!(a.release(0, *sa.last().unwrap()));
            sb.push(b.loan(0).unwrap());
            assert!(b.release(0, *sb.last().unwrap()));
        }
        let all: std::collections::HashSet<u64> = sa.iter().chain(&sb).copied().collect();
        assert_eq!(all.len(), sa.len() + sb.len());
        // And a loan of one is never the other's.
        let g = a.loan(1).unwrap();
        assert!(!b.is_loaned(1, g));
    }
}
