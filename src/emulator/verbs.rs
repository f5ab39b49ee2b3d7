//! A verbs RC requester that plays the FPGA: it streams pattern frames as
//! SEND_WITH_IMM (immediate = ring position << 8 | channel, like surf's
//! engine) from a second RDMA device — for testing a receiver host with rdma_rxe
//! or a spare NIC (`rocev2 verbs-fpga`). At most `max_inflight` sends are
//! outstanding. Sends are signaled selectively (every `max_inflight / 2`-th and
//! the last; an RC send queue completes in order, so one completion retires
//! every send before it, and a failed send always completes, with its error),
//! so a receiver that NAKs or stalls shows up as a completion error or a
//! timeout.

use std::collections::VecDeque;
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_sys::*;

use super::pattern;
use crate::config::Mtu;
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::verbs::{post_send, wc_status_text, Cq, Mr, Qp, VerbsDevice};
use crate::wire::MASK_24;

/// What a stream achieved.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SendStats {
    /// Frames whose send completed successfully.
    pub frames: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Wall time in seconds.
    pub seconds: f64,
}

/// The FPGA stand-in on a verbs device. Fields in reverse order of
/// creation: the QP is destroyed first, the buffer freed after its MR.
pub struct VerbsRequester {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    buf: Vec<u8>,
    slot_size: usize,
    inflight: usize,
    ring: u32,
    sent: u64,
    /// What `connect` was given (host QPN, GID, first PSN, path MTU), for
    /// `restart`.
    peer: Option<(u32, Gid, u32, Mtu)>,
}

// SAFETY: used by one thread at a time; ibverbs objects may move between threads.
unsafe impl Send for VerbsRequester {}

impl VerbsRequester {
    /// PD-side resources and an RC QP in INIT on `dev` (its port and GID index).
    pub fn create(
        dev: Arc<VerbsDevice>,
        max_inflight: usize,
        max_frame: usize,
    ) -> Result<VerbsRequester> {
        let inflight = max_inflight.clamp(1, 1024);
        let slot_size = max_frame.max(1);
        let mut buf = vec![0u8; inflight * slot_size];
        // SAFETY: buf's heap block never moves (the Vec is never resized) and
        // is freed after the MR (field order).
        let mr = unsafe {
            Mr::register(
                &dev,
                buf.as_mut_ptr(),
                buf.len(),
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0,
                "requester",
            )
        }?;
        let cq = Cq::create(&dev, (inflight * 2) as u32, None, "requester")?;
        let qp = Qp::create_rc(&dev, &cq, inflight as u32, 1, "requester QP")?;
        Ok(VerbsRequester {
            qp,
            cq,
            mr,
            buf,
            slot_size,
            inflight,
            ring: 0,
            sent: 0,
            peer: None,
        })
    }

    /// Our QP number (what the host passes as fpga_qpn).
    pub fn qpn(&self) -> u32 {
        self.qp.qpn()
    }

    /// Our GID (the device's, at its GID index).
    pub fn gid(&self) -> Result<Gid> {
        let dev = self.qp.device();
        dev.query_gid(dev.ib_port(), dev.gid_index() as u32)
    }

    /// INIT -> RTR -> RTS towards the host QP; our first SEND carries
    /// `start_psn` (the host SQ PSN, surf's convention).
    pub fn connect(
        &mut self,
        host_qpn: u32,
        host_gid: Gid,
        start_psn: u32,
        pmtu: Mtu,
    ) -> Result<()> {
        self.peer = Some((host_qpn, host_gid, start_psn, pmtu));
        // SAFETY: self.qp is live (owned by self).
        unsafe {
            self.qp.device().qp_to_rts(
                self.qp.as_ptr(),
                host_qpn,
                host_gid,
                0,
                1,
                pmtu,
                start_psn,
                "requester QP",
            )
        }
    }

    /// Plays an FPGA reload: the QP is reset and re-programmed with the same
    /// host params, so its next SEND carries the first PSN again (and the
    /// ring position starts over at 0). A verbs host ACKs the new stream as
    /// old duplicates and delivers none of it (its peer watch reports a
    /// restart); a soft host re-synchronises. Call between streams.
    pub fn restart(&mut self) -> Result<()> {
        let (qpn, gid, psn, pmtu) = self
            .peer
            .ok_or_else(|| Error::state("restart before connect: connect first"))?;
        self.reconnect(qpn, gid, psn, pmtu)
    }

    /// Resets the QP and connects it again, to a host QP that may be new
    /// (an FPGA reload followed by a host that re-created its server: the
    /// remedy). Frame sequence numbers go on; the ring position starts at 0.
    pub fn reconnect(
        &mut self,
        host_qpn: u32,
        host_gid: Gid,
        start_psn: u32,
        pmtu: Mtu,
    ) -> Result<()> {
        let dev = Arc::clone(self.qp.device());
        // SAFETY: self.qp is live (owned by self); no send is outstanding
        // (streams return once every send completed).
        unsafe {
            dev.qp_to_reset(self.qp.as_ptr(), "requester QP")?;
            dev.qp_to_init(self.qp.as_ptr(), "requester QP")?;
        }
        self.ring = 0;
        self.connect(host_qpn, host_gid, start_psn, pmtu)
    }

