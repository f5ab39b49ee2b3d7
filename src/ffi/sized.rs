//! The ABI-2 `struct_size` rule, all of it. Every C struct the library reads
//! or writes begins with `uint32_t struct_size`, the caller's `sizeof`:
//!
//! - [`caller_size`] is the one check: NULL is refused, and a struct_size
//!   below the struct's [`SMALLEST`](SizedStruct::SMALLEST) is refused with
//!   one message shape ("`arg->struct_size is N; valid: M or more: fix`").
//! - [`read_sized`] (configs the caller passes in): fields an older, smaller
//!   struct lacks take defaults; a newer, larger struct is accepted when
//!   every byte this library does not know is zero.
//! - [`write_sized`] / [`put_sized`] (host params, stats, frames): at most
//!   struct_size bytes are written, then struct_size is set to the bytes
//!   written.
//! - [`init_sized`] (`*_init`): fills exactly the caller's `sizeof`, zero
//!   beyond the fields this library knows.

use super::guard::null;
use crate::error::{Error, Result};

/// A `#[repr(C)]` struct of plain data that begins with `uint32_t
/// struct_size` (the ABI-2 size protocol).
///
/// # Safety
/// Implementors must be `#[repr(C)]`, start with a `u32` struct_size field,
/// and be valid for any bit pattern of their bytes that the library writes.
pub(crate) unsafe trait SizedStruct: Copy {
    /// The struct's name in messages.
    const NAME: &'static str;
    /// The smallest struct_size a caller may pass. A struct the library
    /// reads: its size in the first ABI-2 release (2.0). A struct it only
    /// writes: 4 (struct_size alone; the caller gets the fields that fit),
    /// or more when a field must fit (a frame's token).
    const SMALLEST: usize;
    /// The library reads the struct (the caller fills it with `NAME_init`);
    /// false: the library only writes it.
    const READ: bool;
}

/// The caller's struct_size at `p`, checked against `T::SMALLEST`: the one
/// place the size rule refuses a struct.
///
/// # Safety
/// A non-null `p` must point to at least 4 readable bytes.
pub(crate) unsafe fn caller_size<T: SizedStruct>(p: *const T, arg: &str) -> Result<usize> {
    if p.is_null() {
        return Err(null(arg));
    }
    // SAFETY: p is non-null and starts with the u32 struct_size.
    let size = unsafe { std::ptr::read_unaligned(p as *const u32) } as usize;
    if size < T::SMALLEST {
        let fix = if T::READ {
            format!("fill it with {}_init({arg}, sizeof *{arg})", T::NAME)
        } else {
            format!("set it to sizeof({}) before the call", T::NAME)
        };
        return Err(Error::invalid(format!(
            "{arg}->struct_size is {size}; valid: {} or more: {fix}",
            T::SMALLEST
        )));
    }
    Ok(size)
}

/// Reads a caller's struct whose `struct_size` may differ from ours: fields
/// the caller's (older) struct lacks take `defaults`; a newer, larger struct
/// is accepted when every byte we do not know is zero.
///
/// # Safety
/// A non-null `p` must point to at least `struct_size` readable bytes.
pub(crate) unsafe fn read_sized<T: SizedStruct>(p: *const T, defaults: T, arg: &str) -> Result<T> {
    // SAFETY: p is NULL (refused) or has struct_size readable bytes.
    let size = unsafe { caller_size(p, arg) }?;
    let ours = std::mem::size_of::<T>();
    if size > ours {
        // SAFETY: the caller vouches for `size` readable bytes.
        let tail = unsafe { std::slice::from_raw_parts((p as *const u8).add(ours), size - ours) };
        if let Some(at) = tail.iter().position(|&b| b != 0) {
            return Err(Error::invalid(format!(
                "{arg}->struct_size is {size}; byte {} (beyond the {ours} bytes of {} this \
                 librocev2 {} knows) is not zero: the caller uses a field of a newer ABI; \
                 upgrade librocev2",
                ours + at,
                T::NAME,
                crate::VERSION
            )));
        }
    }
    let mut out = defaults;
    // SAFETY: copies min(size, ours) bytes of plain data from the caller's
    // struct into ours; both hold at least that many.
    unsafe {
        std::ptr::copy_nonoverlapping(
            p as *const u8,
            &mut out as *mut T as *mut u8,
            size.min(ours),
        )
    };
    // SAFETY: T starts with its u32 struct_size (trait contract).
    unsafe { std::ptr::write_unaligned(&mut out as *mut T as *mut u32, ours as u32) };
    Ok(out)
}

