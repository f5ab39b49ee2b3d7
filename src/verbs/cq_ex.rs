//! The receive CQ as an extended CQ (`ibv_create_cq_ex`), for the NIC's
//! completion timestamps: where the device stamps completions (mlx5), each
//! frame's `rx_time_ns` is the NIC's stamp on the host clock
//! ([`super::nic_clock`]) instead of the host clock at poll.
//!
//! Which CQ the receive side gets (`ROCEV2_VERBS_CQ`):
//! - unset or `auto`: extended with timestamps when the device reports a
//!   completion timestamp mask, a clock rate and a readable clock; else the
//!   plain CQ (rxe: no timestamps);
//! - `extended`: extended always (with timestamps where the device gives
//!   them): runs the extended polling path on a device without timestamps,
//!   as the rxe VM tests do;
//! - `plain`: the plain CQ, frames stamped at poll.
//!
//! An extended CQ is polled with start/end_poll and its fields read
//! through the provider's readers, as verbs.h's inline functions do; each
//! completion is written into an `ibv_wc` so the backend judges both kinds
//! alike.

use std::ptr::NonNull;
use std::time::Instant;

use rdma_sys::*;

use super::nic_clock::{Anchor, NicClock, RESYNC};
use super::{dl, errno_text, VerbsDevice};
use crate::error::{Error, Result};
use crate::server::latency;

/// Empty polls between looks at the clock (a busy-polling receive thread
/// polls millions of times a second; a clock read on each would cost more
/// than the poll).
const IDLE_POLLS_PER_CLOCK: u32 = 1024;

/// The environment variable that picks the receive CQ.
pub(crate) const CQ_ENV: &str = "ROCEV2_VERBS_CQ";

/// What `ROCEV2_VERBS_CQ` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CqChoice {
    Auto,
    Extended,
    Plain,
}

impl CqChoice {
    /// From the variable's value (None: unset).
    pub fn parse(v: Option<&str>) -> Result<CqChoice> {
        match v.map(str::trim) {
            None | Some("") | Some("auto") => Ok(CqChoice::Auto),
            Some("extended") => Ok(CqChoice::Extended),
            Some("plain") => Ok(CqChoice::Plain),
            Some(other) => Err(Error::invalid(format!(
                "{CQ_ENV}={other:?} is not a receive CQ kind: use auto (the default: NIC \
                 completion timestamps where the device has them), extended or plain"
            ))),
        }
    }

    /// From the environment.
    pub fn from_env() -> Result<CqChoice> {
        CqChoice::parse(std::env::var(CQ_ENV).ok().as_deref())
    }
}

/// The device's completion clock: rate (kHz) and timestamp bits; None when
/// it stamps no completions.
pub(crate) fn device_clock(dev: &VerbsDevice) -> Option<(u64, u64)> {
    // SAFETY: ibv_device_attr_ex is plain data; zeroed is valid.
    let mut attr: ibv_device_attr_ex = unsafe { std::mem::zeroed() };
    // SAFETY: the device's context is live while dev is.
    let rc = unsafe { dl::query_device_ex(dev.api, dev.ctx, &mut attr) };
    (rc == 0 && attr.completion_timestamp_mask != 0 && attr.hca_core_clock != 0)
        .then_some((attr.hca_core_clock, attr.completion_timestamp_mask))
}

