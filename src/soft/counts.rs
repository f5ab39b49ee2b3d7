//! The soft driver's counts and their publication: what the driver counts
//! itself ([`DriverCounts`]), the kernel's socket drops, and both with the
//! responder's protocol counts stored into the shared [`SoftCounters`]
//! after each batch.

use std::sync::atomic::{AtomicU64, Ordering};

use super::responder::ResponderStats;
use super::SoftBackend;
use crate::server::SoftCounters;

/// The driver's own counts (the responder keeps the protocol ones); both
/// are published to the shared [`SoftCounters`] after each batch.
#[derive(Debug, Default)]
pub(super) struct DriverCounts {
    pub(super) packets_rx: u64,
    pub(super) packets_tx: u64,
    pub(super) foreign: u64,
    pub(super) malformed: u64,
    pub(super) icrc_errors: u64,
    pub(super) icrc_unchecked: u64,
    pub(super) icrc_checked: u64,
    pub(super) payload_direct: u64,
    pub(super) payload_copied: u64,
}

impl DriverCounts {
    /// Stores these and the responder's counts `r` into `c`.
    pub(super) fn publish(&self, c: &SoftCounters, r: ResponderStats) {
        let o = self;
        let all: [(&AtomicU64, u64); 17] = [
            (&c.packets_rx, o.packets_rx),
            (&c.packets_tx, o.packets_tx),
            (&c.acks_tx, r.acks),
            (&c.rnr_naks_tx, r.rnr_naks),
            (&c.seq_naks_tx, r.seq_naks),
            (&c.invalid_naks_tx, r.invalid_naks),
            (&c.duplicates, r.duplicates),
            (&c.out_of_sequence, r.out_of_sequence),
            (&c.foreign_packets, o.foreign + r.wrong_qp),
            (&c.malformed, o.malformed),
            (&c.icrc_errors, o.icrc_errors),
            (&c.icrc_unchecked, o.icrc_unchecked),
            (&c.icrc_checked, o.icrc_checked),
            (&c.payload_direct, o.payload_direct),
            (&c.payload_copied, o.payload_copied),
            (&c.stale_packets, r.stale),
            (&c.peer_restarts, r.peer_restarts),
        ];
        for (counter, value) in all {
            counter.store(value, Ordering::Relaxed);
        }
    }
}

impl SoftBackend {
    /// Reads the kernel's drop count of the receiving socket into
    /// `socket_drops` (and notes when, and the packets received by then).
    pub(super) fn read_kernel_drops(&mut self) {
        self.idle_polls = 0;
        self.drops_read_at = (std::time::Instant::now(), self.rx.own.packets_rx);
        let drops = self.io.kernel_drops();
        let before = self.counters.socket_drops.swap(drops, Ordering::Relaxed);
        if drops > before {
            log::debug!(
                "{} packets dropped by the kernel (socket buffer full): the receive thread fell behind",
                drops - before
            );
        }
    }
}
