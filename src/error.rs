//! Error type shared by every layer. Each error carries a kind (mapped to a C
//! status code by the FFI layer) and a message written for the user: it names
//! the device, the value and the valid range, and says what to do.

use std::fmt;

/// What went wrong, coarsely; the message says exactly what.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A parameter is out of range or malformed.
    InvalidArgument,
    /// No RDMA device exists on this host.
    NoDevice,
    /// The named RDMA device does not exist.
    DeviceNotFound,
    /// An RDMA / verbs operation failed (resource creation, QP transition, ...).
    Device,
    /// The call is not valid in the object's current state (e.g. a second
    /// complete_connection, a callback registered after the connection).
    State,
    /// A wait timed out.
    Timeout,
    /// The server is stopped (or its receive thread ended).
    Stopped,
    /// The feature or backend is not available in this build or on this host.
    Unsupported,
    /// An operating-system call failed.
    Io,
    /// Memory could not be allocated.
    NoMemory,
    /// A release token that is unknown or was already released.
    UnknownToken,
    /// A required pointer argument was NULL (C API).
    NullPointer,
    /// A lookup found nothing (e.g. no matching GID index).
    NotFound,
    /// A caller buffer is too small for the result (C API).
    BufferTooSmall,
    /// A bug: a panic was caught or an invariant broke.
    Internal,
}

/// The error type of every fallible rocev2 call.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

/// Result alias used across the crate.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error of `kind` with a user-facing `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    /// Shorthand for [`ErrorKind::InvalidArgument`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    /// Shorthand for [`ErrorKind::State`].
    pub fn state(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::State, message)
    }
    /// Shorthand for [`ErrorKind::Device`].
    pub fn device(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Device, message)
    }
    /// An [`ErrorKind::Io`] error for the OS call `what` that failed with `err`.
    pub fn io(what: &str, err: std::io::Error) -> Self {
        Self::new(ErrorKind::Io, format!("{what} failed: {err}"))
    }
    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    /// The user-facing message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_the_message_and_kind_is_kept() {
        let e = Error::invalid("pmtu must be in the range 1..5");
        assert_eq!(e.to_string(), "pmtu must be in the range 1..5");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(format!("{e:?}").starts_with("InvalidArgument"));
        let io = Error::io("eventfd", std::io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(io.kind(), ErrorKind::Io);
        assert!(io.message().starts_with("eventfd failed: "), "{io}");
    }
}
