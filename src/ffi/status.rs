//! The status every C function returns (`rocev2_status`), its text
//! (`rocev2_status_str`) and the error kind each status stands for. Depends
//! on nothing else in the C API; the thread's last message is kept by the
//! boundary (guard.rs).

use std::ffi::{c_char, c_int, CStr};

use crate::error::ErrorKind;

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

/// The status an error of kind `kind` returns.
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
}
