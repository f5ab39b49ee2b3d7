//! The stable C API (ABI v1). `include/rocev2.h` is generated from this module
//! by cbindgen; the header test fails when it is stale.
//!
//! Rules for every function:
//! - Returns a `rocev2_status` (`ROCEV2_OK` = 0) unless documented otherwise;
//!   after a failure `rocev2_last_error` gives a message for the calling thread.
//! - Every pointer argument is checked; NULL gives `ROCEV2_ERR_NULL_POINTER`.
//! - No panic unwinds into the caller: an internal bug gives `ROCEV2_ERR_PANIC`.
//! - Config structs carry `struct_size`: fill them with the `*_init` functions.
//! - Safety: a pointer argument is NULL or valid for its type and documented
//!   size; handles come from this library and are not used after destroy/close
//!   (except rocev2_server_release for outstanding tokens).

#![allow(non_camel_case_types)]
// Every exported function has one safety contract, stated in the module docs
// above and in the header: a pointer argument is NULL or valid for its type.
#![allow(clippy::missing_safety_doc)]

mod guard;
mod logging;

use std::ffi::{c_char, c_int, c_void};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::config::{ConnectParams, DeviceConfig, ServerConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::server::{Frame, ServerCore};
use crate::{Device, Server};
use guard::{c_str, copy_out, deref, deref_mut, guard, guard_void, null};

/// ABI version of this header; `rocev2_abi_version()` returns the library's.
pub const ROCEV2_ABI_VERSION: u32 = 1;
/// rogue's DefaultMaxPayload: bytes per receive slot.
pub const ROCEV2_DEFAULT_MAX_PAYLOAD: u32 = 9000;
/// rogue's DefaultRxQueueDepth: receive slots.
pub const ROCEV2_DEFAULT_RX_QUEUE_DEPTH: u32 = 256;
/// Default path MTU code (5 = 4096 bytes).
pub const ROCEV2_DEFAULT_PMTU: u32 = 5;
/// rogue C++'s default min RNR timer code (1 = 0.01 ms; pyrogue uses 12 = 0.64 ms).
pub const ROCEV2_DEFAULT_MIN_RNR_TIMER: u32 = 1;
/// The RoCEv2 UDP port.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// icrc_check: verify received ICRCs when allowed (CAP_NET_RAW), else count them unchecked.
pub const ROCEV2_ICRC_AUTO: u16 = 0;
/// icrc_check: never capture; received ICRCs are counted unchecked.
pub const ROCEV2_ICRC_OFF: u16 = 1;
/// icrc_check: verify every received ICRC; fail without CAP_NET_RAW.
pub const ROCEV2_ICRC_REQUIRE: u16 = 2;

// The C constants are literals (cbindgen cannot evaluate paths); keep them equal.
const _: () = {
    assert!(ROCEV2_ABI_VERSION == crate::ABI_VERSION);
    assert!(ROCEV2_DEFAULT_MAX_PAYLOAD == crate::config::DEFAULT_MAX_PAYLOAD);
    assert!(ROCEV2_DEFAULT_RX_QUEUE_DEPTH == crate::config::DEFAULT_RX_QUEUE_DEPTH);
    assert!(ROCEV2_DEFAULT_PMTU == crate::config::DEFAULT_PMTU);
    assert!(ROCEV2_DEFAULT_MIN_RNR_TIMER == crate::config::DEFAULT_MIN_RNR_TIMER);
    assert!(ROCEV2_UDP_PORT == crate::config::ROCE_UDP_PORT);
};

/// Status codes. 0 is success; every other value comes with a message from
/// `rocev2_last_error` on the same thread.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rocev2_status {
    /// Success.
    ROCEV2_OK = 0,
    /// A parameter is out of range or malformed (the message names it and the range).
    ROCEV2_ERR_INVALID_ARGUMENT = 1,
    /// A required pointer argument is NULL.
    ROCEV2_ERR_NULL_POINTER = 2,
    /// No RDMA device exists on this host.
    ROCEV2_ERR_NO_DEVICE = 3,
    /// The named RDMA device does not exist.
    ROCEV2_ERR_DEVICE_NOT_FOUND = 4,
    /// An RDMA/verbs operation failed.
    ROCEV2_ERR_DEVICE = 5,
    /// The call is not valid in the server's current state.
    ROCEV2_ERR_STATE = 6,
    /// A wait timed out (rocev2_server_poll_frame: no frame yet).
    ROCEV2_ERR_TIMEOUT = 7,
    /// The server is stopped or its receive thread ended.
    ROCEV2_ERR_STOPPED = 8,
    /// Not available in this build or on this host.
    ROCEV2_ERR_UNSUPPORTED = 9,
    /// An operating-system call failed.
    ROCEV2_ERR_IO = 10,
    /// Out of memory.
    ROCEV2_ERR_NO_MEMORY = 11,
    /// The release token is unknown or already released.
    ROCEV2_ERR_UNKNOWN_TOKEN = 12,
    /// A lookup found nothing.
    ROCEV2_ERR_NOT_FOUND = 13,
    /// The caller's buffer is too small.
    ROCEV2_ERR_BUFFER_TOO_SMALL = 14,
    /// A bug inside the library was caught (a panic); please report it.
    ROCEV2_ERR_PANIC = 15,
    /// An internal invariant broke; please report it.
    ROCEV2_ERR_INTERNAL = 16,
}