/// One reading of the NIC's clock between two host clock reads.
fn anchor(ctx: *mut ibv_context) -> Option<Anchor> {
    // SAFETY: ibv_values_ex is plain data; zeroed is valid.
    let mut v: ibv_values_ex = unsafe { std::mem::zeroed() };
    v.comp_mask = ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0;
    let before = latency::now_ns();
    // SAFETY: ctx is a live context (the CQ's device is held by the caller).
    let rc = unsafe { dl::query_rt_values_ex(ctx, &mut v) };
    let after = latency::now_ns();
    if rc != 0 || v.comp_mask & ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0 == 0 {
        return None;
    }
    // mlx5 puts the cycles in tv_nsec (tv_sec 0); others a real timespec.
    let raw = (v.raw_clock.tv_sec as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(v.raw_clock.tv_nsec as u64);
    Some(Anchor::between(before, raw, after))
}

/// An extended CQ's polling state. The CQ itself is owned (and destroyed)
/// by [`super::ibv::Cq`] through its `ibv_cq` view.
pub(crate) struct ExCq {
    raw: NonNull<ibv_cq_ex>,
    ctx: *mut ibv_context,
    clock: Option<NicClock>,
    synced: Instant,
    idle_polls: u32,
}

impl ExCq {
    /// An extended CQ of `depth` entries on `dev` as `choice` asks (None:
    /// a plain CQ is wanted or will do). An error only when `extended` was
    /// asked for and the provider has no extended CQs.
    pub fn create(
        dev: &VerbsDevice,
        depth: u32,
        channel: *mut ibv_comp_channel,
        choice: CqChoice,
    ) -> Result<Option<ExCq>> {
        if choice == CqChoice::Plain {
            return Ok(None);
        }
        let clock =
            device_clock(dev).and_then(|(khz, mask)| NicClock::new(khz, mask, anchor(dev.ctx)?));
        if clock.is_none() && choice == CqChoice::Auto {
            log::debug!(
                "receive CQ on '{}': the device stamps no completions (or its clock cannot be \
                 read): frames carry the host clock at poll",
                dev.name
            );
            return Ok(None);
        }
        let mut flags = ibv_create_cq_wc_flags::IBV_WC_EX_WITH_BYTE_LEN.0
            | ibv_create_cq_wc_flags::IBV_WC_EX_WITH_IMM.0;
        if clock.is_some() {
            flags |= ibv_create_cq_wc_flags::IBV_WC_EX_WITH_COMPLETION_TIMESTAMP.0;
        }
        // SAFETY: ibv_cq_init_attr_ex is plain data; zeroed is valid.
        let mut attr: ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.cqe = depth;
        attr.channel = channel;
        attr.wc_flags = flags as u64;
        // SAFETY: the context and the channel (if any) are live (caller).
        let raw = unsafe { dl::create_cq_ex(dev.ctx, &mut attr) };
        let Some(raw) = NonNull::new(raw) else {
            let why = errno_text();
            if choice == CqChoice::Extended {
                return Err(Error::device(format!(
                    "ibv_create_cq_ex (receive, {depth} entries) failed on '{}': {why}; unset \
                     {CQ_ENV} (or set it to plain) to use the plain CQ",
                    dev.name
                )));
            }
            log::warn!(
                "receive CQ on '{}': the device reports completion timestamps but \
                 ibv_create_cq_ex failed ({why}): frames carry the host clock at poll",
                dev.name
            );
            return Ok(None);
        };
        log::info!(
            "receive CQ on '{}': extended, {}",
            dev.name,
            match &clock {
                Some(_) => "frames carry the NIC's completion timestamps on the host clock",
                None => "the device stamps no completions: frames carry the host clock at poll",
            }
        );
        Ok(Some(ExCq {
            raw,
            ctx: dev.ctx,
            clock,
            synced: Instant::now(),
            idle_polls: 0,
        }))
    }

    /// The plain view of the CQ (verbs.h's `ibv_cq_ex_to_cq`: the extended
    /// CQ begins with the plain one's fields).
    pub fn as_cq(&self) -> NonNull<ibv_cq> {
        self.raw.cast()
    }

    /// Whether completions carry the NIC's timestamps.
    pub fn stamps(&self) -> bool {
        self.clock.is_some()
    }

    /// A poll found nothing: every [`IDLE_POLLS_PER_CLOCK`] such polls, a
    /// look at the clock, and a new anchor when the last is [`RESYNC`] old.
    pub fn idle(&mut self) {
        self.idle_polls += 1;
        if self.idle_polls >= IDLE_POLLS_PER_CLOCK {
            self.idle_polls = 0;
            self.resync_if_due(Instant::now());
        }
    }

    /// Takes a new clock anchor when the last is [`RESYNC`] old (`now`).
    fn resync_if_due(&mut self, now: Instant) {
        if let Some(c) = self.clock.as_mut() {
            if now.saturating_duration_since(self.synced) >= RESYNC {
                self.synced = now;
                if let Some(a) = anchor(self.ctx) {
                    c.resync(a);
                }
            }
        }
    }

    /// Polls up to `wcs.len()` completions into `wcs` and their receive
    /// times (host ns; 0 without timestamps) into `stamps`; returns how many.
    pub fn poll(&mut self, wcs: &mut [ibv_wc], stamps: &mut [u64]) -> Result<usize> {
        let cq = self.raw.as_ptr();
        let max = wcs.len().min(stamps.len());
        if max == 0 {
            return Ok(0);
        }
        // SAFETY: the CQ is live; its provider fills the ops at creation.
        let cqr = unsafe { &*cq };
        let (Some(start), Some(end)) = (cqr.start_poll, cqr.end_poll) else {
            return Err(Error::device("extended CQ without start_poll/end_poll"));
        };
        // One completion per start/end pair: providers disagree on what a
        // next_poll that finds nothing leaves behind (rxe's stores the
        // consumer index and unlocks, so an end_poll after it advances past
        // a completion never written and unlocks twice; mlx5's leaves both
        // to end_poll), while start_poll, the reads and end_poll mean the
        // same everywhere.
        let mut attr = ibv_poll_cq_attr { comp_mask: 0 };
        let mut n = 0;
        while n < max {
            // SAFETY: the CQ is live; attr is valid.
            match unsafe { start(cq, &mut attr) } {
                0 => {}
                libc::ENOENT => break,
                // (An error after some completions: those are returned, the
                // next poll meets the error again.)
                _ if n > 0 => break,
                e => {
                    return Err(Error::device(format!(
                        "polling the extended CQ failed: {}",
                        std::io::Error::from_raw_os_error(e)
                    )))
                }
            }
            // SAFETY: start_poll returned 0: a completion is current, and
            // end_poll closes the poll it opened.
            unsafe {
                self.read(cq, &mut wcs[n], &mut stamps[n]);
                end(cq);
            }
            n += 1;
        }
        Ok(n)
    }

    /// Reads the current completion into `wc` and `stamp`.
    ///
    /// # Safety
    /// `cq` must be live and in a poll with a current completion.
    unsafe fn read(&self, cq: *mut ibv_cq_ex, wc: &mut ibv_wc, stamp: &mut u64) {
        // SAFETY: cq is live (caller).
        let c = unsafe { &*cq };
        wc.wr_id = c.wr_id;
        wc.status = c.status;
        wc.wc_flags = 0;
        wc.byte_len = 0;
        wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
        *stamp = 0;
        if c.status != ibv_wc_status::IBV_WC_SUCCESS {
            // Only wr_id and status are defined for a failed completion.
            return;
        }
        // SAFETY (each reader): the provider's reader for this CQ, called on
        // its current completion (caller), as verbs.h's ibv_wc_read_* do;
        // each asked-for field was requested at creation.
        unsafe {
            if let Some(f) = c.read_opcode {
                wc.opcode = f(cq);
            }
            if let Some(f) = c.read_wc_flags {
                wc.wc_flags = f(cq);
            }
            if let Some(f) = c.read_byte_len {
                wc.byte_len = f(cq);
            }
            if wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                if let Some(f) = c.read_imm_data {
                    wc.imm_data_invalidated_rkey_union.imm_data = f(cq);
                }
            }
            if let (Some(clock), Some(f)) = (&self.clock, c.read_completion_ts) {
                *stamp = clock.host_ns(f(cq));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_the_receive_cq_and_a_wrong_value_says_the_choices() {
        assert_eq!(CqChoice::parse(None).unwrap(), CqChoice::Auto);
        assert_eq!(CqChoice::parse(Some("auto")).unwrap(), CqChoice::Auto);
        assert_eq!(
            CqChoice::parse(Some(" extended ")).unwrap(),
            CqChoice::Extended
        );
        assert_eq!(CqChoice::parse(Some("plain")).unwrap(), CqChoice::Plain);
        let e = CqChoice::parse(Some("fast")).unwrap_err();
        for needle in [CQ_ENV, "\"fast\"", "auto", "extended", "plain"] {
            assert!(e.message().contains(needle), "{needle}: {e}");
        }
    }
}
