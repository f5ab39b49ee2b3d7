//! Checks and tables the bindings would otherwise copy: struct sizes (so a
//! binding can check its own struct layouts at load), the path MTU and RNR
//! timer code tables, server config validation without a device, and the
//! FPGA emulator's payload pattern.

use super::device::rocev2_device_config;
use super::frame::rocev2_frame;
use super::guard::{deref_mut, fn_name, guard, null, slice};
use super::server::{rocev2_host_params, rocev2_server_config, rocev2_stats, server_config_from};
use super::status::rocev2_status;
use crate::config::{Mtu, RnrTimer};
use crate::emulator::pattern;
use crate::error::Error;

/// rocev2_struct_size: `rocev2_device_config`.
pub const ROCEV2_STRUCT_DEVICE_CONFIG: u32 = 1;
/// rocev2_struct_size: `rocev2_server_config`.
pub const ROCEV2_STRUCT_SERVER_CONFIG: u32 = 2;
/// rocev2_struct_size: `rocev2_host_params`.
pub const ROCEV2_STRUCT_HOST_PARAMS: u32 = 3;
/// rocev2_struct_size: `rocev2_frame`.
pub const ROCEV2_STRUCT_FRAME: u32 = 4;
/// rocev2_struct_size: `rocev2_stats`.
pub const ROCEV2_STRUCT_STATS: u32 = 5;

/// The size in bytes of one of this library's structs (`which` is a
/// ROCEV2_STRUCT_* value), 0 for an unknown `which`. A binding that declares
/// the structs itself (Python's ctypes) compares its sizes with these at
/// load: smaller here means the library is older than the binding.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub extern "C" fn rocev2_struct_size(which: u32) -> usize {
    use std::mem::size_of;
    match which {
        ROCEV2_STRUCT_DEVICE_CONFIG => size_of::<rocev2_device_config>(),
        ROCEV2_STRUCT_SERVER_CONFIG => size_of::<rocev2_server_config>(),
        ROCEV2_STRUCT_HOST_PARAMS => size_of::<rocev2_host_params>(),
        ROCEV2_STRUCT_FRAME => size_of::<rocev2_frame>(),
        ROCEV2_STRUCT_STATS => size_of::<rocev2_stats>(),
        _ => 0,
    }
}

/// Validates a server config (size protocol as rocev2_server_create) without
/// a device: payload size, queue depth, the MR length's 32-bit limit, CPU
/// affinity. The same checks and messages as rocev2_server_create.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_config_check(
    cfg: *const rocev2_server_config,
) -> rocev2_status {
    guard(fn_name!(), || {
        if cfg.is_null() {
            return Err(null("cfg"));
        }
        // SAFETY: non-null, struct_size readable bytes (API contract).
        unsafe { server_config_from(cfg) }.map(|_| ())
    })
}

/// The payload bytes of path MTU code `pmtu` (1=256 .. 5=4096, libibverbs'
/// ibv_mtu) into `bytes`; ROCEV2_ERR_INVALID_ARGUMENT for other codes.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_pmtu_bytes(pmtu: u32, bytes: *mut u32) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: NULL or a valid u32 (API contract).
        let out = unsafe { deref_mut(bytes, "bytes") }?;
        *out = Mtu::from_code(pmtu)?.bytes();
        Ok(())
    })
}

/// The wait in microseconds of IB min RNR NAK timer code `code` (0..31, IBA
/// vol 1 table 45: 1 = 10 us .. 31 = 491520 us, 0 = 655360 us) into `us`;
/// ROCEV2_ERR_INVALID_ARGUMENT for other codes.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_rnr_timer_us(code: u32, us: *mut u32) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: NULL or a valid u32 (API contract).
        let out = unsafe { deref_mut(us, "us") }?;
        *out = RnrTimer::from_code(code)?.micros();
        Ok(())
    })
}

