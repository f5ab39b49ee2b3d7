//! The boundary: every exported function runs its body through [`guard`]
//! (named by [`fn_name!`], from the function itself), which catches panics,
//! records the thread-local last error and turns the outcome into a status
//! code. Also the pointer checks and the typed handle conversions
//! ([`BoxHandle`] for devices; server handles are registry ids, checked in
//! `handles.rs` and never dereferenced).

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The name of the enclosing function: the exported symbol, for messages.
macro_rules! fn_name {
    () => {{
        fn here() {}
        let path = $crate::ffi::guard::type_name_of(here);
        let path = path.strip_suffix("::here").unwrap_or(path);
        path.rsplit("::").next().unwrap_or(path)
    }};
}
pub(crate) use fn_name;

/// The type name of a value (for [`fn_name!`]).
pub(crate) fn type_name_of<T>(_: T) -> &'static str {
    std::any::type_name::<T>()
}

use super::rocev2_status;
use crate::error::{Error, ErrorKind, Result};

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

pub(crate) fn set_last_error(msg: &str) {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        e.clear();
        e.push_str(msg);
    });
}

pub(crate) fn with_last_error<R>(f: impl FnOnce(&str) -> R) -> R {
    LAST_ERROR.with(|e| f(&e.borrow()))
}

pub(crate) fn status_of(kind: ErrorKind) -> rocev2_status {
    use rocev2_status::*;
    match kind {
        ErrorKind::InvalidArgument => ROCEV2_ERR_INVALID_ARGUMENT,
        ErrorKind::NullPointer => ROCEV2_ERR_NULL_POINTER,
        ErrorKind::NoDevice => ROCEV2_ERR_NO_DEVICE,
        ErrorKind::DeviceNotFound => ROCEV2_ERR_DEVICE_NOT_FOUND,
        ErrorKind::Device => ROCEV2_ERR_DEVICE,
        ErrorKind::State => ROCEV2_ERR_STATE,
        ErrorKind::Timeout => ROCEV2_ERR_TIMEOUT,
        ErrorKind::Stopped => ROCEV2_ERR_STOPPED,
        ErrorKind::Unsupported => ROCEV2_ERR_UNSUPPORTED,
        ErrorKind::Io => ROCEV2_ERR_IO,
        ErrorKind::NoMemory => ROCEV2_ERR_NO_MEMORY,
        ErrorKind::UnknownToken => ROCEV2_ERR_UNKNOWN_TOKEN,
        ErrorKind::NotFound => ROCEV2_ERR_NOT_FOUND,
        ErrorKind::BufferTooSmall => ROCEV2_ERR_BUFFER_TOO_SMALL,
        ErrorKind::Internal => ROCEV2_ERR_INTERNAL,
    }
}

/// Runs `body` for exported function `func`: no panic escapes, errors become
/// a status code plus the last-error message.
pub(crate) fn guard(func: &str, body: impl FnOnce() -> Result<()>) -> rocev2_status {
    super::logging::ensure_installed();
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => rocev2_status::ROCEV2_OK,
        Ok(Err(e)) => {
            log::debug!("{func} failed: {e}");
            set_last_error(e.message());
            status_of(e.kind())
        }
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            let msg = format!("internal error in {func}: {what} (please report this bug)");
            log::error!("{msg}");
            set_last_error(&msg);
            rocev2_status::ROCEV2_ERR_PANIC
        }
    }
}

/// Runs `body` for an exported function that returns no status (destroy,
/// close): panics are caught and logged.
pub(crate) fn guard_void(func: &str, body: impl FnOnce()) {
    let _ = guard(func, || {
        body();
        Ok(())
    });
}

pub(crate) fn null(arg: &str) -> Error {
    Error::new(ErrorKind::NullPointer, format!("argument `{arg}` is NULL"))
}

/// `&*p`, or a NullPointer error naming `arg`.
///
/// # Safety
/// A non-null `p` must point to a valid, live `T` for the returned lifetime.
pub(crate) unsafe fn deref<'a, T>(p: *const T, arg: &str) -> Result<&'a T> {
    // SAFETY: the caller guarantees validity when non-null.
    unsafe { p.as_ref() }.ok_or_else(|| null(arg))
}

/// `&mut *p`, or a NullPointer error naming `arg`.
///
/// # Safety
/// A non-null `p` must point to a valid, live, unaliased `T`.
pub(crate) unsafe fn deref_mut<'a, T>(p: *mut T, arg: &str) -> Result<&'a mut T> {
    // SAFETY: the caller guarantees validity when non-null.
    unsafe { p.as_mut() }.ok_or_else(|| null(arg))
}

/// A UTF-8 string argument.
///
/// # Safety
/// A non-null `p` must point to a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, arg: &str) -> Result<&'a str> {
    if p.is_null() {
        return Err(null(arg));
    }
    // SAFETY: non-null and NUL-terminated per the caller.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Error::invalid(format!("argument `{arg}` is not valid UTF-8")))
}

/// Copies `text` NUL-terminated into `buf` of `len` bytes, truncating; returns
/// the full length of `text` (without the NUL).
///
/// # Safety
/// `buf` must be NULL or point to `len` writable bytes.
pub(crate) unsafe fn copy_out(text: &str, buf: *mut c_char, len: usize) -> usize {
    if !buf.is_null() && len > 0 {
        let n = text.len().min(len - 1);
        // SAFETY: n + 1 <= len bytes are writable at buf; source has n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr() as *const c_char, buf, n);
            *buf.add(n) = 0;
        }
    }
    text.len()
}

