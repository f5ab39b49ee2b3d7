//! GID helpers: parse, format, detect the GID index from sysfs.

use std::ffi::{c_char, CStr};
use std::net::Ipv4Addr;
use std::path::Path;

use super::guard::{c_str, copy_out, deref_mut, fn_name, guard, null, slice};
use super::status::rocev2_status;
use crate::error::{Error, ErrorKind};
use crate::gid::Gid;

/// Parses a GID: "0000:0000:0000:0000:0000:ffff:0a00:0001" (ibv_devinfo form),
/// IPv6 text ("::ffff:10.0.0.1") or an IPv4 address ("10.0.0.1", mapped).
/// Writes 16 bytes to `out` (the caller's).
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_gid_parse(text: *const c_char, out: *mut u8) -> rocev2_status {
    guard(fn_name!(), || {
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

/// Formats 16 GID bytes in ibv_devinfo form into `buf` (40 bytes needed; the
/// caller's).
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_gid_format(
    gid: *const u8,
    buf: *mut c_char,
    len: usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: gid is NULL or has 16 readable bytes (API contract).
        let raw = unsafe { slice(gid, 16, "gid") }?;
        if buf.is_null() {
            return Err(null("buf"));
        }
        let g = Gid::from_slice(raw)?;
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

/// The IPv4 address of an IPv4-mapped GID string in ibv_devinfo form
/// ("0000:0000:0000:0000:0000:ffff:0a00:0001" -> "10.0.0.1"; exactly 8
/// groups of hex digits as rocev2_gid_parse reads them, group 5 `ffff`),
/// copied into `buf` (16 bytes suffice; the caller's); an empty string for
/// any other text, text that is not UTF-8 included (pyrogue's
/// `_host_ip_from_gid`). ROCEV2_ERR_BUFFER_TOO_SMALL when the address does
/// not fit.
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_gid_host_ip(
    gid: *const c_char,
    buf: *mut c_char,
    len: usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        if gid.is_null() {
            return Err(null("gid"));
        }
        if buf.is_null() {
            return Err(null("buf"));
        }
        // SAFETY: non-NULL and NUL-terminated per the API contract.
        let t = unsafe { CStr::from_ptr(gid) }.to_bytes();
        // Text that is not UTF-8 is no GID, so it has no address.
        let ip = std::str::from_utf8(t).map_or(String::new(), crate::gid::host_ip_from_gid);
        if len <= ip.len() {
            return Err(Error::new(
                ErrorKind::BufferTooSmall,
                format!("the address {ip} needs {} bytes; got {len}", ip.len() + 1),
            ));
        }
        // SAFETY: buf has len > ip.len() writable bytes.
        unsafe { copy_out(&ip, buf, len) };
        Ok(())
    })
}

/// Finds the GID index of the RoCE v2, IPv4-mapped GID on `fpga_ip`'s /24 for
/// `device` port `ib_port`, reading sysfs under `sysfs_root` (NULL = "/sys").
/// ROCEV2_ERR_NO_DEVICE ("No RDMA devices found on this host") or
/// ROCEV2_ERR_DEVICE_NOT_FOUND when sysfs lists no such device, checked first;
/// ROCEV2_ERR_NOT_FOUND when no GID matches. (rocev2_detect_gid_index before
/// ABI 2.)
///
/// Thread safety: any thread, concurrently with any call.
#[no_mangle]
pub unsafe extern "C" fn rocev2_gid_detect_index(
    device: *const c_char,
    fpga_ip: *const c_char,
    ib_port: u8,
    sysfs_root: *const c_char,
    out: *mut u32,
) -> rocev2_status {
    guard(fn_name!(), || {
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

#[cfg(test)]
mod tests {
    use super::*;

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