/// Writes `full` into a caller's struct of `struct_size` bytes (set by the
/// caller): at most that many, then sets struct_size to the bytes written.
///
/// # Safety
/// A non-null `p` must point to at least `struct_size` writable bytes.
pub(crate) unsafe fn write_sized<T: SizedStruct>(p: *mut T, full: T, arg: &str) -> Result<()> {
    // SAFETY: p is NULL (refused) or has struct_size writable bytes.
    let cap = unsafe { caller_size(p, arg) }?;
    // SAFETY: as above; cap passed the size rule.
    unsafe { put_sized(p, cap, full) };
    Ok(())
}

/// Writes `full` into the caller's struct at `p` of `cap` bytes, a size
/// [`caller_size`] accepted: min(cap, ours) bytes, then struct_size = that.
///
/// # Safety
/// `p` must be non-null with at least `cap` (>= 4) writable bytes.
pub(crate) unsafe fn put_sized<T: SizedStruct>(p: *mut T, cap: usize, full: T) {
    let n = cap.min(std::mem::size_of::<T>());
    // SAFETY: copies n <= cap bytes of plain data into the caller's struct,
    // then sets its first 4 bytes, struct_size.
    unsafe {
        std::ptr::copy_nonoverlapping(&full as *const T as *const u8, p as *mut u8, n);
        std::ptr::write_unaligned(p as *mut u32, n as u32);
    }
}

/// Fills a caller's struct of `size` bytes (`sizeof` as the caller compiled
/// it) with `defaults` (zero beyond the fields this library knows): exactly
/// `size` bytes, struct_size = `size`. So a newer caller that sets a field
/// this library does not know is refused by [`read_sized`], never ignored.
///
/// # Safety
/// A non-null `p` must point to at least `size` writable bytes.
pub(crate) unsafe fn init_sized<T: SizedStruct>(p: *mut T, size: usize, defaults: T) -> Result<()> {
    if p.is_null() {
        return Err(null("cfg"));
    }
    if size < 4 || size > u32::MAX as usize {
        return Err(Error::invalid(format!(
            "size is {size}; valid: 4 to {}: pass sizeof({})",
            u32::MAX,
            T::NAME
        )));
    }
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: n <= size writable bytes; plain data.
    unsafe {
        std::ptr::write_bytes(p as *mut u8, 0, size);
        std::ptr::copy_nonoverlapping(&defaults as *const T as *const u8, p as *mut u8, n);
        std::ptr::write_unaligned(p as *mut u32, size as u32);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::{rocev2_frame, rocev2_server_config, rocev2_stats};

    /// Every refusal has one shape: the argument's struct_size, the valid
    /// range, what to do (the `_init` function for a struct the library
    /// reads, sizeof for one it writes).
    #[test]
    fn one_rule_one_message_shape() {
        let cfg = rocev2_server_config {
            struct_size: 8,
            ..Default::default()
        };
        // SAFETY: a live struct of its full size.
        let e = unsafe { read_sized(&cfg, rocev2_server_config::default(), "cfg") }.unwrap_err();
        let want = format!(
            "cfg->struct_size is 8; valid: {} or more: fill it with \
             rocev2_server_config_init(cfg, sizeof *cfg)",
            std::mem::offset_of!(rocev2_server_config, measure_latency)
        );
        assert_eq!(e.message(), want);

        let mut st = rocev2_stats {
            struct_size: 3,
            ..Default::default()
        };
        // SAFETY: a live struct of its full size.
        let e = unsafe { write_sized(&mut st, rocev2_stats::default(), "out") }.unwrap_err();
        assert_eq!(
            e.message(),
            "out->struct_size is 3; valid: 4 or more: set it to sizeof(rocev2_stats) before the call"
        );
        // 4 is enough for a stats struct: struct_size alone is written back.
        st.struct_size = 4;
        // SAFETY: as above.
        unsafe { write_sized(&mut st, rocev2_stats::default(), "out") }.unwrap();
        assert_eq!(st.struct_size, 4);

        let short = std::mem::offset_of!(rocev2_frame, token) as u32;
        let fr = [short, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        // SAFETY: 40 readable bytes, starting with struct_size.
        let e = unsafe { caller_size(fr.as_ptr() as *const rocev2_frame, "frames") }.unwrap_err();
        assert!(
            e.message()
                .starts_with(&format!("frames->struct_size is {short}; valid: "))
                && e.message()
                    .ends_with("set it to sizeof(rocev2_frame) before the call"),
            "{}",
            e.message()
        );
        // SAFETY: NULL is refused before any read.
        let e = unsafe { caller_size(std::ptr::null::<rocev2_frame>(), "frame") }.unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::NullPointer);
    }
}