/// Log levels for `rocev2_set_log_callback`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rocev2_log_level {
    /// No logging.
    ROCEV2_LOG_OFF = 0,
    /// Errors.
    ROCEV2_LOG_ERROR = 1,
    /// Warnings.
    ROCEV2_LOG_WARN = 2,
    /// Informational (connection bring-up, stop).
    ROCEV2_LOG_INFO = 3,
    /// Debug.
    ROCEV2_LOG_DEBUG = 4,
    /// Per-frame tracing.
    ROCEV2_LOG_TRACE = 5,
}

/// An open device (rogue's Core). Opaque.
pub struct rocev2_device {
    _private: [u8; 0],
}

/// A receive server. Opaque.
pub struct rocev2_server {
    _private: [u8; 0],
}

/// Which device to open. Fill with `rocev2_device_config_init`, then set `name`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_device_config {
    /// sizeof(rocev2_device_config), set by rocev2_device_config_init.
    pub struct_size: u32,
    /// ibverbs port number (default 1).
    pub ib_port: u8,
    /// GID table index of the host's RoCE v2 IPv4 GID (default 0; checked when
    /// a server is created, not at open; see rocev2_detect_gid_index).
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
}

/// Server settings. Fill with `rocev2_server_config_init`, then adjust.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_server_config {
    /// sizeof(rocev2_server_config), set by rocev2_server_config_init.
    pub struct_size: u32,
    /// Bytes per receive slot, the largest frame (default 9000; 1..2^30).
    pub max_payload: u32,
    /// Number of receive slots (default 256; 1..65536; slab < 4 GiB).
    pub rx_queue_depth: u32,
    /// Busy-poll budget of the receive thread before it blocks, microseconds (default 50).
    pub spin_us: u32,
    /// How long stop waits for a running frame callback before detaching, ms (default 5000).
    pub stop_timeout_ms: u32,
    /// CPU to pin the receive thread to, or -1 (default) for none.
    pub cpu_affinity: i32,
    /// verbs: 1 = also register the slab with remote-write access so the MR
    /// has a valid rkey (what rogue reports); the QP still grants no remote
    /// access. Default 0 (least privilege).
    pub mr_remote_write: u32,
}

/// What the FPGA is programmed with (rogue's getters).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_host_params {
    /// Host QP number (24 bits).
    pub qpn: u32,
    /// Host receive PSN (rogue getRqPsn).
    pub rq_psn: u32,
    /// Host send PSN (rogue getSqPsn). surf programs the FPGA's send PSN with
    /// this value, so pass it as `fpga_rq_psn` to complete_connection.
    pub sq_psn: u32,
    /// MR length in bytes (max_payload * rx_queue_depth, < 2^32).
    pub mr_len: u32,
    /// MR (slab) virtual address.
    pub mr_addr: u64,
    /// MR rkey (the MR grants no remote access).
    pub mr_rkey: u32,
    /// Host GID, raw bytes.
    pub gid: [u8; 16],
    /// Host GID as text, "0000:0000:0000:0000:0000:ffff:0a00:0001" (NUL-terminated).
    pub gid_str: [c_char; 40],
    /// UDP port the host receives on (4791; the bound port on the soft backend).
    pub udp_port: u16,
}

/// A received frame on loan. `data` points into the receive slab (zero copy)
/// and stays valid until `token` is released with rocev2_server_release.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_frame {
    /// Payload (inside the slab).
    pub data: *const u8,
    /// Payload length in bytes.
    pub len: u32,
    /// Channel: immediate bits [7:0].
    pub channel: u32,
    /// The raw immediate value, host byte order (bits [31:8]: FPGA ring position).
    pub immediate: u32,
    /// Receive slot index.
    pub slot: u32,
    /// Release token: pass to rocev2_server_release exactly once. Never 0.
    pub token: u64,
}

