//! Checks and tables the bindings would otherwise copy: struct sizes (so a
//! binding can check its own struct layouts at load), the path MTU and RNR
//! timer code tables, server config validation without a device, and the
//! FPGA emulator's payload pattern.

use super::device::rocev2_device_config;
use super::frame::rocev2_frame;
use super::guard::{deref_mut, fn_name, guard, null, slice};
use super::rocev2_status;
use super::server::{rocev2_host_params, rocev2_server_config, rocev2_stats, server_config_from};
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

#[cfg(test)]
mod gid_tests {
    use crate::ffi::{rocev2_gid_host_ip, rocev2_gid_parse, rocev2_status};
    use std::ffi::{c_char, CStr};
    use std::net::Ipv4Addr;

    fn host_ip(text: &CStr, len: usize) -> (rocev2_status, String) {
        let mut buf = [0 as c_char; 64];
        // SAFETY: a NUL-terminated string and a 64-byte buffer (len <= 64).
        let st = unsafe { rocev2_gid_host_ip(text.as_ptr(), buf.as_mut_ptr(), len) };
        // SAFETY: the buffer stays NUL-terminated (zeroed, copy_out terminates).
        let s = unsafe { CStr::from_ptr(buf.as_ptr()) };
        (st, s.to_string_lossy().into_owned())
    }

    #[test]
    fn gid_host_ip_maps_v4_gids_and_empties_the_rest() {
        let ok = rocev2_status::ROCEV2_OK;
        assert_eq!(
            host_ip(c"0000:0000:0000:0000:0000:ffff:0a00:0001", 64),
            (ok, "10.0.0.1".into())
        );
        assert_eq!(
            host_ip(c"fe80:0000:0000:0000:0000:0000:0a00:0001", 64),
            (ok, String::new())
        );
        assert_eq!(host_ip(c"10.0.0.1", 64), (ok, String::new()));
        let (st, _) = host_ip(c"0000:0000:0000:0000:0000:ffff:0a00:0001", 8);
        assert_eq!(st, rocev2_status::ROCEV2_ERR_BUFFER_TOO_SMALL);
    }

    /// rocev2_gid_parse: the 16 bytes, or the status.
    fn parse(text: &CStr) -> Result<[u8; 16], rocev2_status> {
        let mut out = [0u8; 16];
        // SAFETY: a NUL-terminated string and 16 writable bytes.
        match unsafe { rocev2_gid_parse(text.as_ptr(), out.as_mut_ptr()) } {
            rocev2_status::ROCEV2_OK => Ok(out),
            st => Err(st),
        }
    }

    /// Before: rocev2_gid_host_ip gave an address for groups rocev2_gid_parse
    /// rejects (not hex, a sign, 5 digits), and INVALID_ARGUMENT instead of
    /// the documented empty string for text that is not UTF-8. Both now read
    /// the groups with one parser: an address comes only from a text that
    /// rocev2_gid_parse reads as a GID ending in that address.
    #[test]
    fn gid_host_ip_and_gid_parse_agree() {
        let ok = rocev2_status::ROCEV2_OK;
        let cases: [(&CStr, &str); 13] = [
            (c"0000:0000:0000:0000:0000:ffff:0a00:0001", "10.0.0.1"),
            (c"0000:0000:0000:0000:0000:FFFF:c0a8:0164", "192.168.1.100"),
            (c"0:0:0:0:0:ffff:a00:1", "10.0.0.1"),
            (c" 0000:0000:0000:0000:0000:ffff:0a00:0001\n", "10.0.0.1"),
            (c"g000:0000:0000:0000:0000:ffff:0a00:0001", ""),
            (c"+000:0000:0000:0000:0000:ffff:0a00:0001", ""),
            (c"0000:0000:0000:0000:0000:ffff:+a00:0001", ""),
            (c"0000:0000:0000:0000:0000:ffff:0a00:-001", ""),
            (c"00000:0000:0000:0000:0000:ffff:0a00:0001", ""),
            (c"0000:0000:0000:0000:0000:ffff:0a00:00001", ""),
            (c"0000:0000:0000:0000:0000:ffff:0a00:0x01", ""),
            (c"0000:0000:0000:0000:0000:ffff:0a00:0001:", ""),
            (c"fe80:0000:0000:0000:0202:c9ff:fe00:0001", ""),
        ];
        let mut wrong = Vec::new();
        for (text, want) in cases {
            let got = host_ip(text, 64);
            if got != (ok, want.to_string()) {
                wrong.push(format!("host_ip({text:?}) = {got:?}, want {want:?}"));
            }
            let parsed = parse(text);
            let agrees = match want {
                // Rejected, or a GID that does not end in ffff:a.b.c.d.
                "" => parsed.map_or(true, |g| g[10..12] != [0xff, 0xff]),
                ip => parsed == Ok(ip.parse::<Ipv4Addr>().unwrap().to_ipv6_mapped().octets()),
            };
            if !agrees {
                wrong.push(format!("gid_parse({text:?}) = {parsed:?}, want {want:?}"));
            }
        }
        // Not UTF-8: no GID, so no address (and not an error).
        let bad = c"0000:0000:0000:0000:0000:ffff:0a00:\xff001";
        assert_eq!(parse(bad), Err(rocev2_status::ROCEV2_ERR_INVALID_ARGUMENT));
        let got = host_ip(bad, 64);
        if got != (ok, String::new()) {
            wrong.push(format!("host_ip({bad:?}) = {got:?}, want \"\""));
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // A NULL string stays an error.
        let mut buf = [0 as c_char; 16];
        // SAFETY: a NULL string (checked) and a 16-byte buffer.
        let st = unsafe { rocev2_gid_host_ip(std::ptr::null(), buf.as_mut_ptr(), 16) };
        assert_eq!(st, rocev2_status::ROCEV2_ERR_NULL_POINTER);
    }
}
