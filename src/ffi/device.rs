//! Device handles: open, close, list (rogue's `Core`).

use std::ffi::c_char;

use super::guard::{c_str, copy_out, deref_mut, fn_name, guard, guard_or, BoxHandle};
use super::library::ROCEV2_ICRC_AUTO;
use super::sized::{init_sized, read_sized, SizedStruct};
use super::status::rocev2_status;
use crate::config::{DeviceConfig, IcrcCheck, VerbsConfig};
use crate::error::{Error, ErrorKind};
use crate::Device;

/// An open device (rogue's Core). Opaque.
pub struct rocev2_device {
    _private: [u8; 0],
}

impl BoxHandle for rocev2_device {
    type Rust = Device;
}

/// Which device to open. Fill with `rocev2_device_config_init(&cfg,
/// sizeof cfg)`, then set `name`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_device_config {
    /// The caller's sizeof(rocev2_device_config), set by rocev2_device_config_init.
    pub struct_size: u32,
    /// ibverbs port number (default 1).
    pub ib_port: u8,
    /// GID table index of the host's RoCE v2 IPv4 GID (default 0; checked when
    /// a server is created, not at open; see rocev2_gid_detect_index).
    pub gid_index: u8,
    /// UDP port for the soft backend (default 4791; 0 = any free port, see
    /// rocev2_host_params.udp_port).
    pub udp_port: u16,
    /// Soft backend: the FPGA's UDP port, where ACKs go (default 4791; 0 =
    /// reply to each packet's source port).
    pub peer_udp_port: u16,
    /// Soft backend: received ICRCs (ROCEV2_ICRC_AUTO, the default: checked
    /// through raw capture when the process has CAP_NET_RAW, else counted
    /// unchecked; ROCEV2_ICRC_OFF; ROCEV2_ICRC_REQUIRE: server creation fails
    /// without CAP_NET_RAW). Was `reserved` (0) before 1.1.
    pub icrc_check: u16,
    /// Device name, e.g. "mlx5_0" or "rxe0", or "soft" for the userspace
    /// backend (NUL-terminated; copied).
    pub name: *const c_char,
    /// Local IPv4 address for the soft backend (NULL = 127.0.0.1; copied).
    pub bind_addr: *const c_char,
    /// Soft backend: busy-poll the NIC's receive queue up to this many
    /// microseconds on an empty socket (SO_BUSY_POLL, and
    /// SO_PREFER_BUSY_POLL where permitted; a refusal is logged once).
    /// Default 0: off. Does nothing on loopback. Since 2.3.
    pub busy_poll_us: u32,
}

// SAFETY: #[repr(C)], starts with u32 struct_size; plain data (the string
// pointers are only read through c_str, which checks them).
unsafe impl SizedStruct for rocev2_device_config {
    const NAME: &'static str = "rocev2_device_config";
    // ABI 2.0's struct ended before busy_poll_us.
    const SMALLEST: usize = std::mem::offset_of!(rocev2_device_config, busy_poll_us);
    const READ: bool = true;
}

impl Default for rocev2_device_config {
    fn default() -> Self {
        rocev2_device_config {
            struct_size: std::mem::size_of::<rocev2_device_config>() as u32,
            ib_port: 1,
            gid_index: 0,
            udp_port: crate::config::ROCE_UDP_PORT,
            peer_udp_port: crate::config::ROCE_UDP_PORT,
            icrc_check: ROCEV2_ICRC_AUTO,
            name: std::ptr::null(),
            bind_addr: std::ptr::null(),
            busy_poll_us: 0,
        }
    }
}

/// Fills `cfg` (`size` = the caller's `sizeof(rocev2_device_config)`) with
/// defaults: port 1, GID index 0, UDP ports 4791, ICRC check auto, busy_poll_us 0, no name,
/// bind 127.0.0.1. Writes exactly `size` bytes (zero beyond the fields this
/// library knows) and sets `struct_size` to `size`.
///
/// Thread safety: any thread; `cfg` is the caller's.
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_config_init(
    cfg: *mut rocev2_device_config,
    size: usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: cfg is NULL or has `size` writable bytes (API contract).
        unsafe { init_sized(cfg, size, rocev2_device_config::default()) }
    })
}