/// A C handle type (opaque to C) whose pointers own a `Box<Self::Rust>`:
/// made by [`into_raw`](Self::into_raw), borrowed by [`borrow`](Self::borrow),
/// freed once by [`free`](Self::free).
pub(crate) trait BoxHandle: Sized {
    /// The Rust value behind the handle.
    type Rust;

    /// Hands `v` to C.
    fn into_raw(v: Self::Rust) -> *mut Self {
        Box::into_raw(Box::new(v)) as *mut Self
    }

    /// The value behind a handle, or a NullPointer error naming `arg`.
    ///
    /// # Safety
    /// A non-null `p` must come from [`into_raw`](Self::into_raw) and not be freed.
    unsafe fn borrow<'a>(p: *const Self, arg: &str) -> Result<&'a Self::Rust> {
        // SAFETY: per the caller, p is null or a live Box<Self::Rust>.
        unsafe { deref(p as *const Self::Rust, arg) }
    }

    /// Frees a handle (NULL is ignored).
    ///
    /// # Safety
    /// A non-null `p` must come from [`into_raw`](Self::into_raw), freed once.
    unsafe fn free(p: *mut Self) {
        if !p.is_null() {
            // SAFETY: per the caller, p is a live Box<Self::Rust>, freed once here.
            drop(unsafe { Box::from_raw(p as *mut Self::Rust) });
        }
    }
}

/// A `#[repr(C)]` struct of plain data that begins with `uint32_t
/// struct_size` (the ABI-2 size protocol).
///
/// # Safety
/// Implementors must be `#[repr(C)]`, start with a `u32` struct_size field,
/// and be valid for any bit pattern of their bytes that the library writes.
pub(crate) unsafe trait Sized2: Copy {
    /// The struct's name in messages.
    const NAME: &'static str;
    /// The smallest size a caller may pass when the library *reads* the
    /// struct: its size in the first ABI-2 release (2.0).
    const FIRST_SIZE: usize;
}

/// Reads a caller's struct whose `struct_size` may differ from ours: fields
/// the caller's (older) struct lacks take `defaults`; a newer, larger struct
/// is accepted when every byte we do not know is zero.
///
/// # Safety
/// A non-null `p` must point to at least `struct_size` readable bytes.
pub(crate) unsafe fn read_sized<T: Sized2>(p: *const T, defaults: T, arg: &str) -> Result<T> {
    if p.is_null() {
        return Err(null(arg));
    }
    // SAFETY: p is non-null and starts with the u32 struct_size.
    let size = unsafe { std::ptr::read_unaligned(p as *const u32) } as usize;
    let ours = std::mem::size_of::<T>();
    if size < T::FIRST_SIZE {
        return Err(Error::invalid(format!(
            "{}.struct_size is {size}; valid: {} or more (the ABI-2 size): initialise it with \
             {}_init(&cfg, sizeof cfg)",
            T::NAME,
            T::FIRST_SIZE,
            T::NAME
        )));
    }
    if size > ours {
        // SAFETY: the caller vouches for `size` readable bytes.
        let tail = unsafe { std::slice::from_raw_parts((p as *const u8).add(ours), size - ours) };
        if let Some(at) = tail.iter().position(|&b| b != 0) {
            return Err(Error::invalid(format!(
                "{} has {size} bytes and byte {} (beyond the {ours} this librocev2 {} knows) \
                 is not zero: the caller uses a field of a newer ABI; upgrade librocev2",
                T::NAME,
                ours + at,
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
pub(crate) unsafe fn write_sized<T: Sized2>(p: *mut T, full: T, arg: &str) -> Result<()> {
    if p.is_null() {
        return Err(null(arg));
    }
    // SAFETY: p is non-null and starts with the u32 struct_size.
    let cap = unsafe { std::ptr::read_unaligned(p as *const u32) } as usize;
    if cap < 4 {
        return Err(Error::invalid(format!(
            "{arg}->struct_size is {cap}: set it to sizeof({}) before the call",
            T::NAME
        )));
    }
    let n = cap.min(std::mem::size_of::<T>());
    // SAFETY: copies n <= cap bytes of plain data into the caller's struct.
    unsafe { std::ptr::copy_nonoverlapping(&full as *const T as *const u8, p as *mut u8, n) };
    // SAFETY: as above; the first 4 bytes are the caller's struct_size.
    unsafe { std::ptr::write_unaligned(p as *mut u32, n as u32) };
    Ok(())
}

/// Fills a caller's struct of `size` bytes (`sizeof` as the caller compiled
/// it) with `defaults` (zero beyond the fields this library knows): exactly
/// `size` bytes, struct_size = `size`. So a newer caller that sets a field
/// this library does not know is refused by [`read_sized`], never ignored.
///
/// # Safety
/// A non-null `p` must point to at least `size` writable bytes.
pub(crate) unsafe fn init_sized<T: Sized2>(p: *mut T, size: usize, defaults: T) -> Result<()> {
    if p.is_null() {
        return Err(null("cfg"));
    }
    if size < 4 || size > u32::MAX as usize {
        return Err(Error::invalid(format!(
            "size {size} is not a struct size for {}: pass sizeof({})",
            T::NAME,
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
