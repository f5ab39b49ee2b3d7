//! # rocev2
//!
//! A RoCEv2 (RDMA over Converged Ethernet v2) reliable-connected receive server
//! for FPGA data streams: the Rust implementation of rogue's
//! `rogue::protocols::rocev2::Server`. Each frame the FPGA SENDs (with an
//! immediate: channel in bits \[7:0\], ring position in bits \[31:8\]) lands in a
//! slot of a registered slab and is handed to the consumer zero-copy, on loan;
//! the slot is re-posted only when the consumer releases it, so back-pressure
//! reaches the FPGA as RNR NAKs, never as lost data.
//!
//! Layers, top down (imports run one way, down; ARCHITECTURE.md is the map):
//! [`ffi`] (the stable C API) -> [`Device`] / [`Server`] (this file: pick the
//! backend by the config's type) -> backends (`verbs`: libibverbs, loaded at
//! run time; [`soft`]: a userspace RoCEv2 responder over UDP) -> the server
//! core (slab, loans, receive thread, dispatch, counters) -> [`wire`],
//! [`config`], [`gid`], [`error`]. The FPGA emulator ([`emulator`]) is a
//! product of its own (`rocev2 fpga-sim`), built on the same wire codec.
//!
//! ```no_run
//! use rocev2::{ConnectParams, Device, DeviceConfig, Gid, Server, ServerConfig};
//! # fn main() -> rocev2::Result<()> {
//! let dev = Device::open(&DeviceConfig::verbs("rxe0"))?;
//! let server = Server::create(&dev, &ServerConfig::default())?;
//! server.set_fpga_gid(Gid::parse("10.0.0.20")?)?;
//! let host = server.host_params();
//! // ... program the FPGA with host.qpn, host.rq_psn, host.sq_psn, host.mr_addr, host.mr_len ...
//! server.set_frame_callback(|frame| println!("ch {} {} bytes", frame.channel(), frame.len()))?;
//! let fpga_qpn = 0x12; // read back from the FPGA
//! server.complete_connection(&ConnectParams::new(fpga_qpn, host.sq_psn, 5, 1)?)?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

#[doc(hidden)]
pub mod bench;
pub mod config;
pub mod emulator;
pub mod error;
pub mod ffi;
pub mod gid;
mod net;
mod server;
pub mod soft;
mod sys;
#[cfg(feature = "verbs")]
pub mod verbs;
pub mod wire;

/// Entry points of the fuzz targets for crate-private parts (built only by
/// `cargo fuzz`, which sets `cfg(fuzzing)`; fuzz/fuzz_targets/).
#[cfg(fuzzing)]
#[doc(hidden)]
pub mod fuzzing {
    /// The landing planner (`soft::landing::fuzz`).
    pub fn landing_planner(data: &[u8]) {
        crate::soft::landing_fuzz(data)
    }
}

use std::sync::Arc;
use std::time::Duration;

pub use config::{
    ConnectParams, DeviceConfig, HostParams, IcrcCheck, Mtu, RnrTimer, ServerConfig, SoftConfig,
    VerbsConfig, DEFAULT_MAX_PAYLOAD, DEFAULT_MIN_RNR_TIMER, DEFAULT_PMTU, DEFAULT_RX_QUEUE_DEPTH,
};
pub use error::{Error, ErrorKind, Result};
pub use gid::{detect_gid_index, host_ip_from_gid, Gid};
pub use server::{
    BackendStats, Frame, Latency, LinkState, RxTimeSource, SoftStats, Stats, VerbsStats,
};

use server::ServerCore;

/// Crate version (also the C library's version string).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the C ABI; bumped on any incompatible change.
pub const ABI_VERSION: u32 = 2;

/// An open device (rogue's `Core`): an ibverbs device with its protection
/// domain, or the soft backend's bind address.
#[derive(Clone)]
pub struct Device {
    inner: DeviceInner,
}

#[derive(Clone)]
enum DeviceInner {
    #[cfg(feature = "verbs")]
    Verbs {
        dev: Arc<verbs::VerbsDevice>,
        mr_remote_write: bool,
    },
    Soft(Arc<soft::SoftDevice>),
}

impl Device {
    /// Opens the device `cfg` names ("No RDMA devices found on this host" /
    /// `"RDMA device '<name>' not found"` as in rogue). The first verbs open
    /// loads libibverbs.so.1; where it is not installed the error is
    /// [`ErrorKind::Unsupported`], saying what to install. The GID index is
    /// not checked here; [`Server::create`] checks it.
    pub fn open(cfg: &DeviceConfig) -> Result<Device> {
        cfg.validate()?;
        let inner = match cfg {
            DeviceConfig::Soft(c) => DeviceInner::Soft(Arc::new(soft::SoftDevice::open(c)?)),
            #[cfg(feature = "verbs")]
            DeviceConfig::Verbs(c) => DeviceInner::Verbs {
                dev: Arc::new(verbs::VerbsDevice::open(&c.name, c.ib_port, c.gid_index)?),
                mr_remote_write: c.mr_remote_write,
            },
            #[cfg(not(feature = "verbs"))]
            DeviceConfig::Verbs(c) => {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!(
                        "cannot open RDMA device '{}': this build of rocev2 has no verbs backend \
                         (rebuild with the `verbs` feature, or use the \"soft\" device)",
                        c.name
                    ),
                ))
            }
        };
        Ok(Device { inner })
    }

    /// The device name (`"soft"` for the soft backend).
    pub fn name(&self) -> &str {
        match &self.inner {
            #[cfg(feature = "verbs")]
            DeviceInner::Verbs { dev, .. } => dev.name(),
            DeviceInner::Soft(d) => d.name(),
        }
    }

    /// The same device, with servers created on it registering their slab
    /// with IBV_ACCESS_REMOTE_WRITE or not ([`VerbsConfig::mr_remote_write`];
    /// no effect on the soft backend).
    #[cfg_attr(not(feature = "verbs"), allow(unused_variables))]
    pub fn with_mr_remote_write(&self, on: bool) -> Device {
        let inner = match &self.inner {
            #[cfg(feature = "verbs")]
            DeviceInner::Verbs { dev, .. } => DeviceInner::Verbs {
                dev: Arc::clone(dev),
                mr_remote_write: on,
            },
            soft => soft.clone(),
        };
        Device { inner }
    }
}