/// Counters. Set `struct_size` to sizeof(rocev2_stats) before the call; the
/// library fills at most that many bytes and sets it to the bytes written.
/// Fields documented "soft" stay 0 on the verbs backend.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rocev2_stats {
    /// In: size of the caller's struct. Out: bytes written.
    pub struct_size: u32,
    /// Reserved, 0.
    pub reserved: u32,
    /// Frames delivered.
    pub frames: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Loans released.
    pub releases: u64,
    /// Slots re-posted after release.
    pub reposts: u64,
    /// Re-post calls (batches).
    pub repost_batches: u64,
    /// Times the receive thread blocked waiting.
    pub parks: u64,
    /// Completions with an error status.
    pub completion_errors: u64,
    /// Flush completions (QP in error; the thread ends).
    pub flush_errors: u64,
    /// Completions with zero or oversized length (dropped).
    pub bad_length: u64,
    /// Completions that were not a receive with immediate (dropped).
    pub unexpected_opcode: u64,
    /// Release calls with an unknown or released token.
    pub invalid_releases: u64,
    /// Frame callbacks that panicked (Rust consumers only).
    pub callback_panics: u64,
    /// soft: packets received.
    pub packets_rx: u64,
    /// soft: packets sent.
    pub packets_tx: u64,
    /// soft: ACKs sent.
    pub acks_tx: u64,
    /// soft: RNR NAKs sent.
    pub rnr_naks_tx: u64,
    /// soft: PSN sequence error NAKs sent.
    pub seq_naks_tx: u64,
    /// soft: invalid request NAKs sent.
    pub invalid_naks_tx: u64,
    /// soft: duplicate packets.
    pub duplicates: u64,
    /// soft: packets ahead of the expected PSN.
    pub out_of_sequence: u64,
    /// soft: packets for another QP or from another address.
    pub foreign_packets: u64,
    /// soft: malformed packets.
    pub malformed: u64,
    /// soft: packets with a bad ICRC.
    pub icrc_errors: u64,
    /// soft: packets whose ICRC could not be checked.
    pub icrc_unchecked: u64,
    /// Slots on loan right now.
    pub loans_outstanding: u64,
    /// soft: packets whose ICRC was verified (raw capture mode). Since 1.1.
    pub icrc_checked: u64,
    /// soft: packets received straight into their slot (no copy). Since 1.1.
    pub payload_direct: u64,
    /// soft: packets copied into their slot after a missed landing guess
    /// (loss, reordering, a change of frame size). Since 1.1.
    pub payload_copied: u64,
    /// soft: packets the kernel dropped, the receive socket's buffer being
    /// full (the sender resends them). Since 1.1.
    pub socket_drops: u64,
}

/// Called on the receive thread for every frame. The frame is on loan: release
/// `frame->token` exactly once (here or later, from any thread). Must not
/// throw or longjmp. May call rocev2_server_stop (not destroy) on its server.
pub type rocev2_frame_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, frame: *const rocev2_frame)>;

/// Receives library log records (from any thread). Strings are valid only
/// during the call.
pub type rocev2_log_callback = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        level: rocev2_log_level,
        target: *const c_char,
        message: *const c_char,
    ),
>;

fn core_ref<'a>(srv: *const rocev2_server) -> Result<&'a ServerCore> {
    // SAFETY: a non-null server pointer is, by the API contract, a live handle
    // from rocev2_server_create (an Arc<ServerCore> raw pointer).
    unsafe { deref(srv as *const ServerCore, "server") }
}

/// A new strong reference to the server core behind `srv`.
fn core_arc(srv: *const rocev2_server) -> Result<Arc<ServerCore>> {
    if srv.is_null() {
        return Err(null("server"));
    }
    let p = srv as *const ServerCore;
    // SAFETY: p is a live Arc<ServerCore> raw pointer (API contract); we add a
    // reference before materialising the Arc so the handle's count is untouched.
    unsafe {
        Arc::increment_strong_count(p);
        Ok(Arc::from_raw(p))
    }
}

fn to_frame(f: Frame) -> rocev2_frame {
    let data = f.data().as_ptr();
    let (len, channel, immediate, slot) = (f.len(), f.channel() as u32, f.immediate(), f.slot());
    let (token, _core) = f.into_token();
    rocev2_frame {
        data,
        len,
        channel,
        immediate,
        slot,
        token,
    }
}

