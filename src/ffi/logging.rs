//! Logging for C, C++ and Python hosts: `rocev2_set_log_callback` routes
//! the library's `log` records to the host (the sink itself, and the level
//! and callback types, are in log_sink.rs); otherwise they go to stderr
//! through env_logger, filtered by RUST_LOG (default: warnings and errors).

use std::ffi::{c_int, c_void};

use super::guard::{fn_name, guard};
use super::log_sink::{filter_of, rocev2_log_callback, set_callback};
use super::status::rocev2_status;
use crate::error::Error;

/// Routes library logs to `cb` at `level` and above (ROCEV2_LOG_*); NULL `cb`
/// restores the default: stderr, filtered by RUST_LOG (default warn). Global;
/// `user_data` is passed back unchanged.
///
/// Thread safety: any thread, concurrently with any call; the callback may
/// be called from any thread, also while this call replaces it (until this
/// call returns, a record may still reach the callback it replaced). The
/// callback may call this function (no lock is held while it runs); records
/// the library logs from inside the callback, on its thread, go to stderr
/// instead of re-entering it.
#[no_mangle]
pub extern "C" fn rocev2_set_log_callback(
    cb: rocev2_log_callback,
    user_data: *mut c_void,
    level: c_int,
) -> rocev2_status {
    guard(fn_name!(), || {
        let filter = filter_of(level).ok_or_else(|| {
            Error::invalid(format!(
                "log level must be 0..5 (ROCEV2_LOG_OFF..TRACE); got {level}"
            ))
        })?;
        set_callback(cb, user_data, filter);
        Ok(())
    })
}
