//! The stable C API (ABI v2). `include/rocev2.h` is generated from these
//! files by cbindgen; the header test fails when it is stale. One file per
//! handle: `device.rs`, `server.rs`, `frame.rs`, `gid.rs`, `logging.rs`, and
//! `checks.rs` (struct sizes, code tables, validation, the emulator's pattern);
//! `guard.rs` is the boundary every function goes through; `sized.rs` holds
//! the `struct_size` rule (every sized struct is read or written through it).
//!
//! Rules for every function:
//! - Returns a `rocev2_status` (`ROCEV2_OK` = 0) unless documented otherwise;
//!   after a failure `rocev2_last_error` gives a message for the calling thread.
//! - Every pointer argument is checked; NULL gives `ROCEV2_ERR_NULL_POINTER`.
//! - No panic unwinds into the caller: an internal bug gives `ROCEV2_ERR_PANIC`.
//! - Config structs carry `struct_size`: fill them with the `*_init` functions.
//! - Safety: a pointer argument is NULL or valid for its type and documented
//!   size; handles come from this library and are not used after destroy/close
//!   (except rocev2_server_release for outstanding tokens). Server handles
//!   are checked ids, not pointers: a destroyed or made-up one is refused
//!   with an error (ROCEV2_ERR_UNKNOWN_TOKEN from the release calls).

#![allow(non_camel_case_types)]
// Every exported function (here and in the submodules, which this allow
// covers) has one safety contract, stated in the module docs and in the
// header: a pointer argument is NULL or valid for its type.
#![allow(clippy::missing_safety_doc)]

mod checks;
mod device;
mod frame;
mod gid;
pub(crate) mod guard;
mod handles;
mod logging;
mod server;
mod sized;

use std::ffi::{c_char, c_int, CStr};

use guard::copy_out;

pub use checks::*;
pub use device::*;
pub use frame::*;
pub use gid::*;
pub use logging::*;
pub use server::*;

/// ABI version of this header; `rocev2_abi_version()` returns the library's.
pub const ROCEV2_ABI_VERSION: u32 = 2;
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

impl rocev2_status {
    /// Every status, in code order.
    pub const ALL: [rocev2_status; 17] = {
        use rocev2_status::*;
        [
            ROCEV2_OK,
            ROCEV2_ERR_INVALID_ARGUMENT,
            ROCEV2_ERR_NULL_POINTER,
            ROCEV2_ERR_NO_DEVICE,
            ROCEV2_ERR_DEVICE_NOT_FOUND,
            ROCEV2_ERR_DEVICE,
            ROCEV2_ERR_STATE,
            ROCEV2_ERR_TIMEOUT,
            ROCEV2_ERR_STOPPED,
            ROCEV2_ERR_UNSUPPORTED,
            ROCEV2_ERR_IO,
            ROCEV2_ERR_NO_MEMORY,
            ROCEV2_ERR_UNKNOWN_TOKEN,
            ROCEV2_ERR_NOT_FOUND,
            ROCEV2_ERR_BUFFER_TOO_SMALL,
            ROCEV2_ERR_PANIC,
            ROCEV2_ERR_INTERNAL,
        ]
    };

    /// Its description (what `rocev2_status_str` returns).
    pub fn text(self) -> &'static CStr {
        use rocev2_status::*;
        match self {
            ROCEV2_OK => c"ok",
            ROCEV2_ERR_INVALID_ARGUMENT => c"invalid argument",
            ROCEV2_ERR_NULL_POINTER => c"null pointer",
            ROCEV2_ERR_NO_DEVICE => c"no RDMA device",
            ROCEV2_ERR_DEVICE_NOT_FOUND => c"device not found",
            ROCEV2_ERR_DEVICE => c"device error",
            ROCEV2_ERR_STATE => c"invalid state",
            ROCEV2_ERR_TIMEOUT => c"timeout",
            ROCEV2_ERR_STOPPED => c"stopped",
            ROCEV2_ERR_UNSUPPORTED => c"unsupported",
            ROCEV2_ERR_IO => c"I/O error",
            ROCEV2_ERR_NO_MEMORY => c"out of memory",
            ROCEV2_ERR_UNKNOWN_TOKEN => c"unknown token",
            ROCEV2_ERR_NOT_FOUND => c"not found",
            ROCEV2_ERR_BUFFER_TOO_SMALL => c"buffer too small",
            ROCEV2_ERR_PANIC => c"internal error (panic)",
            ROCEV2_ERR_INTERNAL => c"internal error",
        }
    }
}

// ---------------------------------------------------------------------------
// Library
// ---------------------------------------------------------------------------

/// The library version, e.g. "2.1.0" (a static string the library owns;
/// never fails).
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub extern "C" fn rocev2_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}

/// The library's ABI version; compare with ROCEV2_ABI_VERSION.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub extern "C" fn rocev2_abi_version() -> u32 {
    crate::ABI_VERSION
}

/// A static description of a status code ("unknown status" for other
/// values); the library owns the string.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub extern "C" fn rocev2_status_str(status: c_int) -> *const c_char {
    let text = rocev2_status::ALL
        .iter()
        .find(|s| **s as c_int == status)
        .map_or(c"unknown status", |s| s.text());
    text.as_ptr()
}

/// Copies the calling thread's last error message into `buf` (`len` bytes,
/// always NUL-terminated when len > 0, truncated if needed) and returns its
/// full length without the NUL, so a caller can size a buffer with
/// `rocev2_last_error(NULL, 0) + 1`. Valid after a call that failed.
///
/// Thread safety: any thread; the message is the calling thread's own.
#[no_mangle]
pub unsafe extern "C" fn rocev2_last_error(buf: *mut c_char, len: usize) -> usize {
    // SAFETY: buf is NULL or has len writable bytes (API contract).
    guard::with_last_error(|m| unsafe { copy_out(m, buf, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_numbered_in_order_and_described() {
        for (i, s) in rocev2_status::ALL.iter().enumerate() {
            assert_eq!(*s as usize, i);
            // SAFETY: rocev2_status_str returns a static NUL-terminated string.
            let text = unsafe { CStr::from_ptr(rocev2_status_str(i as c_int)) };
            assert_eq!(text, s.text());
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(rocev2_status_str(99)) };
        assert_eq!(unknown, c"unknown status");
    }

    #[test]
    fn the_boundary_names_the_exported_function() {
        fn rocev2_example() -> &'static str {
            guard::fn_name!()
        }
        assert_eq!(rocev2_example(), "rocev2_example");
    }
}