/// Opens a device (rogue's Core): finds it by name, opens it and allocates
/// its protection domain. Errors: ROCEV2_ERR_NO_DEVICE ("No RDMA devices found
/// on this host"), ROCEV2_ERR_DEVICE_NOT_FOUND (`"RDMA device '<name>' not
/// found"`), ROCEV2_ERR_UNSUPPORTED (libibverbs.so.1, loaded at the first
/// verbs open, is not installed: the message says what to install). The
/// GID index is not checked here. `cfg->struct_size` may be any size from
/// the ABI-2 one up (a larger struct's unknown tail must be zero). On success `*out` owns the device: close it with
/// rocev2_device_close (servers keep it alive). Open/close (not
/// create/destroy): a device exists before and after; a server is created.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_open(
    cfg: *const rocev2_device_config,
    out: *mut *mut rocev2_device,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: pointers checked; valid per the API contract when non-null.
        let out = unsafe { deref_mut(out, "out") }?;
        *out = std::ptr::null_mut();
        // SAFETY: cfg is NULL or has struct_size readable bytes (API contract).
        let c = unsafe { read_sized(cfg, rocev2_device_config::default(), "cfg") }?;
        // SAFETY: NUL-terminated strings per the API contract.
        let name = unsafe { c_str(c.name, "cfg->name") }?;
        let dc = match DeviceConfig::by_name(name) {
            DeviceConfig::Soft(mut soft) => {
                soft.udp_port = c.udp_port;
                soft.peer_udp_port = c.peer_udp_port;
                soft.icrc_check = IcrcCheck::from_code(c.icrc_check as u32)?;
                soft.busy_poll_us = c.busy_poll_us;
                if !c.bind_addr.is_null() {
                    // SAFETY: as above.
                    soft.bind_addr = unsafe { c_str(c.bind_addr, "cfg->bind_addr") }?.to_string();
                }
                DeviceConfig::Soft(soft)
            }
            DeviceConfig::Verbs(verbs) => DeviceConfig::Verbs(VerbsConfig {
                ib_port: c.ib_port,
                gid_index: c.gid_index,
                ..verbs
            }),
        };
        let dev = Device::open(&dc)?;
        *out = rocev2_device::into_raw(dev);
        Ok(())
    })
}

/// Closes a device handle (NULL is ignored). Servers created on it keep the
/// underlying device open until they are destroyed.
///
/// Thread safety: any thread, once per handle, not concurrently with another
/// call on the same handle.
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_close(dev: *mut rocev2_device) {
    guard_or(fn_name!(), (), || {
        // SAFETY: dev is NULL or came from rocev2_device_open, closed once.
        unsafe { rocev2_device::free(dev) };
        Ok(())
    })
}

/// Lists the ibverbs devices on this host as a comma-separated string into
/// `buf` (see rocev2_last_error for the buffer rules); `*count` gets the number
/// of devices. Returns ROCEV2_ERR_BUFFER_TOO_SMALL if truncated. The caller
/// owns `buf`. (rocev2_list_devices before ABI 2.)
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_list(
    buf: *mut c_char,
    len: usize,
    count: *mut usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: checked pointer, caller-owned.
        let count = unsafe { deref_mut(count, "count") }?;
        #[cfg(feature = "verbs")]
        let names = crate::verbs::device_names();
        #[cfg(not(feature = "verbs"))]
        let names: Vec<String> = Vec::new();
        *count = names.len();
        let text = names.join(",");
        // SAFETY: buf is NULL or has len writable bytes (API contract).
        let full = unsafe { copy_out(&text, buf, len) };
        if full >= len {
            return Err(Error::new(
                ErrorKind::BufferTooSmall,
                format!("device list needs {} bytes; got {len}", full + 1),
            ));
        }
        Ok(())
    })
}