// ---------------------------------------------------------------------------
// Library
// ---------------------------------------------------------------------------

/// The library version, e.g. "1.0.0" (static string; never fails).
#[no_mangle]
pub extern "C" fn rocev2_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The library's ABI version; compare with ROCEV2_ABI_VERSION.
#[no_mangle]
pub extern "C" fn rocev2_abi_version() -> u32 {
    crate::ABI_VERSION
}

/// A static description of a status code ("unknown status" for other values).
#[no_mangle]
pub extern "C" fn rocev2_status_str(status: c_int) -> *const c_char {
    let s: &'static str = match status {
        0 => "ok\0",
        1 => "invalid argument\0",
        2 => "null pointer\0",
        3 => "no RDMA device\0",
        4 => "device not found\0",
        5 => "device error\0",
        6 => "invalid state\0",
        7 => "timeout\0",
        8 => "stopped\0",
        9 => "unsupported\0",
        10 => "I/O error\0",
        11 => "out of memory\0",
        12 => "unknown token\0",
        13 => "not found\0",
        14 => "buffer too small\0",
        15 => "internal error (panic)\0",
        16 => "internal error\0",
        _ => "unknown status\0",
    };
    s.as_ptr() as *const c_char
}

/// Copies the calling thread's last error message into `buf` (`len` bytes,
/// always NUL-terminated when len > 0, truncated if needed) and returns its
/// full length without the NUL, so a caller can size a buffer with
/// `rocev2_last_error(NULL, 0) + 1`. Valid after a call that failed.
#[no_mangle]
pub unsafe extern "C" fn rocev2_last_error(buf: *mut c_char, len: usize) -> usize {
    // SAFETY: buf is NULL or has len writable bytes (API contract).
    guard::with_last_error(|m| unsafe { copy_out(m, buf, len) })
}

