//! # rocev2
//!
//! A RoCEv2 (RDMA over Converged Ethernet v2) reliable-connected receive server
//! for FPGA data streams: the Rust implementation of rogue's
//! `rogue::protocols::rocev2::Server`. Each frame the FPGA SENDs (with an
//! immediate: channel in bits [7:0], ring position in bits [31:8]) lands in a
//! slot of a registered slab and is handed to the consumer zero-copy, on loan;
//! the slot is re-posted only when the consumer releases it, so back-pressure
//! reaches the FPGA as RNR NAKs, never as lost data.
//!
//! Layers: [`ffi`] (the stable C API) -> [`Server`] (backend-agnostic core) ->
//! backends (`verbs`: libibverbs; `soft`: userspace RoCEv2 over UDP) -> config, gid, error.
//!
//! ```no_run
//! use rocev2::{ConnectParams, Device, DeviceConfig, Gid, Server, ServerConfig};
//! # fn main() -> rocev2::Result<()> {
//! let dev = Device::open(&DeviceConfig::new("rxe0"))?;
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

use std::ops::Deref;
use std::sync::Arc;

pub use config::{
    ConnectParams, DeviceConfig, HostParams, IcrcCheck, Mtu, RnrTimer, ServerConfig,
    DEFAULT_MAX_PAYLOAD, DEFAULT_MIN_RNR_TIMER, DEFAULT_PMTU, DEFAULT_RX_QUEUE_DEPTH,
};
pub use error::{Error, ErrorKind, Result};
pub use gid::{detect_gid_index, host_ip_from_gid, Gid};
pub use server::{BackendStats, Frame, ServerCore, SoftStats, Stats};

/// Crate version (also the C library's version string).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Version of the C ABI; bumped on any incompatible change.
pub const ABI_VERSION: u32 = 1;

/// An open device (rogue's `Core`): an ibverbs device with its protection domain.
#[derive(Clone)]
pub struct Device {
    inner: DeviceInner,
}

#[derive(Clone)]
enum DeviceInner {
    #[cfg(feature = "verbs")]
    Verbs(Arc<verbs::VerbsDevice>),
    Soft(Arc<soft::SoftDevice>),
}

impl Device {
    /// Opens the device named in `cfg` ("No RDMA devices found on this host" /
    /// "RDMA device '<name>' not found" as in rogue). The GID index is not
    /// checked here; [`Server::create`] checks it.
    pub fn open(cfg: &DeviceConfig) -> Result<Device> {
        cfg.validate()?;
        if cfg.name == "soft" {
            return Ok(Device {
                inner: DeviceInner::Soft(Arc::new(soft::SoftDevice::open(cfg)?)),
            });
        }
        #[cfg(feature = "verbs")]
        {
            let dev = verbs::VerbsDevice::open(&cfg.name, cfg.ib_port, cfg.gid_index)?;
            Ok(Device {
                inner: DeviceInner::Verbs(Arc::new(dev)),
            })
        }
        #[cfg(not(feature = "verbs"))]
        {
            Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "cannot open RDMA device '{}': this build of rocev2 has no verbs backend \
                     (rebuild with the `verbs` feature, or use the \"soft\" device)",
                    cfg.name
                ),
            ))
        }
    }

    /// The device name.
    pub fn name(&self) -> &str {
        match &self.inner {
            #[cfg(feature = "verbs")]
            DeviceInner::Verbs(d) => d.name(),
            DeviceInner::Soft(d) => d.name(),
        }
    }
}

/// The receive server. Dropping it stops it (see [`ServerCore::stop`]); frames
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

    pub(crate) fn create_core(device: &Device, cfg: &ServerConfig) -> Result<Arc<ServerCore>> {
        match &device.inner {
            #[cfg(feature = "verbs")]
            DeviceInner::Verbs(d) => {
                let name = d.name().to_string();
                let d = Arc::clone(d);
                let remote_write = cfg.mr_remote_write;
                ServerCore::create(&name, cfg, move |slab| {
                    Ok(Box::new(verbs::VerbsBackend::create(d, slab, remote_write)?) as _)
                })
            }
            DeviceInner::Soft(d) => {
                let d = Arc::clone(d);
                ServerCore::create("soft", cfg, move |slab| {
                    Ok(Box::new(soft::SoftBackend::create(&d, slab)?) as _)
                })
            }
        }
    }
}

impl Deref for Server {
    type Target = Arc<ServerCore>;
    fn deref(&self) -> &Arc<ServerCore> {
        &self.core
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.core.stop();
    }
}
