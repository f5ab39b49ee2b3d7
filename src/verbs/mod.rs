//! The libibverbs backend (hardware RoCE NICs such as mlx5, or the kernel's
//! Soft-RoCE rxe). The only module that uses rdma-sys (for its types:
//! libibverbs itself is loaded at run time, `dl.rs`).
//!
//! Least privilege: the MR is registered with `IBV_ACCESS_LOCAL_WRITE` only and
//! the QP grants no remote access (`qp_access_flags = 0`, no RDMA READ
//! responder resources). A SEND receiver needs none: the NIC writes incoming
//! SENDs into *posted receive buffers* under the local key, so a peer can never
//! address host memory directly (rogue's Server.cpp also grants REMOTE_WRITE
//! and REMOTE_READ; rocev2 does not).

use std::ffi::CStr;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::Arc;

use rdma_sys::*;

use crate::config::ConnectParams;
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::server::Slab;
use crate::server::{
    Backend, BackendCounters, BackendInfo, Completion, CompletionKind, RxTimeSource, POLL_BATCH,
};
use crate::sys::poll_readable;

mod cq_ex;
mod dl;
mod ibv;
mod nic_clock;
mod transitions;
mod watch;

pub(crate) use dl::post_send;
use dl::Verbs;
pub(crate) use ibv::{wc_status_text, CompChannel, Cq, Mr, Qp};

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

/// An open ibverbs device and its protection domain (rogue's `Core`).
pub struct VerbsDevice {
    api: &'static Verbs,
    ctx: *mut ibv_context,
    pd: *mut ibv_pd,
    name: String,
    ib_port: u8,
    gid_index: u8,
}

// SAFETY: ibverbs contexts and PDs may be used from any thread (libibverbs
// serialises internally); this type only hands the pointers to verbs calls.
unsafe impl Send for VerbsDevice {}
// SAFETY: as above.
unsafe impl Sync for VerbsDevice {}

/// RAII for `ibv_get_device_list`.
struct DeviceList {
    api: &'static Verbs,
    list: *mut *mut ibv_device,
    len: usize,
}

impl DeviceList {
    fn get(api: &'static Verbs) -> DeviceList {
        let mut n: i32 = 0;
        // SAFETY: n is a valid out-pointer; a NULL list is handled below.
        let list = unsafe { (api.ibv_get_device_list)(&mut n) };
        DeviceList {
            api,
            list,
            len: if list.is_null() { 0 } else { n.max(0) as usize },
        }
    }
    /// The devices, named. The list ends at its NULL entry or after `*num`
    /// entries, whichever comes first (a library whose count overstates its
    /// list is not read past the end); a device without a name (NULL from
    /// `ibv_get_device_name`) is left out, with a warning.
    fn devices(&self) -> Vec<(String, *mut ibv_device)> {
        let mut out = Vec::new();
        for i in 0..self.len {
            // SAFETY: i < len, and no NULL entry came before i: an entry of
            // the list ibv_get_device_list returned.
            let dev = unsafe { *self.list.add(i) };
            if dev.is_null() {
                break;
            }
            // SAFETY: dev is a device of the live list.
            let name = unsafe { (self.api.ibv_get_device_name)(dev) };
            if name.is_null() {
                log::warn!(
                    "libibverbs gave device #{i} of its list no name (ibv_get_device_name \
                     returned NULL): left out; check the RDMA provider (rdma-core) install"
                );
                continue;
            }
            // SAFETY: non-NULL: a NUL-terminated string the library owns
            // while the list lives; copied at once.
            let name = unsafe { CStr::from_ptr(name) };
            out.push((name.to_string_lossy().into_owned(), dev));
        }
        out
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: list came from ibv_get_device_list and is freed once.
            unsafe { (self.api.ibv_free_device_list)(self.list) };
        }
    }
}

/// Loads libibverbs.so.1 (once; the verbs backend does it at the first device
/// open). `Err` (`Unsupported`) when it cannot be loaded, saying what to
/// install.
pub fn load_library() -> Result<()> {
    dl::load().map(|_| ())
}

