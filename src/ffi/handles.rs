//! Server handles as registry ids, not pointers.
//!
//! A `rocev2_server *` is an opaque number drawn from a process-wide counter
//! (never reused), looked up here on every call. So a handle used after its
//! server is gone (a second release after destroy, a destroy twice), or a
//! pointer that never was a handle, is refused with an error instead of
//! dereferenced: no use-after-free is reachable from C, whatever the order
//! of calls. The registry keeps the handle's own strong reference until
//! destroy, and a weak one after it, which still reaches the core while loan
//! tokens keep it alive (the core keeps a reference per outstanding token,
//! see `Frame::into_token`); the entry goes when the core does.
//!
//! Cost: one uncontended read lock, a hash look-up and a weak upgrade per
//! call (tens of nanoseconds; `rocev2_server_release_many` pays it once per
//! batch).
//!
//! Fork: a child forked from a process with servers has their memory but
//! not their receive threads, and may have copies of their locks taken. So
//! a handle made before the fork is refused in the child at once, before
//! any lock (`ROCEV2_ERR_STOPPED`, saying why; `rocev2_server_is_running`
//! 0; destroy forgets it without touching it); the child may create and use
//! servers of its own. The registry's lock is held across `fork()`
//! (`pthread_atfork`), so the child's copy of it is free.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once, RwLock, RwLockWriteGuard, Weak};

use once_cell::sync::Lazy;

use crate::error::{Error, ErrorKind, Result};
use crate::server::ServerCore;

/// A receive server. Opaque.
pub struct rocev2_server {
    _private: [u8; 0],
}

/// The live server behind a handle (a handle is checked, never dereferenced).
pub(crate) fn core_ref(srv: *const rocev2_server) -> Result<Arc<ServerCore>> {
    server(srv)
}

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
/// Handles below this value were made before this process was forked from
/// its parent (0: not a forked child, or no handle before the fork).
static FORKED_BELOW: AtomicUsize = AtomicUsize::new(0);
static AT_FORK: Once = Once::new();

thread_local! {
    /// The registry's write lock, held by the forking thread across fork().
    static HELD: RefCell<Option<RwLockWriteGuard<'static, HashMap<usize, Entry>>>> =
        const { RefCell::new(None) };
}

/// pthread_atfork's prepare: takes the registry's lock, so no other thread
/// holds it while the process is copied.
extern "C" fn before_fork() {
    let g = table_mut();
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some(g));
}

/// pthread_atfork's parent and child: lets the lock go.
extern "C" fn after_fork_parent() {
    let _ = HELD.try_with(|h| drop(h.borrow_mut().take()));
}

/// pthread_atfork's child: every handle made so far is the parent's.
extern "C" fn after_fork_child() {
    FORKED_BELOW.store(NEXT.load(Ordering::Relaxed) << 4, Ordering::Relaxed);
    after_fork_parent();
}

/// A handle of the process this one was forked from: refused.
fn forked(srv: *const rocev2_server) -> Result<()> {
    if (srv as usize) < FORKED_BELOW.load(Ordering::Relaxed) {
        return Err(Error::new(
            ErrorKind::Stopped,
            format!(
                "server handle {srv:p} was created by the process this one was forked from: a \
                 forked child cannot use its parent's servers (their receive threads did not \
                 follow the fork); create a server in the child, or fork before creating any"
            ),
        ));
    }
    Ok(())
}

/// True for a handle made before this process was forked (destroy forgets
/// it without touching its server).
pub(crate) fn is_forked(srv: *const rocev2_server) -> bool {
    forked(srv).is_err()
}

fn table() -> std::sync::RwLockReadGuard<'static, HashMap<usize, Entry>> {
    HANDLES.read().unwrap_or_else(|e| e.into_inner())
}

fn table_mut() -> std::sync::RwLockWriteGuard<'static, HashMap<usize, Entry>> {
    HANDLES.write().unwrap_or_else(|e| e.into_inner())
}

/// Registers `core` and returns its new handle (which owns one reference).
pub(crate) fn register(core: Arc<ServerCore>) -> *mut rocev2_server {
    AT_FORK.call_once(|| {
        // SAFETY: three extern "C" functions that only take or drop the
        // registry's lock and store an atomic; registered once.
        unsafe {
            libc::pthread_atfork(
                Some(before_fork as unsafe extern "C" fn()),
                Some(after_fork_parent as unsafe extern "C" fn()),
                Some(after_fork_child as unsafe extern "C" fn()),
            )
        };
    });
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
    forked(srv)?;
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
    forked(srv)?;
    let weak = table().get(&(srv as usize)).map(|e| e.weak.clone());
    // Upgraded (and the weak dropped) outside the lock: dropping the last
    // reference of a core runs its teardown, which must not hold the table.
    match weak.and_then(|w| w.upgrade()) {
        Some(core) => Ok(core),
        None => Err(not_live(srv, ErrorKind::UnknownToken, false)),
    }
}

/// Drops `core`, the caller's reference to `srv`'s server, and forgets
/// `srv` if that was the last one (after destroy, a release that gave back
/// the last token's reference: see `ServerCore::release_token`).
pub(crate) fn done_with(srv: *const rocev2_server, core: Arc<ServerCore>) {
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
