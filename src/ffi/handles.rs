//! Server handles as registry ids, not pointers.
//!
//! A `rocev2_server *` is an opaque number drawn from a process-wide counter
//! (never reused), looked up here on every call. So a handle used after its
//! server is gone (a second release after destroy, a destroy twice), or a
//! pointer that never was a handle, is refused with an error instead of
//! dereferenced: no use-after-free is reachable from C, whatever the order
//! of calls. The registry keeps the handle's own strong reference until
//! destroy, and a weak one after it, which still reaches the core while loan
//! tokens keep it alive (each holds a strong reference, see
//! `Frame::into_token`); the entry goes when the core does.
//!
//! Cost: one uncontended read lock, a hash look-up and a weak upgrade per
//! call (tens of nanoseconds; `rocev2_server_release_many` pays it once per
//! batch).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, Weak};

use once_cell::sync::Lazy;

use crate::error::{Error, ErrorKind, Result};
use crate::server::ServerCore;

use super::server::rocev2_server;

struct Entry {
    /// The handle's own reference: `Some` from create until destroy.
    owned: Option<Arc<ServerCore>>,
    /// Reaches the core after destroy while tokens keep it alive.
    weak: Weak<ServerCore>,
}

static HANDLES: Lazy<RwLock<HashMap<usize, Entry>>> = Lazy::new(Default::default);
/// Handle ids: 16-aligned so they look like the pointers C expects, never 0,
/// never reused in a process.
static NEXT: AtomicUsize = AtomicUsize::new(1);

fn table() -> std::sync::RwLockReadGuard<'static, HashMap<usize, Entry>> {
    HANDLES.read().unwrap_or_else(|e| e.into_inner())
}

fn table_mut() -> std::sync::RwLockWriteGuard<'static, HashMap<usize, Entry>> {
    HANDLES.write().unwrap_or_else(|e| e.into_inner())
}

/// Registers `core` and returns its new handle (which owns one reference).
pub(crate) fn register(core: Arc<ServerCore>) -> *mut rocev2_server {
    let id = NEXT.fetch_add(1, Ordering::Relaxed) << 4;
    let weak = Arc::downgrade(&core);
    table_mut().insert(
        id,
        Entry {
            owned: Some(core),
            weak,
        },
    );
    id as *mut rocev2_server
}

/// Why `srv` names no live server, as an error of `kind`.
fn not_live(srv: *const rocev2_server, kind: ErrorKind, known: bool) -> Error {
    let why = if known {
        "was destroyed"
    } else {
        "is not a handle from rocev2_server_create (or its server was destroyed and every \
         token released)"
    };
    Error::new(
        kind,
        format!("server handle {srv:p} {why}: pass the handle rocev2_server_create gave, before rocev2_server_destroy"),
    )
}

/// The live (not destroyed) server behind `srv`.
pub(crate) fn server(srv: *const rocev2_server) -> Result<Arc<ServerCore>> {
    if srv.is_null() {
        return Err(super::guard::null("server"));
    }
    let found = table().get(&(srv as usize)).map(|e| e.owned.clone());
    match found {
        Some(Some(core)) => Ok(core),
        Some(None) => Err(not_live(srv, ErrorKind::InvalidArgument, true)),
        None => Err(not_live(srv, ErrorKind::InvalidArgument, false)),
    }
}

/// The server behind `srv` for releasing tokens: also after destroy, while
/// tokens keep its core alive. An unknown handle is ROCEV2_ERR_UNKNOWN_TOKEN
/// (no token of it can be outstanding).
pub(crate) fn server_for_release(srv: *const rocev2_server) -> Result<Arc<ServerCore>> {
    if srv.is_null() {
        return Err(super::guard::null("server"));
    }
    let weak = table().get(&(srv as usize)).map(|e| e.weak.clone());
    // Upgraded (and the weak dropped) outside the lock: dropping the last
    // reference of a core runs its teardown, which must not hold the table.
    match weak.and_then(|w| w.upgrade()) {
        Some(core) => Ok(core),
        None => Err(not_live(srv, ErrorKind::UnknownToken, false)),
    }
}

/// Gives back the strong reference a released token held (see
/// `Frame::into_token`), through `core`, a reference the caller holds on the
/// same core; then drops `core`, and forgets `srv` if that was the last one.
pub(crate) fn give_back_token_refs(srv: *const rocev2_server, core: Arc<ServerCore>, n: usize) {
    for _ in 0..n {
        // SAFETY: each released token held one strong count of this core,
        // handed out by Arc::into_raw in Frame::into_token; `core` holds
        // another, so this decrement never frees the core.
        unsafe { Arc::decrement_strong_count(Arc::as_ptr(&core)) };
    }
    let weak = Arc::downgrade(&core);
    drop(core);
    if weak.strong_count() == 0 {
        forget_if_dead(srv);
    }
}

/// Removes `srv`'s entry if its core is gone (after destroy dropped the
/// handle's reference, or a release the last token's).
pub(crate) fn forget_if_dead(srv: *const rocev2_server) {
    let mut t = table_mut();
    if t.get(&(srv as usize))
        .is_some_and(|e| e.owned.is_none() && e.weak.strong_count() == 0)
    {
        t.remove(&(srv as usize));
    }
}

/// Destroy: takes the handle's own reference (the caller stops and drops
/// it, outside the lock); the entry stays while tokens keep the core alive.
pub(crate) fn unregister(srv: *const rocev2_server) -> Result<Arc<ServerCore>> {
    let taken = {
        let mut t = table_mut();
        match t.get_mut(&(srv as usize)) {
            Some(e) => match e.owned.take() {
                Some(core) => Ok(core),
                None => Err(true),
            },
            None => Err(false),
        }
    };
    taken.map_err(|known| not_live(srv, ErrorKind::InvalidArgument, known))
}