/// The names of the ibverbs devices on this host (none when libibverbs cannot
/// be loaded: [`load_library`] says why).
pub fn device_names() -> Vec<String> {
    let Ok(api) = dl::load() else {
        return Vec::new();
    };
    DeviceList::get(api)
        .devices()
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// One GID table entry.
#[derive(Debug, Clone)]
pub struct GidEntry {
    /// Table index.
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// sysfs type ("RoCE v2", "IB/RoCE v1"), empty when unknown.
    pub kind: String,
}

/// One port of a device.
#[derive(Debug, Clone)]
pub struct PortInfo {
    /// Port number.
    pub port: u8,
    /// Port state text (PORT_ACTIVE, PORT_DOWN, ...).
    pub state: String,
    /// Active path MTU in bytes.
    pub active_mtu: u32,
    /// Non-zero GID entries.
    pub gids: Vec<GidEntry>,
}

/// A device and its ports (for `rocev2 info`).
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    /// Device name.
    pub name: String,
    /// Firmware version.
    pub fw_ver: String,
    /// Max receive WRs per QP.
    pub max_qp_wr: u32,
    /// The rate of the clock the device stamps completions with (kHz;
    /// None: it stamps none, frames carry the host clock at poll).
    pub completion_clock_khz: Option<u64>,
    /// Ports.
    pub ports: Vec<PortInfo>,
}

/// Describes every device on this host.
pub fn list_devices() -> Vec<Result<DeviceInfo>> {
    device_names()
        .into_iter()
        .map(|name| {
            let dev = VerbsDevice::open(&name, 1, 0)?;
            dev.describe()
        })
        .collect()
}