/// Routes library logs to `cb` at `level` and above (ROCEV2_LOG_*); NULL `cb`
/// restores the default: stderr, filtered by RUST_LOG (default warn). Global;
/// `user_data` is passed back unchanged. Thread-safe.
#[no_mangle]
pub extern "C" fn rocev2_set_log_callback(
    cb: rocev2_log_callback,
    user_data: *mut c_void,
    level: c_int,
) -> rocev2_status {
    guard("rocev2_set_log_callback", || {
        let filter = logging::filter_of(level).ok_or_else(|| {
            Error::invalid(format!(
                "log level must be 0..5 (ROCEV2_LOG_OFF..TRACE); got {level}"
            ))
        })?;
        logging::set_callback(cb, user_data, filter);
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Devices
// ---------------------------------------------------------------------------

/// Fills `cfg` with defaults (port 1, GID index 0, UDP ports 4791, no name,
/// bind 127.0.0.1).
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_config_init(
    cfg: *mut rocev2_device_config,
) -> rocev2_status {
    guard("rocev2_device_config_init", || {
        // SAFETY: non-null cfg points to a caller-owned struct (API contract).
        let cfg = unsafe { deref_mut(cfg, "cfg") }?;
        *cfg = rocev2_device_config {
            struct_size: std::mem::size_of::<rocev2_device_config>() as u32,
            ib_port: 1,
            gid_index: 0,
            udp_port: crate::config::ROCE_UDP_PORT,
            peer_udp_port: crate::config::ROCE_UDP_PORT,
            icrc_check: ROCEV2_ICRC_AUTO,
            name: std::ptr::null(),
            bind_addr: std::ptr::null(),
        };
        Ok(())
    })
}

fn check_size(got: u32, want: usize, what: &str) -> Result<()> {
    if (got as usize) < want {
        return Err(Error::invalid(format!(
            "{what}.struct_size is {got}, expected {want}: initialise it with {what}_init"
        )));
    }
    Ok(())
}

/// Opens a device (rogue's Core): finds it by name, opens it and allocates
/// its protection domain. Errors: ROCEV2_ERR_NO_DEVICE ("No RDMA devices found
/// on this host"), ROCEV2_ERR_DEVICE_NOT_FOUND ("RDMA device '<name>' not
/// found"). The GID index is not checked here. On success `*out` owns the
/// device: close it with rocev2_device_close (servers keep it alive).
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_open(
    cfg: *const rocev2_device_config,
    out: *mut *mut rocev2_device,
) -> rocev2_status {
    guard("rocev2_device_open", || {
        // SAFETY: pointers checked; valid per the API contract when non-null.
        let out = unsafe { deref_mut(out, "out") }?;
        *out = std::ptr::null_mut();
        // SAFETY: as above.
        let c = unsafe { deref(cfg, "cfg") }?;
        check_size(
            c.struct_size,
            std::mem::size_of::<rocev2_device_config>(),
            "rocev2_device_config",
        )?;
        // SAFETY: NUL-terminated strings per the API contract.
        let name = unsafe { c_str(c.name, "cfg->name") }?;
        let mut dc = DeviceConfig::new(name);
        dc.ib_port = c.ib_port;
        dc.gid_index = c.gid_index;
        dc.udp_port = c.udp_port;
        dc.peer_udp_port = c.peer_udp_port;
        dc.icrc_check = crate::config::IcrcCheck::from_code(c.icrc_check as u32)?;
        if !c.bind_addr.is_null() {
            // SAFETY: as above.
            dc.bind_addr = unsafe { c_str(c.bind_addr, "cfg->bind_addr") }?.to_string();
        }
        let dev = Device::open(&dc)?;
        *out = Box::into_raw(Box::new(dev)) as *mut rocev2_device;
        Ok(())
    })
}

/// Closes a device handle (NULL is ignored). Servers created on it keep the
/// underlying device open until they are destroyed.
#[no_mangle]
pub unsafe extern "C" fn rocev2_device_close(dev: *mut rocev2_device) {
    guard_void("rocev2_device_close", || {
        if !dev.is_null() {
            // SAFETY: dev came from rocev2_device_open and is closed once.
            drop(unsafe { Box::from_raw(dev as *mut Device) });
        }
    })
}

/// Lists the ibverbs devices on this host as a comma-separated string into
/// `buf` (see rocev2_last_error for the buffer rules); `*count` gets the number
/// of devices. Returns ROCEV2_ERR_BUFFER_TOO_SMALL if truncated.
#[no_mangle]
pub unsafe extern "C" fn rocev2_list_devices(
    buf: *mut c_char,
    len: usize,
    count: *mut usize,
) -> rocev2_status {
    guard("rocev2_list_devices", || {
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

// ---------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------

/// Fills `cfg` with defaults (max_payload 9000, rx_queue_depth 256, spin_us 50,
/// stop_timeout_ms 5000, cpu_affinity -1).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_config_init(
    cfg: *mut rocev2_server_config,
) -> rocev2_status {
    guard("rocev2_server_config_init", || {
        // SAFETY: checked pointer, caller-owned.
        let cfg = unsafe { deref_mut(cfg, "cfg") }?;
        let d = ServerConfig::default();
        *cfg = rocev2_server_config {
            struct_size: std::mem::size_of::<rocev2_server_config>() as u32,
            max_payload: d.max_payload,
            rx_queue_depth: d.rx_queue_depth,
            spin_us: d.spin_us,
            stop_timeout_ms: d.stop_timeout_ms,
            cpu_affinity: -1,
            mr_remote_write: 0,
        };
        Ok(())
    })
}

/// Creates a server on `dev`: allocates the slab, registers it, creates the
/// CQ and the RC QP (state INIT), queries the GID at the device's GID index
/// (an all-zero GID is rejected with a message naming index and device) and
/// draws random 24-bit PSNs. `cfg` NULL means defaults. On success `*out` owns
/// the server: destroy it with rocev2_server_destroy.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_create(
    dev: *const rocev2_device,
    cfg: *const rocev2_server_config,
    out: *mut *mut rocev2_server,
) -> rocev2_status {
    guard("rocev2_server_create", || {
        // SAFETY: checked pointers, valid per the API contract.
        let out = unsafe { deref_mut(out, "out") }?;
        *out = std::ptr::null_mut();
        // Arguments first (so a bad config is reported as such), then the handle.
        let mut sc = ServerConfig::default();
        if !cfg.is_null() {
            // SAFETY: non-null, caller-owned.
            let c = unsafe { &*cfg };
            check_size(
                c.struct_size,
                std::mem::size_of::<rocev2_server_config>(),
                "rocev2_server_config",
            )?;
            sc.max_payload = c.max_payload;
            sc.rx_queue_depth = c.rx_queue_depth;
            sc.spin_us = c.spin_us;
            sc.stop_timeout_ms = c.stop_timeout_ms;
            sc.mr_remote_write = c.mr_remote_write != 0;
            sc.cpu_affinity = match c.cpu_affinity {
                -1 => None,
                n if n >= 0 => Some(n as u32),
                n => {
                    return Err(Error::invalid(format!(
                        "cpu_affinity must be -1 (not pinned) or a CPU number; got {n}"
                    )))
                }
            };
        }
        sc.validate()?;
        // SAFETY: as above (a handle from rocev2_device_open).
        let dev = unsafe { deref(dev as *const Device, "dev") }?;
        let core = Server::create_core(dev, &sc)?;
        *out = Arc::into_raw(core) as *mut rocev2_server;
        Ok(())
    })
}

/// Sets the FPGA's GID (16 bytes; IPv4-mapped ::ffff:a.b.c.d, see
/// rocev2_gid_parse). Before complete_connection.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_set_fpga_gid(
    srv: *mut rocev2_server,
    gid: *const u8,
) -> rocev2_status {
    guard("rocev2_server_set_fpga_gid", || {
        let core = core_ref(srv)?;
        if gid.is_null() {
            return Err(null("gid"));
        }
        // SAFETY: gid points to 16 readable bytes (API contract).
        let raw = unsafe { std::slice::from_raw_parts(gid, 16) };
        core.set_fpga_gid(Gid::from_slice(raw)?)
    })
}

/// Reads the host parameters for programming the FPGA.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_get_host_params(
    srv: *const rocev2_server,
    out: *mut rocev2_host_params,
) -> rocev2_status {
    guard("rocev2_server_get_host_params", || {
        let core = core_ref(srv)?;
        // SAFETY: checked pointer, caller-owned.
        let out = unsafe { deref_mut(out, "out") }?;
        let h = core.host_params();
        let mut gid_str = [0 as c_char; 40];
        let text = h.gid.to_string();
        // SAFETY: gid_str has 40 writable bytes.
        unsafe { copy_out(&text, gid_str.as_mut_ptr(), gid_str.len()) };
        *out = rocev2_host_params {
            qpn: h.qpn,
            rq_psn: h.rq_psn,
            sq_psn: h.sq_psn,
            mr_len: h.mr_len,
            mr_addr: h.mr_addr,
            mr_rkey: h.mr_rkey,
            gid: h.gid.0,
            gid_str,
            udp_port: h.udp_port,
        };
        Ok(())
    })
}

/// Registers the frame callback (before complete_connection; once). Without
/// one, frames queue for rocev2_server_poll_frame. `user_data` is passed back.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_set_frame_callback(
    srv: *mut rocev2_server,
    cb: rocev2_frame_callback,
    user_data: *mut c_void,
) -> rocev2_status {
    guard("rocev2_server_set_frame_callback", || {
        let core = core_ref(srv)?;
        let Some(f) = cb else {
            return Err(null("cb"));
        };
        struct User(*mut c_void);
        // SAFETY: the host promises user_data may be used from the receive thread.
        unsafe impl Send for User {}
        let user = User(user_data);
        core.set_frame_callback(move |frame| {
            let fr = to_frame(frame);
            let u = &user;
            // SAFETY: host function with the documented signature; fr lives
            // across the call.
            unsafe { f(u.0, &fr) };
        })
    })
}

/// Pre-posts every slot, moves the QP INIT->RTR->RTS and starts the receive
/// thread ("RoCEv2Server"). Once per server. `fpga_rq_psn` is the PSN of the
/// FPGA's first SEND: pass host_params.sq_psn (surf programs the FPGA with
/// sq_psn = host SQ PSN). `pmtu` 1..5 (1=256 .. 5=4096), `min_rnr_timer` 0..31
/// (IBA table 45; 1 = 0.01 ms, 12 = 0.64 ms).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_complete_connection(
    srv: *mut rocev2_server,
    fpga_qpn: u32,
    fpga_rq_psn: u32,
    pmtu: u32,
    min_rnr_timer: u32,
) -> rocev2_status {
    guard("rocev2_server_complete_connection", || {
        let p = ConnectParams::new(fpga_qpn, fpga_rq_psn, pmtu, min_rnr_timer)?;
        core_arc(srv)?.complete_connection(&p)
    })
}

