//! The stable C API (ABI v2), a face only: module docs and re-exports.
//! `include/rocev2.h` is generated from these files by cbindgen; the header
//! test fails when it is stale. `library.rs` holds the version and the
//! constants; `status.rs` the status every function returns; one file per
//! handle: `device.rs`, `server.rs`, `frame.rs`, `gid.rs`, `logging.rs`
//! (the sink behind it in `log_sink.rs`), and `checks.rs` (struct sizes, code
//! tables, validation, the emulator's pattern); `guard.rs` is the boundary
//! every function goes through (and keeps the thread's last error);
//! `handles.rs` the server handle registry; `sized.rs` holds the
//! `struct_size` rule (every sized struct is read or written through it).
//!
//! No circles: `status` and `log_sink` depend on nothing here; `guard` on
//! them; `sized` on `guard`; `handles` on nothing here; `frame` on `handles`;
//! `server` on `frame` and `handles`; `checks` on the handles' structs.
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

// Declared in the header's order (cbindgen reads them in this order).
mod library;

mod status;

pub(crate) mod guard;

mod checks;
mod device;
mod frame;
mod gid;
mod handles;
mod log_sink;
mod logging;
mod server;
mod sized;

pub use checks::*;
pub use device::*;
pub use frame::*;
pub use gid::*;
pub use guard::rocev2_last_error;
pub use handles::rocev2_server;
pub use library::*;
pub use log_sink::{rocev2_log_callback, rocev2_log_level};
pub use logging::*;
pub use server::*;
pub use status::*;