/// Checks a payload of the FPGA emulator's pattern (`rocev2 fpga-sim`: bytes
/// 0..8 the frame's sequence number, little-endian, then xorshift32 words
/// seeded from it) and writes the sequence number to `seq`.
/// ROCEV2_ERR_INVALID_ARGUMENT (the message says where it differs) when the
/// payload is shorter than 8 bytes or differs. `data` may be NULL when `len`
/// is 0.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_pattern_check(
    data: *const u8,
    len: usize,
    seq: *mut u64,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: NULL or a valid u64 (API contract).
        let out = unsafe { deref_mut(seq, "seq") }?;
        // SAFETY: data is NULL or has len readable bytes (API contract).
        let bytes = unsafe { slice(data, len, "data") }?;
        *out = pattern::check(bytes).map_err(Error::invalid)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_sizes_name_each_struct_and_zero_for_others() {
        assert_eq!(
            rocev2_struct_size(ROCEV2_STRUCT_FRAME),
            std::mem::size_of::<rocev2_frame>()
        );
        assert_eq!(
            rocev2_struct_size(ROCEV2_STRUCT_STATS),
            std::mem::size_of::<rocev2_stats>()
        );
        assert_eq!(rocev2_struct_size(0), 0);
        assert_eq!(rocev2_struct_size(6), 0);
    }

    #[test]
    fn pmtu_and_rnr_tables_answer_and_refuse() {
        let mut v = 0u32;
        // SAFETY: a valid out pointer.
        unsafe {
            assert_eq!(rocev2_pmtu_bytes(5, &mut v), rocev2_status::ROCEV2_OK);
            assert_eq!(v, 4096);
            assert_eq!(
                rocev2_pmtu_bytes(6, &mut v),
                rocev2_status::ROCEV2_ERR_INVALID_ARGUMENT
            );
            assert_eq!(rocev2_rnr_timer_us(1, &mut v), rocev2_status::ROCEV2_OK);
            assert_eq!(v, 10);
            assert_eq!(rocev2_rnr_timer_us(0, &mut v), rocev2_status::ROCEV2_OK);
            assert_eq!(v, 655_360);
            assert_eq!(
                rocev2_rnr_timer_us(32, &mut v),
                rocev2_status::ROCEV2_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                rocev2_rnr_timer_us(1, std::ptr::null_mut()),
                rocev2_status::ROCEV2_ERR_NULL_POINTER
            );
        }
    }

    #[test]
    fn pattern_check_gives_the_sequence_or_refuses() {
        let good = pattern::make(42, 100);
        let mut seq = 0u64;
        // SAFETY: valid buffers of the given lengths.
        unsafe {
            assert_eq!(
                rocev2_pattern_check(good.as_ptr(), good.len(), &mut seq),
                rocev2_status::ROCEV2_OK
            );
            assert_eq!(seq, 42);
            let mut bad = good.clone();
            bad[50] ^= 1;
            assert_eq!(
                rocev2_pattern_check(bad.as_ptr(), bad.len(), &mut seq),
                rocev2_status::ROCEV2_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                rocev2_pattern_check(std::ptr::null(), 0, &mut seq),
                rocev2_status::ROCEV2_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                rocev2_pattern_check(std::ptr::null(), 8, &mut seq),
                rocev2_status::ROCEV2_ERR_NULL_POINTER
            );
        }
    }

    #[test]
    fn server_config_check_refuses_an_mr_over_4_gib() {
        let mut c = rocev2_server_config::default(); // struct_size = sizeof
                                                     // SAFETY: a valid, sized config.
        unsafe {
            assert_eq!(rocev2_server_config_check(&c), rocev2_status::ROCEV2_OK);
            c.max_payload = 65536;
            c.rx_queue_depth = 65536;
            assert_eq!(
                rocev2_server_config_check(&c),
                rocev2_status::ROCEV2_ERR_INVALID_ARGUMENT
            );
            assert_eq!(
                rocev2_server_config_check(std::ptr::null()),
                rocev2_status::ROCEV2_ERR_NULL_POINTER
            );
        }
    }
}
