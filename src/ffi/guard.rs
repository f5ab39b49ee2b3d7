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

use super::log_sink;
use super::status::{rocev2_status, status_of};
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

/// Runs `body` for exported function `func`: no panic escapes, errors become
/// a status code plus the last-error message.
pub(crate) fn guard(func: &str, body: impl FnOnce() -> Result<()>) -> rocev2_status {
    log_sink::ensure_installed();
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

/// Runs `body` for an exported function that returns a value, not a status
/// (end_cause, is_running, destroy, close): as [`guard`], and `default` when
/// `body` fails or panics.
pub(crate) fn guard_or<R>(func: &str, default: R, body: impl FnOnce() -> Result<R>) -> R {
    let mut out = None;
    let _ = guard(func, || {
        out = Some(body()?);
        Ok(())
    });
    out.unwrap_or(default)
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

/// `n` values at `p` as a slice (empty when `n` is 0, whatever `p`), or a
/// NullPointer error naming `arg`.
///
/// # Safety
/// A non-null `p` must point to `n` readable, initialised `T` that live for
/// the returned lifetime.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, arg: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(null(arg));
    }
    // SAFETY: non-null with n readable T per the caller.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
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

/// Copies the calling thread's last error message into `buf` (`len` bytes,
/// always NUL-terminated when len > 0, truncated if needed) and returns its
/// full length without the NUL, so a caller can size a buffer with
/// `rocev2_last_error(NULL, 0) + 1`. Valid after a call that failed.
///
/// Thread safety: any thread; the message is the calling thread's own.
#[no_mangle]
pub unsafe extern "C" fn rocev2_last_error(buf: *mut c_char, len: usize) -> usize {
    // SAFETY: buf is NULL or has len writable bytes (API contract).
    with_last_error(|m| unsafe { copy_out(m, buf, len) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_boundary_names_the_exported_function() {
        fn rocev2_example() -> &'static str {
            fn_name!()
        }
        assert_eq!(rocev2_example(), "rocev2_example");
    }
}
