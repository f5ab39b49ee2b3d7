//! Counters: every frame, byte, drop and protocol event, by cause.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($($(#[doc = $doc:literal])+ $name:ident,)*) => {
        /// Live counters (atomics), bumped by the server core and the backends.
        #[derive(Default)]
        pub(crate) struct Counters {
            $(pub $name: AtomicU64,)*
        }

        /// A snapshot of a server's counters. Fields marked *soft* are kept by
        /// the soft backend only and stay 0 on verbs, where the NIC does that
        /// work (see `ethtool -S` / the device's hw_counters).
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
        pub struct Stats {
            $($(#[doc = $doc])+ pub $name: u64,)*
            /// Slots on loan to consumers right now.
            pub loans_outstanding: u64,
        }

        impl Counters {
            pub fn snapshot(&self, loans_outstanding: u64) -> Stats {
                Stats {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    loans_outstanding,
                }
            }
        }
    };
}

counters! {
    /// Frames delivered to the consumer (callback or pull queue).
    frames,
    /// Payload bytes delivered.
    bytes,
    /// Loans released by the consumer.
    releases,
    /// Receive slots re-posted after release.
    reposts,
    /// Re-post calls (each re-posts a batch of slots).
    repost_batches,
    /// Times the receive thread blocked waiting for completions.
    parks,
    /// Completions with an error status (the slot is re-posted).
    completion_errors,
    /// Flush completions (the QP entered the error state; the thread ends).
    flush_errors,
    /// Completions with a zero or oversized length (dropped, slot re-posted).
    bad_length,
    /// Completions that were not a receive with immediate (dropped, slot re-posted).
    unexpected_opcode,
    /// Release calls with an unknown or already released token.
    invalid_releases,
    /// Frame callbacks that panicked (the frame is released, the thread goes on).
    callback_panics,
    /// *soft*: RoCEv2 packets received on the socket.
    packets_rx,
    /// *soft*: packets sent (ACKs and NAKs).
    packets_tx,
    /// *soft*: ACKs sent.
    acks_tx,
    /// *soft*: RNR NAKs sent (no free slot at a message start; the sender retries).
    rnr_naks_tx,
    /// *soft*: PSN sequence error NAKs sent (a gap: packets were lost).
    seq_naks_tx,
    /// *soft*: invalid request NAKs sent (bad opcode or length).
    invalid_naks_tx,
    /// *soft*: duplicate packets (re-ACKed, never re-delivered).
    duplicates,
    /// *soft*: packets ahead of the expected PSN (dropped; the sender goes back).
    out_of_sequence,
    /// *soft*: packets not for this QP or not from the configured FPGA address.
    foreign_packets,
    /// *soft*: packets too short or inconsistent to parse.
    malformed,
    /// *soft*: packets with a bad ICRC (dropped).
    icrc_errors,
    /// *soft*: packets whose ICRC could not be checked (no raw IP header).
    icrc_unchecked,
    /// *soft*: packets whose ICRC was verified (raw capture mode).
    icrc_checked,
    /// *soft*: packets whose payload the kernel wrote straight into the slot.
    payload_direct,
    /// *soft*: packets whose payload was copied into the slot afterwards (a
    /// missed landing guess: loss, reordering, a change of frame size).
    payload_copied,
    /// *soft*: packets the kernel dropped because the receive socket's buffer
    /// was full (the receive thread fell behind; the sender resends them).
    socket_drops,
}