impl VerbsDevice {
    /// Finds and opens device `name` and allocates its PD. The GID index is not
    /// validated here (rogue's Core does not either).
    pub fn open(name: &str, ib_port: u8, gid_index: u8) -> Result<VerbsDevice> {
        let api = dl::load()?;
        let list = DeviceList::get(api);
        let devices = list.devices();
        if devices.is_empty() {
            return Err(Error::new(
                ErrorKind::NoDevice,
                "No RDMA devices found on this host",
            ));
        }
        let Some(&(_, dev)) = devices.iter().find(|(n, _)| n == name) else {
            let names: Vec<&str> = devices.iter().map(|(n, _)| n.as_str()).collect();
            return Err(Error::new(
                ErrorKind::DeviceNotFound,
                format!(
                    "RDMA device '{name}' not found (devices on this host: {})",
                    names.join(", ")
                ),
            ));
        };
        // SAFETY: dev is an entry of the live device list.
        let ctx = unsafe { (api.ibv_open_device)(dev) };
        drop(list);
        if ctx.is_null() {
            return Err(Error::device(format!(
                "Failed to open RDMA device '{name}': {} (check permissions on /dev/infiniband)",
                errno_text()
            )));
        }
        // SAFETY: ctx is an open context.
        let pd = unsafe { (api.ibv_alloc_pd)(ctx) };
        if pd.is_null() {
            let why = errno_text();
            // SAFETY: ctx is open and closed once here.
            unsafe { (api.ibv_close_device)(ctx) };
            return Err(Error::device(format!(
                "Failed to allocate protection domain on '{name}': {why}"
            )));
        }
        log::info!("Opened RoCEv2 device '{name}', port {ib_port}, GID index {gid_index}");
        Ok(VerbsDevice {
            api,
            ctx,
            pd,
            name: name.to_string(),
            ib_port,
            gid_index,
        })
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The port the server uses.
    pub fn ib_port(&self) -> u8 {
        self.ib_port
    }
    /// The GID index the server uses.
    pub fn gid_index(&self) -> u8 {
        self.gid_index
    }

    fn device_attr(&self) -> Result<ibv_device_attr> {
        // SAFETY: ibv_device_attr is plain data; zeroed is a valid value.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; attr is a valid out-pointer.
        if unsafe { (self.api.ibv_query_device)(self.ctx, &mut attr) } != 0 {
            return Err(Error::device(format!(
                "ibv_query_device failed on '{}': {}",
                self.name,
                errno_text()
            )));
        }
        Ok(attr)
    }

    fn port_attr(&self, port: u8) -> Result<ibv_port_attr> {
        // SAFETY: ibv_port_attr is plain data; zeroed is a valid value.
        let mut attr: ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is open; attr is a valid, zeroed out-pointer of the full
        // size (verbs.h's fallback path: the provider fills what it knows).
        if unsafe { (self.api.ibv_query_port)(self.ctx, port, &mut attr) } != 0 {
            return Err(Error::device(format!(
                "ibv_query_port failed on '{}' port {port}: {}",
                self.name,
                errno_text()
            )));
        }
        Ok(attr)
    }

    /// Queries GID `index` of `port`; `Err` when the query fails.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let mut gid = ibv_gid { raw: [0; 16] };
        // SAFETY: ctx is open; gid is a valid out-pointer.
        let rc = unsafe { (self.api.ibv_query_gid)(self.ctx, port, index as i32, &mut gid) };
        if rc != 0 {
            return Err(Error::device(format!(
                "ibv_query_gid failed for gidIndex={index} on device '{}' port {port}: {} \
                 (list the GID table with `rocev2 info` or `ibv_devinfo -v -d {}`)",
                self.name,
                errno_text(),
                self.name
            )));
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(Gid(unsafe { gid.raw }))
    }

    fn describe(&self) -> Result<DeviceInfo> {
        let attr = self.device_attr()?;
        // SAFETY: fw_ver is a NUL-terminated C string inside the struct.
        let fw_ver = unsafe { CStr::from_ptr(attr.fw_ver.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut ports = Vec::new();
        for port in 1..=attr.phys_port_cnt {
            let pa = self.port_attr(port)?;
            // SAFETY: returns a static string for any state value.
            let state = unsafe { CStr::from_ptr((self.api.ibv_port_state_str)(pa.state)) }
                .to_string_lossy()
                .into_owned();
            let types = format!(
                "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types",
                self.name
            );
            let gids = (0..pa.gid_tbl_len.max(0) as u32)
                .filter_map(|i| {
                    let gid = self.query_gid(port, i).ok()?;
                    (!gid.is_zero()).then(|| GidEntry {
                        index: i,
                        gid,
                        kind: std::fs::read_to_string(format!("{types}/{i}"))
                            .map(|s| s.trim().to_string())
                            .unwrap_or_default(),
                    })
                })
                .collect();
            ports.push(PortInfo {
                port,
                state,
                active_mtu: crate::config::Mtu::from_code(pa.active_mtu)
                    .map(|m| m.bytes())
                    .unwrap_or(0),
                gids,
            });
        }
        Ok(DeviceInfo {
            name: self.name.clone(),
            fw_ver,
            max_qp_wr: attr.max_qp_wr.max(0) as u32,
            completion_clock_khz: cq_ex::device_clock(self).map(|(khz, _)| khz),
            ports,
        })
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        // SAFETY: pd and ctx were created in open and are released once, PD
        // first; every server holds an Arc to this device, so none is alive.
        unsafe {
            (self.api.ibv_dealloc_pd)(self.pd);
            (self.api.ibv_close_device)(self.ctx);
        }
    }
}

/// One RC QP with its CQ, completion channel and MR over the server's slab.
/// Fields in reverse order of creation: dropped QP first, slab last.
pub(crate) struct VerbsBackend {
    qp: Qp,
    cq: Cq,
    channel: CompChannel,
    mr: Mr,
    /// Keeps the registered memory alive until the MR is deregistered.
    slab: Arc<Slab>,
    gid: Gid,
    wcs: Vec<ibv_wc>,
    /// The NIC's receive time of each of `wcs` (host ns; 0: not stamped).
    stamps: Vec<u64>,
    sges: Vec<ibv_sge>,
    wrs: Vec<ibv_recv_wr>,
    /// The port's responder counters: restarted and stale peers.
    watch: watch::PeerWatch,
    /// Receives posted and not completed yet.
    posted: u32,
}

// SAFETY: the backend is used by one thread at a time (the creator, then the
// receive thread); ibverbs objects may move between threads.
unsafe impl Send for VerbsBackend {}

impl VerbsBackend {
    /// MR, completion channel, CQ, RC QP -> INIT and the GID check, all on `dev`.
    /// Everything created so far is released on failure (each object's Drop).
    pub(crate) fn create(
        dev: Arc<VerbsDevice>,
        slab: &Arc<Slab>,
        mr_remote_write: bool,
    ) -> Result<VerbsBackend> {
        let depth = slab.slots();
        let attr = dev.device_attr()?;
        if depth > attr.max_qp_wr.max(0) as u32 || depth > attr.max_cqe.max(0) as u32 {
            return Err(Error::invalid(format!(
                "rxQueueDepth {depth} exceeds what device '{}' supports (max_qp_wr {}, max_cqe {})",
                dev.name, attr.max_qp_wr, attr.max_cqe
            )));
        }
        let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if mr_remote_write {
            access |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        // SAFETY: the backend holds an Arc to the slab, declared after the
        // MR, so the memory outlives the registration.
        let mr =
            unsafe { Mr::register(&dev, slab.base_ptr(), slab.len() as usize, access, "slab") }?;
        let channel = CompChannel::create(&dev)?;
        let cq = Cq::create_receive(&dev, depth, &channel, cq_ex::CqChoice::from_env()?)?;
        let qp = Qp::create_rc(&dev, &cq, 1, depth, "QP")?;
        let gid = dev.query_gid(dev.ib_port, dev.gid_index as u32)?;
        if gid.is_zero() {
            return Err(Error::device(format!(
                "GID query returned all-zero for gidIndex={} on device '{}' (likely \
                 out-of-range; rdma_rxe does not validate gidIndex and returns an empty GID for \
                 unused slots): pick a populated index from `rocev2 info`",
                dev.gid_index, dev.name
            )));
        }
        Ok(VerbsBackend {
            qp,
            cq,
            channel,
            mr,
            slab: Arc::clone(slab),
            gid,
            // SAFETY: ibv_wc is plain data; zeroed is valid.
            wcs: (0..POLL_BATCH)
                .map(|_| unsafe { std::mem::zeroed() })
                .collect(),
            stamps: vec![0; POLL_BATCH],
            sges: Vec::with_capacity(depth as usize),
            wrs: Vec::with_capacity(depth as usize),
            watch: watch::PeerWatch::new(&dev.name, dev.ib_port),
            posted: 0,
        })
    }

    fn name(&self) -> &str {
        &self.qp.device().name
    }
}

impl Backend for VerbsBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            qpn: self.qp.qpn(),
            gid: self.gid,
            rkey: self.mr.rkey(),
            udp_port: crate::config::ROCE_UDP_PORT,
        }
    }

    fn post_recv(&mut self, slots: &[u32]) -> Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let lkey = self.mr.lkey();
        let (slots_n, slot_size) = (self.slab.slots(), self.slab.slot_size());
        self.sges.clear();
        self.wrs.clear();
        for &slot in slots {
            if slot >= slots_n {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("slot={slot} out of range (numBufs={slots_n})"),
                ));
            }
            self.sges.push(ibv_sge {
                addr: self.slab.base_addr() + slot as u64 * slot_size as u64,
                length: slot_size,
                lkey,
            });
        }
        for (i, &slot) in slots.iter().enumerate() {
            self.wrs.push(ibv_recv_wr {
                wr_id: slot as u64,
                next: ptr::null_mut(),
                sg_list: &mut self.sges[i],
                num_sge: 1,
            });
        }
        // Chain the WRs (the vector does not reallocate: capacity = depth).
        let base = self.wrs.as_mut_ptr();
        for i in 0..self.wrs.len() - 1 {
            // SAFETY: i + 1 < len; pointers into the same live vector.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: qp is live; the chain and its SGEs live until the call returns
        // (the provider copies them into the receive queue).
        let rc = unsafe { dl::post_recv(self.qp.as_ptr(), base, &mut bad) };
        if rc != 0 {
            return Err(Error::device(format!(
                "ibv_post_recv failed ({} slots) on '{}': {}",
                slots.len(),
                self.name(),
                std::io::Error::from_raw_os_error(rc)
            )));
        }
        self.posted += slots.len() as u32;
        Ok(())
    }

    fn connect(&mut self, p: &ConnectParams, fpga_gid: Gid, sq_psn: u32) -> Result<()> {
        self.watch.baseline();
        // SAFETY: self.qp is live (owned by this backend).
        unsafe {
            self.qp.device().qp_to_rts(
                self.qp.as_ptr(),
                p.fpga_qpn,
                fpga_gid,
                p.fpga_rq_psn,
                p.min_rnr_timer.code() as u8,
                p.pmtu,
                sq_psn,
                "QP",
            )
        }?;
        self.watch.connect(p.pmtu.bytes(), p.fpga_rq_psn);
        Ok(())
    }

    fn stamp_receives(&mut self) -> Result<bool> {
        Ok(self.cq.stamps())
    }

    fn stamp_source(&self) -> RxTimeSource {
        RxTimeSource::Nic
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        let n = self.cq.poll_stamped(&mut self.wcs, &mut self.stamps)?;
        self.posted = self.posted.saturating_sub(n as u32);
        let slots = self.slab.slots();
        for (wc, &rx_ns) in self.wcs[..n].iter().zip(&self.stamps) {
            let slot = wc.wr_id as u32;
            if wc.wr_id >= slots as u64 {
                log::warn!(
                    "CQ returned out-of-range wr_id={} (numBufs={slots}); discarding",
                    wc.wr_id
                );
                continue;
            }
            let kind = if wc.status == ibv_wc_status::IBV_WC_SUCCESS {
                if wc.opcode == ibv_wc_opcode::IBV_WC_RECV {
                    let imm = (wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0).then(|| {
                        // SAFETY: WITH_IMM set: the union holds the immediate
                        // (network byte order).
                        u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
                    });
                    CompletionKind::Recv {
                        len: wc.byte_len,
                        imm,
                    }
                } else {
                    CompletionKind::Unexpected {
                        opcode: wc.opcode,
                        flags: wc.wc_flags,
                    }
                }
            } else if wc.status == ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                CompletionKind::Flushed
            } else {
                CompletionKind::Error {
                    what: wc_status_text(wc.status),
                    code: wc.status,
                }
            };
            out.push(Completion { slot, kind, rx_ns });
        }
        let ok = |wc: &&ibv_wc| wc.status == ibv_wc_status::IBV_WC_SUCCESS;
        match self.wcs[..n].iter().rev().find(ok) {
            Some(wc) => self
                .watch
                .delivered(self.wcs[..n].iter().filter(ok).count() as u64, wc.byte_len),
            None if n == 0 => self.watch.empty_poll(self.posted == 0),
            None => {}
        }
        Ok(())
    }

    fn arm(&mut self) -> Result<bool> {
        self.cq.arm().map(|()| true)
    }

    fn block(&mut self, wake_fd: RawFd) -> Result<bool> {
        let ready = poll_readable([self.channel.fd(), wake_fd], self.watch.block_ms())?;
        if ready[0] {
            self.channel.drain_events(&self.cq);
        } else if !ready[1] {
            // Woken to read the port's counters (no completion came).
            self.watch
                .check(std::time::Instant::now(), self.posted == 0);
        }
        Ok(ready[1])
    }

    fn counters(&self) -> BackendCounters {
        BackendCounters::Verbs(self.watch.counters())
    }
}
