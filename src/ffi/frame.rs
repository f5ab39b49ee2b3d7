//! Frames on loan: the C view of a frame, pulling frames, releasing tokens.

use std::time::Duration;

use super::guard::{fn_name, guard, slice};
use super::handles::{self, core_ref, rocev2_server};
use super::sized::{caller_size, put_sized, SizedStruct};
use super::status::rocev2_status;
use crate::error::{Error, ErrorKind};
use crate::server::{Frame, RxTimeSource};

/// `rocev2_frame.flags`: the message carried an immediate (`channel` and
/// `immediate` are valid; surf's engine always sends one).
pub const ROCEV2_FRAME_HAS_IMMEDIATE: u32 = 1;
/// `rocev2_frame.flags`: `rx_time_ns` is the kernel's receive stamp of the
/// frame's last packet (soft backend; SO_TIMESTAMPNS, CLOCK_REALTIME). Since 2.4.
pub const ROCEV2_FRAME_RX_TIME_KERNEL: u32 = 2;
/// `rocev2_frame.flags`: `rx_time_ns` is the host clock (CLOCK_REALTIME)
/// when the receive thread polled the completion (verbs backend: the NIC
/// delivers without the kernel). Since 2.4.
pub const ROCEV2_FRAME_RX_TIME_POLL: u32 = 4;
/// `rocev2_frame.flags`: `rx_time_ns` is the NIC's completion timestamp,
/// converted to the host clock (CLOCK_REALTIME; verbs backend on a device
/// that stamps completions, such as mlx5). Since 2.4.
pub const ROCEV2_FRAME_RX_TIME_NIC: u32 = 8;

/// A received frame on loan. `data` points into the receive slab (zero copy)
/// and stays valid until `token` is released with rocev2_server_release. A
/// frame may be empty (`len` 0: a 0-byte message is a loan like any other).
/// For rocev2_server_poll_frame set `struct_size` to sizeof(rocev2_frame).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_frame {
    /// In (poll_frame): the caller's sizeof(rocev2_frame). Out: bytes written.
    pub struct_size: u32,
    /// ROCEV2_FRAME_* bits.
    pub flags: u32,
    /// Payload (inside the slab).
    pub data: *const u8,
    /// Payload length in bytes.
    pub len: u32,
    /// Channel: immediate bits \[7:0\] (0 without an immediate).
    pub channel: u32,
    /// The raw immediate value, host byte order (bits \[31:8\]: FPGA ring
    /// position; 0 without an immediate, see `flags`).
    pub immediate: u32,
    /// Receive slot index.
    pub slot: u32,
    /// Release token: pass to rocev2_server_release exactly once. Never 0.
    pub token: u64,
    /// When the frame's last packet was received: CLOCK_REALTIME,
    /// nanoseconds since the Unix epoch; `flags` says whose stamp
    /// (ROCEV2_FRAME_RX_TIME_KERNEL, _NIC or _POLL). Written when struct_size
    /// covers it (poll: the caller's struct_size; callback: always). Since 2.4.
    pub rx_time_ns: u64,
}

// SAFETY: #[repr(C)], starts with u32 struct_size, plain data.
unsafe impl SizedStruct for rocev2_frame {
    const NAME: &'static str = "rocev2_frame";
    // Written only, but the token must fit: ABI 2.0's struct, which ended
    // after it.
    const SMALLEST: usize = std::mem::offset_of!(rocev2_frame, rx_time_ns);
    const READ: bool = false;
}

/// Hands a frame's loan to C as a token (the core keeps the frame's
/// reference for it until the token is released).
pub(crate) fn to_frame(f: Frame) -> rocev2_frame {
    // Pointer and length from one slice: they always describe readable bytes.
    let (data, len) = (f.data().as_ptr(), f.data().len() as u32);
    let (channel, immediate, slot) = (f.channel() as u32, f.immediate().unwrap_or(0), f.slot());
    let rx_time_ns = f.rx_time_ns();
    let flags = if f.has_immediate() {
        ROCEV2_FRAME_HAS_IMMEDIATE
    } else {
        0
    } | match f.rx_time_source() {
        RxTimeSource::Kernel => ROCEV2_FRAME_RX_TIME_KERNEL,
        RxTimeSource::Poll => ROCEV2_FRAME_RX_TIME_POLL,
        RxTimeSource::Nic => ROCEV2_FRAME_RX_TIME_NIC,
    };
    let token = f.into_token();
    rocev2_frame {
        struct_size: std::mem::size_of::<rocev2_frame>() as u32,
        flags,
        data,
        len,
        channel,
        immediate,
        slot,
        token,
        rx_time_ns,
    }
}

/// `timeout_ms` as a wait: -1 forever, 0 none, else milliseconds.
fn timeout_of(timeout_ms: i32) -> crate::error::Result<Option<Duration>> {
    match timeout_ms {
        -1 => Ok(None),
        t if t >= 0 => Ok(Some(Duration::from_millis(t as u64))),
        t => Err(Error::invalid(format!(
            "timeout_ms must be -1 or >= 0; got {t}"
        ))),
    }
}