/// Waits up to `timeout_ms` (-1: forever, 0: no wait) for the next frame when
/// no callback is registered. ROCEV2_OK fills `*frame` (release its token);
/// ROCEV2_ERR_TIMEOUT if none arrived; ROCEV2_ERR_STOPPED once the server is
/// stopped. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_poll_frame(
    srv: *mut rocev2_server,
    timeout_ms: i32,
    frame: *mut rocev2_frame,
) -> rocev2_status {
    guard("rocev2_server_poll_frame", || {
        // SAFETY: checked pointer, caller-owned.
        let frame = unsafe { deref_mut(frame, "frame") }?;
        let core = core_arc(srv)?;
        let timeout = match timeout_ms {
            -1 => None,
            t if t >= 0 => Some(Duration::from_millis(t as u64)),
            t => {
                return Err(Error::invalid(format!(
                    "timeout_ms must be -1 or >= 0; got {t}"
                )))
            }
        };
        match core.poll_frame(timeout)? {
            Some(f) => {
                *frame = to_frame(f);
                Ok(())
            }
            None => Err(Error::new(
                ErrorKind::Timeout,
                format!("no frame within {timeout_ms} ms"),
            )),
        }
    })
}

/// Releases a frame's loan; its slot is re-posted. Exactly once per token,
/// from any thread, at any time (also inside the callback, after stop, and
/// after destroy for tokens still outstanding). Never blocks.
/// ROCEV2_ERR_UNKNOWN_TOKEN for an unknown or already released token.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_release(
    srv: *mut rocev2_server,
    token: u64,
) -> rocev2_status {
    guard("rocev2_server_release", || {
        let core = core_ref(srv)?;
        core.release_token(token)?;
        // SAFETY: the loan just released held one strong reference handed out
        // by Frame::into_token for this same core; give it back. This may free
        // the core (after destroy), so `core` is not used afterwards.
        unsafe { Arc::decrement_strong_count(srv as *const ServerCore) };
        Ok(())
    })
}