/// The receive server. Dropping it stops it (see [`Server::stop`]); frames
/// still on loan stay valid until released.
pub struct Server {
    core: Arc<ServerCore>,
}

impl Server {
    /// Allocates the slab and creates the QP (state INIT) on `device`.
    pub fn create(device: &Device, cfg: &ServerConfig) -> Result<Server> {
        Ok(Server {
            core: Self::create_core(device, cfg)?,
        })
    }

    /// The core alone (the C API hands it out as the server handle, and
    /// stops it on destroy).
    pub(crate) fn create_core(device: &Device, cfg: &ServerConfig) -> Result<Arc<ServerCore>> {
        Ok(match &device.inner {
            #[cfg(feature = "verbs")]
            DeviceInner::Verbs {
                dev,
                mr_remote_write,
            } => {
                let (dev, remote_write) = (Arc::clone(dev), *mr_remote_write);
                ServerCore::create(device.name(), cfg, move |slab| {
                    Ok(Box::new(verbs::VerbsBackend::create(dev, slab, remote_write)?) as _)
                })?
            }
            DeviceInner::Soft(d) => {
                let d = Arc::clone(d);
                ServerCore::create("soft", cfg, move |slab| {
                    Ok(Box::new(soft::SoftBackend::create(&d, slab)?) as _)
                })?
            }
        })
    }

    /// The configuration the server was created with.
    pub fn config(&self) -> &ServerConfig {
        self.core.config()
    }
    /// The device (or `soft`) the server runs on.
    pub fn device_name(&self) -> &str {
        self.core.device_name()
    }
    /// Host parameters for programming the FPGA.
    pub fn host_params(&self) -> HostParams {
        self.core.host_params()
    }
    /// Counter snapshot: the core's and the backend's.
    pub fn stats(&self) -> Stats {
        self.core.stats()
    }
    /// True while the receive thread runs.
    pub fn is_running(&self) -> bool {
        self.core.is_running()
    }
    /// Why the receive thread ended, once it has ("stopped" after stop()).
    pub fn exited_reason(&self) -> Option<String> {
        self.core.exited_reason()
    }
    /// The link's state (also in [`Stats::link`]).
    pub fn link_state(&self) -> LinkState {
        self.core.link_state()
    }
    /// Why the link is down, for an operator: the receive thread's end cause
    /// (a QP error with its completion status, a failing socket, "stopped")
    /// or why complete_connection failed; None while created or connected.
    pub fn end_cause(&self) -> Option<String> {
        self.core.end_cause()
    }
    /// Stores the FPGA's GID (IPv4-mapped for RoCEv2); before
    /// [`complete_connection`](Self::complete_connection). Soft: from here
    /// on the server's socket takes this FPGA's packets (they wait for
    /// `complete_connection`); an error when another server of this process
    /// on the same address and port receives from that FPGA address.
    pub fn set_fpga_gid(&self, gid: Gid) -> Result<()> {
        self.core.set_fpga_gid(gid)
    }
    /// Registers the frame callback (before `complete_connection`). It runs
    /// on the receive thread with each frame on loan; dropping the frame
    /// releases it.
    pub fn set_frame_callback(&self, cb: impl FnMut(Frame) + Send + 'static) -> Result<()> {
        self.core.set_frame_callback(cb)
    }
    /// Pre-posts every slot, takes the QP to RTS and starts the receive
    /// thread. Only once per server.
    pub fn complete_connection(&self, params: &ConnectParams) -> Result<()> {
        self.core.complete_connection(params)
    }
    /// Stops receiving: no callback starts after this returns, the receive
    /// thread is joined (or detached when called from it, or when a callback
    /// is still blocked after `stop_timeout_ms`), frames still queued for
    /// `poll_frame` are released, and the transport is torn down. Loaned
    /// frames stay valid until released. Idempotent.
    pub fn stop(&self) {
        self.core.stop()
    }
    /// Waits up to `timeout` (forever for `None`) for the next frame when no
    /// callback is registered. `Ok(None)` on timeout; `Stopped` once the
    /// server is stopped and the queue is empty.
    /// Up to `max` frames: waits like [`poll_frame`](Self::poll_frame) for
    /// the first, then takes those already queued without waiting. Empty on
    /// timeout.
    pub fn poll_frames(&self, timeout: Option<Duration>, max: usize) -> Result<Vec<Frame>> {
        let mut out = Vec::new();
        self.core.poll_batch(timeout, max, |f| out.push(f))?;
        Ok(out)
    }
    /// Waits up to `timeout` (forever for `None`) for the next frame when no
    /// callback is registered. `Ok(None)` on timeout; `Stopped` once the
    /// server is stopped and the queue is empty.
    pub fn poll_frame(&self, timeout: Option<Duration>) -> Result<Option<Frame>> {
        self.core.poll_frame(timeout)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.core.stop();
    }
}
