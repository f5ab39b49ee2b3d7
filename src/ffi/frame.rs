//! Frames on loan: the C view of a frame, pulling frames, releasing tokens.

// Every exported function has one safety contract, stated in the module docs
// and in the header: a pointer argument is NULL or valid for its type.
#![allow(clippy::missing_safety_doc)]

use std::time::Duration;

use super::guard::{deref_mut, fn_name, guard, ArcHandle};
use super::rocev2_status;
use super::server::{core_arc, core_ref, rocev2_server};
use crate::error::{Error, ErrorKind};
use crate::server::Frame;

/// A received frame on loan. `data` points into the receive slab (zero copy)
/// and stays valid until `token` is released with rocev2_server_release.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_frame {
    /// Payload (inside the slab).
    pub data: *const u8,
    /// Payload length in bytes.
    pub len: u32,
    /// Channel: immediate bits [7:0].
    pub channel: u32,
    /// The raw immediate value, host byte order (bits [31:8]: FPGA ring position).
    pub immediate: u32,
    /// Receive slot index.
    pub slot: u32,
    /// Release token: pass to rocev2_server_release exactly once. Never 0.
    pub token: u64,
}

/// Hands a frame's loan to C: its token now holds the frame's reference.
pub(crate) fn to_frame(f: Frame) -> rocev2_frame {
    let data = f.data().as_ptr();
    let (len, channel, immediate, slot) = (
        f.len(),
        f.channel() as u32,
        f.immediate().unwrap_or(0),
        f.slot(),
    );
    let (token, _core) = f.into_token();
    rocev2_frame {
        data,
        len,
        channel,
        immediate,
        slot,
        token,
    }
}

/// Waits up to `timeout_ms` (-1: forever, 0: no wait) for the next frame when
/// no callback is registered. ROCEV2_OK fills `*frame` (release its token);
/// ROCEV2_ERR_TIMEOUT if none arrived; ROCEV2_ERR_STOPPED once the server is
/// stopped. Thread-safe.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_poll_frame(
    srv: *mut rocev2_server,
    timeout_ms: i32,
    frame: *mut rocev2_frame,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: checked pointer, caller-owned.
        let frame = unsafe { deref_mut(frame, "frame") }?;
        let core = core_arc(srv)?;
        let timeout = match timeout_ms {
            -1 => None,
            t if t >= 0 => Some(Duration::from_millis(t as u64)),
            t => {
                return Err(Error::invalid(format!(
                    "timeout_ms must be -1 or >= 0; got {t}"
                )))
            }
        };
        match core.poll_frame(timeout)? {
            Some(f) => {
                *frame = to_frame(f);
                Ok(())
            }
            None => Err(Error::new(
                ErrorKind::Timeout,
                format!("no frame within {timeout_ms} ms"),
            )),
        }
    })
}

/// Releases a frame's loan; its slot is re-posted. Exactly once per token,
/// from any thread, at any time (also inside the callback, after stop, and
/// after destroy for tokens still outstanding). Never blocks.
/// ROCEV2_ERR_UNKNOWN_TOKEN for an unknown or already released token.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_release(
    srv: *mut rocev2_server,
    token: u64,
) -> rocev2_status {
    guard(fn_name!(), || {
        let core = core_ref(srv)?;
        core.release_token(token)?;
        // SAFETY: the loan just released held one strong reference handed out
        // by Frame::into_token for this same core; give it back. This may free
        // the core (after destroy), so `core` is not used afterwards.
        drop(unsafe { rocev2_server::take(srv) });
        Ok(())
    })
}