/// Reads the counters (see rocev2_stats for the size protocol).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_get_stats(
    srv: *const rocev2_server,
    out: *mut rocev2_stats,
) -> rocev2_status {
    guard("rocev2_server_get_stats", || {
        let core = core_ref(srv)?;
        // SAFETY: checked pointer, caller-owned, at least struct_size bytes.
        let o = unsafe { deref_mut(out, "out") }?;
        let cap = o.struct_size as usize;
        if cap < 8 {
            return Err(Error::invalid(format!(
                "rocev2_stats.struct_size must be set to sizeof(rocev2_stats); got {cap}"
            )));
        }
        let s = core.stats();
        let full = rocev2_stats {
            struct_size: 0,
            reserved: 0,
            frames: s.frames,
            bytes: s.bytes,
            releases: s.releases,
            reposts: s.reposts,
            repost_batches: s.repost_batches,
            parks: s.parks,
            completion_errors: s.completion_errors,
            flush_errors: s.flush_errors,
            bad_length: s.bad_length,
            unexpected_opcode: s.unexpected_opcode,
            invalid_releases: s.invalid_releases,
            callback_panics: s.callback_panics,
            packets_rx: s.packets_rx,
            packets_tx: s.packets_tx,
            acks_tx: s.acks_tx,
            rnr_naks_tx: s.rnr_naks_tx,
            seq_naks_tx: s.seq_naks_tx,
            invalid_naks_tx: s.invalid_naks_tx,
            duplicates: s.duplicates,
            out_of_sequence: s.out_of_sequence,
            foreign_packets: s.foreign_packets,
            malformed: s.malformed,
            icrc_errors: s.icrc_errors,
            icrc_unchecked: s.icrc_unchecked,
            loans_outstanding: s.loans_outstanding,
            icrc_checked: s.icrc_checked,
            payload_direct: s.payload_direct,
            payload_copied: s.payload_copied,
            socket_drops: s.socket_drops,
        };
        let n = cap.min(std::mem::size_of::<rocev2_stats>());
        // SAFETY: copies n bytes of a plain-data struct into the caller's
        // struct of at least n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(&full as *const _ as *const u8, out as *mut u8, n);
        }
        o.struct_size = n as u32;
        Ok(())
    })
}

/// 1 while the receive thread runs, 0 otherwise (also for NULL).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_is_running(srv: *const rocev2_server) -> c_int {
    let mut running = 0;
    guard_void("rocev2_server_is_running", || {
        if let Ok(core) = core_ref(srv) {
            running = core.is_running() as c_int;
        }
    });
    running
}

/// Stops the server: no callback starts after it returns; the receive thread
/// is joined (detached when called from the callback, or after
/// stop_timeout_ms when a callback is blocked); frames queued for poll_frame
/// are released; the QP, CQ and MR are torn down. Loaned frames stay valid
/// until released. Idempotent.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_stop(srv: *mut rocev2_server) -> rocev2_status {
    guard("rocev2_server_stop", || {
        core_ref(srv)?.stop();
        Ok(())
    })
}

