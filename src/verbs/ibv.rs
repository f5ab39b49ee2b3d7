//! Owners of the ibverbs objects the verbs backend and the verbs requester
//! (`emulator::verbs`) create: memory region, completion channel, completion
//! queue and RC queue pair. Each wrapper destroys its object once, in `Drop`,
//! and holds an `Arc` of the device so the context and protection domain
//! outlive it. A struct that owns several must declare them in reverse order
//! of creation (QP, CQ, channel, MR): Rust drops fields in declaration order.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::*;

use super::cq_ex::{CqChoice, ExCq};
use super::{dl, errno_text, VerbsDevice};
use crate::error::{Error, Result};
use crate::wire::MASK_24;

/// libibverbs' text for a work completion status.
pub(crate) fn wc_status_text(status: ibv_wc_status::Type) -> &'static str {
    // A completion comes from a CQ, so the library is loaded.
    let Some(api) = dl::loaded() else {
        return "unknown status";
    };
    // SAFETY: libibverbs returns a pointer to a static string for any value.
    unsafe { std::ffi::CStr::from_ptr((api.ibv_wc_status_str)(status)) }
        .to_str()
        .unwrap_or("unknown status")
}

/// A registered memory region.
pub(crate) struct Mr {
    raw: NonNull<ibv_mr>,
    dev: Arc<VerbsDevice>,
}

impl Mr {
    /// Registers `len` bytes at `addr` on the device's PD with `access` flags.
    ///
    /// # Safety
    /// `addr..addr + len` must stay allocated until this `Mr` is dropped.
    pub(crate) unsafe fn register(
        dev: &Arc<VerbsDevice>,
        addr: *mut u8,
        len: usize,
        access: u32,
        what: &str,
    ) -> Result<Mr> {
        // SAFETY: pd is live (the device is); the caller vouches for the memory.
        let raw = unsafe { (dev.api.ibv_reg_mr)(dev.pd, addr as *mut _, len, access as i32) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::device(format!(
                "ibv_reg_mr ({what}, {len} bytes) failed on '{}': {} (raise `ulimit -l`, the \
                 locked-memory limit)",
                dev.name,
                errno_text()
            ))
        })?;
        Ok(Mr {
            raw,
            dev: Arc::clone(dev),
        })
    }

    /// The local key (for SGEs).
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is live while self is.
        unsafe { self.raw.as_ref().lkey }
    }

    /// The remote key (reported in the host params).
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the MR is live while self is.
        unsafe { self.raw.as_ref().rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: registered in `register`, deregistered once here.
        unsafe { (self.dev.api.ibv_dereg_mr)(self.raw.as_ptr()) };
    }
}

/// A non-blocking completion channel (the fd the receive thread sleeps on).
pub(crate) struct CompChannel {
    raw: NonNull<ibv_comp_channel>,
    dev: Arc<VerbsDevice>,
}

impl CompChannel {
    /// Creates the channel and makes its fd non-blocking.
    pub(crate) fn create(dev: &Arc<VerbsDevice>) -> Result<CompChannel> {
        // SAFETY: ctx is live.
        let raw = unsafe { (dev.api.ibv_create_comp_channel)(dev.ctx) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::device(format!(
                "ibv_create_comp_channel failed on '{}': {}",
                dev.name,
                errno_text()
            ))
        })?;
        let ch = CompChannel {
            raw,
            dev: Arc::clone(dev),
        };
        let fd = ch.fd();
        // SAFETY: F_GETFL/F_SETFL on the channel's valid fd.
        let ok = unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            fl >= 0 && libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(Error::io(
                "setting the completion channel non-blocking",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(ch)
    }

    /// The fd that becomes readable when a completion event is queued.
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: the channel is live while self is.
        unsafe { self.raw.as_ref().fd }
    }

    /// Takes every queued event and acknowledges them on `cq` (the CQ this
    /// channel serves), so none is left unacked when the CQ is destroyed.
    pub(crate) fn drain_events(&self, cq: &Cq) {
        let api = self.dev.api;
        let mut events = 0u32;
        let mut ev_cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: the channel is live and non-blocking; out-pointers are valid.
        while unsafe { (api.ibv_get_cq_event)(self.raw.as_ptr(), &mut ev_cq, &mut ctx) } == 0 {
            events += 1;
        }
        if events > 0 {
            // SAFETY: acks events taken from this channel, whose only CQ is `cq`.
            unsafe { (api.ibv_ack_cq_events)(cq.raw.as_ptr(), events) };
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once, after its CQ (field order).
        unsafe { (self.dev.api.ibv_destroy_comp_channel)(self.raw.as_ptr()) };
    }
}

/// A completion queue: plain, or extended for the NIC's completion
/// timestamps (`cq_ex.rs`; then `raw` is its plain view).
pub(crate) struct Cq {
    raw: NonNull<ibv_cq>,
    ex: Option<ExCq>,
    dev: Arc<VerbsDevice>,
}

impl Cq {
    /// A CQ of `depth` entries, reporting to `channel` when given.
    pub(crate) fn create(
        dev: &Arc<VerbsDevice>,
        depth: u32,
        channel: Option<&CompChannel>,
        what: &str,
    ) -> Result<Cq> {
        let ch = channel.map_or(std::ptr::null_mut(), |c| c.raw.as_ptr());
        // SAFETY: ctx (and the channel, if any) are live.
        let raw =
            unsafe { (dev.api.ibv_create_cq)(dev.ctx, depth as i32, std::ptr::null_mut(), ch, 0) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::device(format!(
                "ibv_create_cq ({what}, {depth} entries) failed on '{}': {}",
                dev.name,
                errno_text()
            ))
        })?;
        Ok(Cq {
            raw,
            ex: None,
            dev: Arc::clone(dev),
        })
    }