    /// Posts one SEND of `len` bytes from buffer slot `slot` (with an
    /// immediate when `imm` is set; 0 bytes: no SGE).
    fn post(
        &mut self,
        slot: usize,
        len: usize,
        imm: Option<u32>,
        seq: u64,
        signaled: bool,
    ) -> Result<()> {
        let addr = self.buf.as_ptr() as u64 + (slot * self.slot_size) as u64;
        let mut sge = ibv_sge {
            addr,
            length: len as u32,
            lkey: self.mr.lkey(),
        };
        // SAFETY: plain data (unions of integers and pointers); zeroed is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = seq;
        wr.sg_list = &mut sge;
        wr.num_sge = (len > 0) as i32;
        wr.opcode = match imm {
            Some(_) => ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
            None => ibv_wr_opcode::IBV_WR_SEND,
        };
        wr.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        wr.imm_data_invalidated_rkey_union.imm_data = imm.unwrap_or(0).to_be();
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: qp live; wr and sge valid for the call (the provider copies them).
        let rc = unsafe { post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if rc != 0 {
            return Err(Error::device(format!(
                "ibv_post_send failed on '{}': {}",
                self.qp.device().name(),
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        Ok(())
    }

    /// Sends one message of `data` (any length, 0 included), with an
    /// immediate or without one (a plain SEND, which surf's engine never
    /// sends but a generic RC sender may), and waits for its completion.
    pub fn send_one(&mut self, data: &[u8], imm: Option<u32>, timeout: Duration) -> Result<()> {
        if data.len() > self.slot_size {
            return Err(Error::invalid(format!(
                "message size must be 0..{} (the requester's buffer); got {}",
                self.slot_size,
                data.len()
            )));
        }
        let seq = self.sent;
        let slot = (seq % self.inflight as u64) as usize;
        let off = slot * self.slot_size;
        self.buf[off..off + data.len()].copy_from_slice(data);
        self.post(slot, data.len(), imm, seq, true)?;
        self.sent += 1;
        // SAFETY: plain data; zeroed is valid.
        let mut wcs: Vec<ibv_wc> = (0..4).map(|_| unsafe { std::mem::zeroed() }).collect();
        let mut outstanding = VecDeque::from([seq]);
        let t0 = Instant::now();
        while !outstanding.is_empty() {
            let n = self.cq.poll(&mut wcs)?;
            retire(&wcs[..n], &mut outstanding)?;
            if t0.elapsed() > timeout {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!("the send did not complete within {timeout:?}"),
                ));
            }
            std::thread::yield_now();
        }
        Ok(())
    }

    /// Sends `frames` pattern frames of `size` bytes (frame i on channel
    /// `channels[i % len]`), checking the send completions. Sequence numbers
    /// continue across calls.
    pub fn stream(
        &mut self,
        frames: u64,
        size: usize,
        channels: &[u8],
        timeout: Duration,
    ) -> Result<SendStats> {
        self.stream_with(frames, size, channels, timeout, true)
    }

    /// [`stream`](Self::stream); with `pattern` false every send carries
    /// whatever its buffer holds (as perftest's `ib_send_bw` does), for
    /// benchmarks where filling 4 KiB per frame would make the sender the
    /// bottleneck.
    pub fn stream_with(
        &mut self,
        frames: u64,
        size: usize,
        channels: &[u8],
        timeout: Duration,
        pattern: bool,
    ) -> Result<SendStats> {
        if size > self.slot_size || size < 8 {
            return Err(Error::invalid(format!(
                "frame size must be 8..{} (the requester's buffer); got {size}",
                self.slot_size
            )));
        }
        let chans = if channels.is_empty() {
            &[0u8][..]
        } else {
            channels
        };
        let t0 = Instant::now();
        let mut outstanding: VecDeque<u64> = VecDeque::new();
        let (mut next, mut done) = (0u64, 0u64);
        // SAFETY: plain data; zeroed is valid.
        let mut wcs: Vec<ibv_wc> = (0..16).map(|_| unsafe { std::mem::zeroed() }).collect();
        let sig_every = (self.inflight as u64 / 2).max(1);
        let mut idle_polls = 0u32;
        while done < frames {
            while next < frames && outstanding.len() < self.inflight {
                let seq = self.sent + next;
                let slot = (seq % self.inflight as u64) as usize;
                let off = slot * self.slot_size;
                if pattern {
                    pattern::fill(seq, &mut self.buf[off..off + size]);
                }
                let imm = (self.ring << 8) | chans[(next % chans.len() as u64) as usize] as u32;
                self.ring = (self.ring + 1) & MASK_24;
                let signaled = (next + 1) % sig_every == 0 || next + 1 == frames;
                self.post(slot, size, Some(imm), seq, signaled)?;
                outstanding.push_back(seq);
                next += 1;
            }
            let n = self.cq.poll(&mut wcs)?;
            done += retire(&wcs[..n], &mut outstanding)?;
            if n == 0 {
                idle_polls += 1;
                if idle_polls < 1000 {
                    continue;
                }
                idle_polls = 0;
                if t0.elapsed() > timeout {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!("only {done} of {frames} sends completed within {timeout:?}"),
                    ));
                }
                std::thread::yield_now();
            }
        }
        self.sent += frames;
        Ok(SendStats {
            frames,
            bytes: frames * size as u64,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}

/// Retires the sends `wcs` complete (an RC send queue completes in order:
/// one completion retires every send before it); returns how many. A failed
/// send is an error naming its frame and status.
fn retire(wcs: &[ibv_wc], outstanding: &mut VecDeque<u64>) -> Result<u64> {
    let mut done = 0;
    for wc in wcs {
        let seq = wc.wr_id;
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            return Err(Error::new(
                ErrorKind::Device,
                format!(
                    "send of frame {seq} completed with error: {}",
                    wc_status_text(wc.status)
                ),
            ));
        }
        while outstanding.front().is_some_and(|&s| s <= seq) {
            outstanding.pop_front();
            done += 1;
        }
    }
    Ok(done)
}