/// Stops (if needed) and releases the handle (NULL is ignored). Slab memory
/// stays valid until the last outstanding token is released; after destroy
/// the handle may only be passed to rocev2_server_release for such tokens.
/// Must not be called from the frame callback.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_destroy(srv: *mut rocev2_server) {
    guard_void("rocev2_server_destroy", || {
        if srv.is_null() {
            return;
        }
        // SAFETY: srv is the Arc raw pointer from rocev2_server_create,
        // destroyed once; this drops the handle's reference.
        let core = unsafe { Arc::from_raw(srv as *const ServerCore) };
        core.stop();
        drop(core);
    })
}

// ---------------------------------------------------------------------------
// GID helpers
// ---------------------------------------------------------------------------

/// Parses a GID: "0000:0000:0000:0000:0000:ffff:0a00:0001" (ibv_devinfo form),
/// IPv6 text ("::ffff:10.0.0.1") or an IPv4 address ("10.0.0.1", mapped).
/// Writes 16 bytes to `out`.
#[no_mangle]
pub unsafe extern "C" fn rocev2_gid_parse(text: *const c_char, out: *mut u8) -> rocev2_status {
    guard("rocev2_gid_parse", || {
        // SAFETY: NUL-terminated string per the API contract.
        let t = unsafe { c_str(text, "text") }?;
        if out.is_null() {
            return Err(null("out"));
        }
        let g = Gid::parse(t)?;
        // SAFETY: out has 16 writable bytes (API contract).
        unsafe { std::ptr::copy_nonoverlapping(g.0.as_ptr(), out, 16) };
        Ok(())
    })
}

/// Formats 16 GID bytes in ibv_devinfo form into `buf` (40 bytes needed).
#[no_mangle]
pub unsafe extern "C" fn rocev2_gid_format(
    gid: *const u8,
    buf: *mut c_char,
    len: usize,
) -> rocev2_status {
    guard("rocev2_gid_format", || {
        if gid.is_null() {
            return Err(null("gid"));
        }
        if buf.is_null() {
            return Err(null("buf"));
        }
        // SAFETY: gid has 16 readable bytes (API contract).
        let g = Gid::from_slice(unsafe { std::slice::from_raw_parts(gid, 16) })?;
        if len < 40 {
            return Err(Error::new(
                ErrorKind::BufferTooSmall,
                format!("a GID string needs 40 bytes; got {len}"),
            ));
        }
        // SAFETY: buf has len >= 40 writable bytes.
        unsafe { copy_out(&g.to_string(), buf, len) };
        Ok(())
    })
}

/// Finds the GID index of the RoCE v2, IPv4-mapped GID on `fpga_ip`'s /24 for
/// `device` port `ib_port`, reading sysfs under `sysfs_root` (NULL = "/sys").
/// ROCEV2_ERR_NO_DEVICE ("No RDMA devices found on this host") or
/// ROCEV2_ERR_DEVICE_NOT_FOUND when sysfs lists no such device, checked first;
/// ROCEV2_ERR_NOT_FOUND when no GID matches.
#[no_mangle]
pub unsafe extern "C" fn rocev2_detect_gid_index(
    device: *const c_char,
    fpga_ip: *const c_char,
    ib_port: u8,
    sysfs_root: *const c_char,
    out: *mut u32,
) -> rocev2_status {
    guard("rocev2_detect_gid_index", || {
        // SAFETY: NUL-terminated strings and a caller-owned out (API contract).
        let (dev, ip, out) = unsafe {
            (
                c_str(device, "device")?,
                c_str(fpga_ip, "fpga_ip")?,
                deref_mut(out, "out")?,
            )
        };
        let root = if sysfs_root.is_null() {
            "/sys"
        } else {
            // SAFETY: as above.
            unsafe { c_str(sysfs_root, "sysfs_root") }?
        };
        let ip: Ipv4Addr = ip
            .parse()
            .map_err(|_| Error::invalid(format!("fpga_ip {ip:?} is not an IPv4 address")))?;
        crate::gid::check_device_listed(Path::new(root), dev)?;
        match crate::gid::detect_gid_index(Path::new(root), dev, ip, ib_port) {
            Some(i) => {
                *out = i;
                Ok(())
            }
            None => Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "could not auto-detect a RoCE v2 IPv4 GID on {dev} matching {ip}'s subnet — \
                     pass gidIndex explicitly (see: ibv_devinfo -v -d {dev})"
                ),
            )),
        }
    })
}