    /// The receive CQ of `depth` entries reporting to `channel`: extended
    /// with the NIC's completion timestamps where the device gives them
    /// (or where `choice` asks), else plain.
    pub(crate) fn create_receive(
        dev: &Arc<VerbsDevice>,
        depth: u32,
        channel: &CompChannel,
        choice: CqChoice,
    ) -> Result<Cq> {
        match ExCq::create(dev, depth, channel.raw.as_ptr(), choice)? {
            Some(ex) => Ok(Cq {
                raw: ex.as_cq(),
                ex: Some(ex),
                dev: Arc::clone(dev),
            }),
            None => Cq::create(dev, depth, Some(channel), "receive"),
        }
    }

    /// Whether completions carry the NIC's timestamps.
    pub(crate) fn stamps(&self) -> bool {
        self.ex.as_ref().is_some_and(ExCq::stamps)
    }

    /// Polls up to `wcs.len()` completions into `wcs` and each one's NIC
    /// receive time (host ns, 0 when not stamped) into `stamps`.
    pub(crate) fn poll_stamped(&mut self, wcs: &mut [ibv_wc], stamps: &mut [u64]) -> Result<usize> {
        match self.ex.as_mut() {
            Some(ex) => {
                let n = ex.poll(wcs, stamps)?;
                if n == 0 && ex.stamps() {
                    ex.idle();
                }
                Ok(n)
            }
            None => self.poll(wcs),
        }
    }

    /// Polls up to `wcs.len()` completions into `wcs`; returns how many.
    pub(crate) fn poll(&self, wcs: &mut [ibv_wc]) -> Result<usize> {
        // SAFETY: the CQ is live; wcs holds wcs.len() entries.
        let n = unsafe { dl::poll_cq(self.raw.as_ptr(), wcs.len() as i32, wcs.as_mut_ptr()) };
        usize::try_from(n)
            .map_err(|_| Error::device(format!("ibv_poll_cq failed ({n}): {}", errno_text())))
    }

    /// Asks for an event on the channel at the next completion.
    pub(crate) fn arm(&self) -> Result<()> {
        // SAFETY: the CQ is live.
        match unsafe { dl::req_notify_cq(self.raw.as_ptr(), 0) } {
            0 => Ok(()),
            rc => Err(Error::device(format!(
                "ibv_req_notify_cq failed: {}",
                std::io::Error::from_raw_os_error(rc)
            ))),
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created in `create`, destroyed once, after its QP (field order).
        unsafe { (self.dev.api.ibv_destroy_cq)(self.raw.as_ptr()) };
    }
}

/// An RC queue pair, created in RESET and moved to INIT.
pub(crate) struct Qp {
    raw: NonNull<ibv_qp>,
    dev: Arc<VerbsDevice>,
}

impl Qp {
    /// An RC QP on `cq` (send and receive) with room for the given work
    /// requests (one SGE each), moved RESET -> INIT.
    pub(crate) fn create_rc(
        dev: &Arc<VerbsDevice>,
        cq: &Cq,
        max_send_wr: u32,
        max_recv_wr: u32,
        what: &str,
    ) -> Result<Qp> {
        // SAFETY: ibv_qp_init_attr is plain data; zeroed is valid.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.qp_type = ibv_qp_type::IBV_QPT_RC;
        init.sq_sig_all = 0;
        init.send_cq = cq.raw.as_ptr();
        init.recv_cq = cq.raw.as_ptr();
        init.cap.max_send_wr = max_send_wr;
        init.cap.max_recv_wr = max_recv_wr;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        // SAFETY: pd and cq are live; init is valid.
        let raw = unsafe { (dev.api.ibv_create_qp)(dev.pd, &mut init) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            Error::device(format!(
                "ibv_create_qp ({what}, RC) failed on '{}': {}",
                dev.name,
                errno_text()
            ))
        })?;
        let qp = Qp {
            raw,
            dev: Arc::clone(dev),
        };
        // SAFETY: the QP was just created on this device, in RESET.
        unsafe { dev.qp_to_init(qp.as_ptr(), what) }?;
        Ok(qp)
    }

    /// The raw pointer, for post/modify calls (valid while self lives).
    pub(crate) fn as_ptr(&self) -> *mut ibv_qp {
        self.raw.as_ptr()
    }

    /// The QP number.
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: the QP is live while self is.
        unsafe { self.raw.as_ref().qp_num & MASK_24 }
    }

    /// The device this QP lives on.
    pub(crate) fn device(&self) -> &Arc<VerbsDevice> {
        &self.dev
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created in `create_rc`, destroyed once, first (field order).
        unsafe { (self.dev.api.ibv_destroy_qp)(self.raw.as_ptr()) };
    }
}
