//! The library itself: its version, its ABI version and the C API's
//! constants (literals, checked against the crate's own values).

use std::ffi::c_char;

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