/// Waits up to `timeout_ms` (-1: forever, 0: no wait) for the next frame when
/// no callback is registered. ROCEV2_OK fills `*frame` (release its token);
/// ROCEV2_ERR_TIMEOUT if none arrived; ROCEV2_ERR_STOPPED once the server is
/// stopped. `frame->struct_size` must be at least the ABI-2
/// sizeof(rocev2_frame) (the token must fit), checked before any frame is
/// taken.
///
/// Thread safety: any thread, concurrently with any call but destroy
/// (several threads may poll; each frame goes to one of them).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_poll_frame(
    srv: *mut rocev2_server,
    timeout_ms: i32,
    frame: *mut rocev2_frame,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: frame is NULL or starts with the caller's struct_size.
        let size = unsafe { caller_size(frame, "frame") }?;
        let core = core_ref(srv)?;
        let timeout = timeout_of(timeout_ms)?;
        match core.poll_frame(timeout)? {
            Some(f) => {
                // SAFETY: frame has `size` writable bytes, a size the rule accepted.
                unsafe { put_sized(frame, size, to_frame(f)) };
                Ok(())
            }
            None => Err(Error::new(
                ErrorKind::Timeout,
                format!("no frame within {timeout_ms} ms"),
            )),
        }
    })
}

/// Up to `max` frames in one call (a binding's batch pull): waits up to
/// `timeout_ms` like rocev2_server_poll_frame for the first, then takes the
/// frames already queued, without waiting. `frames` is an array of `max`
/// structs whose `frames[0].struct_size` the caller set (the array's stride:
/// at least the ABI-2 sizeof(rocev2_frame)); each filled one gets its
/// struct_size. `*got` (the caller's) is the number filled; release each
/// token (rocev2_server_release_many releases many in one call).
/// ROCEV2_ERR_TIMEOUT with `*got` 0 if none arrived; ROCEV2_ERR_STOPPED once
/// the server is stopped. Since 2.1.
///
/// Thread safety: as rocev2_server_poll_frame.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_poll_frames(
    srv: *mut rocev2_server,
    timeout_ms: i32,
    frames: *mut rocev2_frame,
    max: usize,
    got: *mut usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: NULL or a valid usize (API contract).
        let got = unsafe { super::guard::deref_mut(got, "got") }?;
        *got = 0;
        // SAFETY: frames is NULL or starts with the caller's struct_size.
        let stride = unsafe { caller_size(frames, "frames") }?;
        if max == 0 {
            return Err(Error::invalid("max is 0; valid: 1 or more frames"));
        }
        let core = core_ref(srv)?;
        let timeout = timeout_of(timeout_ms)?;
        let put = |f: Frame| {
            // SAFETY: `frames` holds `max` structs of `stride` bytes (API
            // contract), a size the rule accepted, and *got < max here.
            unsafe {
                let at = (frames as *mut u8).add(*got * stride) as *mut rocev2_frame;
                put_sized(at, stride, to_frame(f));
            }
            *got += 1;
        };
        if core.poll_batch(timeout, max, put)? == 0 {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!("no frame within {timeout_ms} ms"),
            ));
        }
        Ok(())
    })
}

/// Releases `n` tokens (from `tokens`, the caller's array) in one call, as
/// rocev2_server_release each. Every valid token is released;
/// ROCEV2_ERR_UNKNOWN_TOKEN (naming the first bad index) if any was unknown
/// or already released. Since 2.1.
///
/// Thread safety: as rocev2_server_release.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_release_many(
    srv: *mut rocev2_server,
    tokens: *const u64,
    n: usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: tokens has n readable u64 (API contract).
        let tokens = unsafe { slice(tokens, n, "tokens") }?;
        let core = handles::server_for_release(srv)?;
        let mut first_bad = None;
        let mut released = 0;
        for (i, &t) in tokens.iter().enumerate() {
            match core.release_token(t) {
                Ok(()) => released += 1,
                Err(e) => {
                    first_bad.get_or_insert((i, e));
                }
            }
        }
        // `core` may be the last reference now (the tokens' went back in
        // release_token): the registry forgets a server that is gone.
        let _ = released;
        handles::done_with(srv, core);
        match first_bad {
            None => Ok(()),
            Some((i, e)) => Err(Error::new(e.kind(), format!("tokens[{i}]: {e}"))),
        }
    })
}

/// Releases a frame's loan; its slot is re-posted. Exactly once per token,
/// from any thread, at any time (also inside the callback, after stop, and
/// after destroy for tokens still outstanding). Never blocks.
/// ROCEV2_ERR_UNKNOWN_TOKEN for an unknown or already released token, a
/// token of another server, or a handle whose server is gone; nothing is
/// released then. Every loan of the process has its own token value, never
/// reused, so such a token is refused whatever came between (no wrap).
///
/// Thread safety: any thread, concurrently with any call (destroy included:
/// the token keeps the server's memory alive).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_release(
    srv: *mut rocev2_server,
    token: u64,
) -> rocev2_status {
    guard(fn_name!(), || {
        let core = handles::server_for_release(srv)?;
        let released = core.release_token(token);
        // `core` may be the last reference now (the token's went back in
        // release_token): the registry forgets a server that is gone.
        handles::done_with(srv, core);
        released
    })
}
