//! QP state transitions (RESET -> INIT -> RTR -> RTS) of a [`VerbsDevice`],
//! shared by the server's QP and the emulator's requester.

use rdma_sys::*;

use super::VerbsDevice;
use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::wire::psn;

/// QP state transitions shared by the server's QP and the requester's.
impl VerbsDevice {
    /// `ibv_modify_qp`, with `what` and the device named in the error.
    ///
    /// # Safety
    /// `qp` must be a live QP of this device.
    unsafe fn modify_qp(
        &self,
        qp: *mut ibv_qp,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        what: &str,
    ) -> Result<()> {
        // SAFETY: qp is live (caller) and attr is valid for the fields in mask.
        let rc = unsafe { (self.api.ibv_modify_qp)(qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(Error::device(format!(
                "{what} on device '{}': {}",
                self.name,
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Any state -> RESET (the send and receive queues emptied, the PSNs
    /// forgotten): what an FPGA reload does to its engine.
    ///
    /// # Safety
    /// `qp` must be a live QP of this device.
    pub(crate) unsafe fn qp_to_reset(&self, qp: *mut ibv_qp, what: &str) -> Result<()> {
        // SAFETY: plain data; zeroed is valid.
        let mut qa: ibv_qp_attr = unsafe { std::mem::zeroed() };
        qa.qp_state = ibv_qp_state::IBV_QPS_RESET;
        // SAFETY: forwarded from the caller.
        unsafe {
            self.modify_qp(
                qp,
                &mut qa,
                ibv_qp_attr_mask::IBV_QP_STATE,
                &format!("{what} →RESET failed"),
            )
        }
    }

    /// RESET -> INIT on our port, granting no remote access.
    ///
    /// # Safety
    /// `qp` must be a live QP of this device.
    pub(crate) unsafe fn qp_to_init(&self, qp: *mut ibv_qp, what: &str) -> Result<()> {
        // SAFETY: plain data; zeroed is valid.
        let mut qa: ibv_qp_attr = unsafe { std::mem::zeroed() };
        qa.qp_state = ibv_qp_state::IBV_QPS_INIT;
        qa.pkey_index = 0;
        qa.port_num = self.ib_port;
        qa.qp_access_flags = 0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        // SAFETY: forwarded from the caller.
        unsafe { self.modify_qp(qp, &mut qa, mask, &format!("{what} RESET→INIT failed")) }
    }

    /// INIT -> RTR towards `dest_qpn` at `dgid` (no RDMA READ resources), then
    /// RTR -> RTS with `sq_psn` (timeout 14, retry 7, RNR retry 7 = forever).
    ///
    /// # Safety
    /// `qp` must be a live QP of this device.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn qp_to_rts(
        &self,
        qp: *mut ibv_qp,
        dest_qpn: u32,
        dgid: Gid,
        rq_psn: u32,
        min_rnr_timer: u8,
        pmtu: crate::config::Mtu,
        sq_psn: u32,
        what: &str,
    ) -> Result<()> {
        // SAFETY: plain data; zeroed is valid.
        let mut qa: ibv_qp_attr = unsafe { std::mem::zeroed() };
        qa.qp_state = ibv_qp_state::IBV_QPS_RTR;
        qa.path_mtu = pmtu.code();
        qa.dest_qp_num = dest_qpn;
        qa.rq_psn = rq_psn & psn::MASK;
        qa.max_dest_rd_atomic = 0;
        qa.min_rnr_timer = min_rnr_timer;
        qa.ah_attr.is_global = 1;
        qa.ah_attr.grh.dgid = ibv_gid { raw: dgid.0 };
        qa.ah_attr.grh.sgid_index = self.gid_index;
        qa.ah_attr.grh.hop_limit = 64;
        qa.ah_attr.port_num = self.ib_port;
        qa.ah_attr.sl = 0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        // SAFETY: forwarded from the caller.
        unsafe { self.modify_qp(qp, &mut qa, mask, &format!("{what} INIT→RTR failed"))? };
        // SAFETY: plain data; zeroed is valid.
        let mut qa: ibv_qp_attr = unsafe { std::mem::zeroed() };
        qa.qp_state = ibv_qp_state::IBV_QPS_RTS;
        qa.sq_psn = sq_psn & psn::MASK;
        qa.timeout = 14;
        qa.retry_cnt = 7;
        qa.rnr_retry = 7;
        qa.max_rd_atomic = 0;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        // SAFETY: forwarded from the caller.
        unsafe { self.modify_qp(qp, &mut qa, mask, &format!("{what} RTR→RTS failed")) }
    }
}
