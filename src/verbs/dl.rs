//! libibverbs, loaded at run time. The library, the CLI and every consumer
//! carry no DT_NEEDED on libibverbs (or librdmacm): a host without rdma-core
//! runs everything but the verbs backend, and a wheel needs no libibverbs to
//! import. rdma-sys still gives the types; none of its functions is called.
//!
//! - The control path (device list, open, PD, MR, CQ, QP, queries) goes
//!   through [`Verbs`], a table filled by `dlvsym` from `libibverbs.so.1` on
//!   the first verbs device open, each symbol pinned to the version verbs.h
//!   binds it to (IBVERBS_1.1; the completion channel calls exist only as
//!   IBVERBS_1.0), as NCCL's ibvsymbols.cc does. A plain `dlsym` would return
//!   the default version, which a future libibverbs may change.
//! - The data path (`poll_cq`, `req_notify_cq`, `post_recv`, `post_send`)
//!   calls the provider through the context's ops table, as verbs.h's inline
//!   functions do: no symbol at all.
//!
//! The library is never closed: providers and open objects refer to it for the
//! life of the process.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use once_cell::sync::OnceCell;
use rdma_sys::{
    ibv_comp_channel, ibv_context, ibv_cq, ibv_cq_ex, ibv_cq_init_attr_ex, ibv_device,
    ibv_device_attr, ibv_device_attr_ex, ibv_gid, ibv_mr, ibv_pd, ibv_port_attr, ibv_port_state,
    ibv_qp, ibv_qp_attr, ibv_qp_init_attr, ibv_recv_wr, ibv_send_wr, ibv_values_ex, ibv_wc,
    ibv_wc_status, verbs_context,
};

use crate::error::{Error, ErrorKind, Result};

/// The shared object the verbs backend loads (rdma-core's ABI 1).
const LIBIBVERBS: &str = "libibverbs.so.1";

/// What to install when libibverbs cannot be loaded.
const INSTALL_HINT: &str = "install rdma-core's libibverbs and its providers \
     (Debian/Ubuntu: `apt-get install libibverbs1 ibverbs-providers`; Fedora/RHEL: `dnf install \
     libibverbs`; conda: `conda install -c conda-forge rdma-core`), or use the \"soft\" device, \
     which needs no RDMA library";

/// Declares the table: one field per function, named as its C symbol, with
/// the symbol version it is resolved at.
macro_rules! verbs_table {
    ($($name:ident @ $version:literal : fn($($arg:ty),* $(,)?) -> $ret:ty;)*) => {
        /// libibverbs' non-inline verbs, resolved from the loaded library.
        pub(crate) struct Verbs {
            $(pub(crate) $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        impl Verbs {
            /// Resolves every entry in `handle`.
            ///
            /// # Safety
            /// `handle` must be a live dlopen handle of libibverbs.so.1, whose
            /// symbols have the C signatures declared here (verbs.h).
            unsafe fn resolve(handle: *mut c_void) -> std::result::Result<Verbs, String> {
                Ok(Verbs {
                    $($name: {
                        let p = symbol(
                            handle,
                            concat!(stringify!($name), "\0"),
                            concat!($version, "\0"),
                        )?;
                        // SAFETY: p is the address of this function at the
                        // version whose signature verbs.h declares (caller).
                        unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                        }
                    },)*
                })
            }
        }
    };
}

verbs_table! {
    ibv_get_device_list @ "IBVERBS_1.1": fn(*mut c_int) -> *mut *mut ibv_device;
    ibv_free_device_list @ "IBVERBS_1.1": fn(*mut *mut ibv_device) -> ();
    ibv_get_device_name @ "IBVERBS_1.1": fn(*mut ibv_device) -> *const c_char;
    ibv_open_device @ "IBVERBS_1.1": fn(*mut ibv_device) -> *mut ibv_context;
    ibv_close_device @ "IBVERBS_1.1": fn(*mut ibv_context) -> c_int;
    ibv_query_device @ "IBVERBS_1.1": fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    // verbs.h's inline ibv_query_port falls back to this one (the provider
    // fills the struct; the compat layout is its prefix).
    ibv_query_port @ "IBVERBS_1.1": fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    ibv_query_gid @ "IBVERBS_1.1": fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    ibv_alloc_pd @ "IBVERBS_1.1": fn(*mut ibv_context) -> *mut ibv_pd;
    ibv_dealloc_pd @ "IBVERBS_1.1": fn(*mut ibv_pd) -> c_int;
    ibv_reg_mr @ "IBVERBS_1.1": fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    ibv_dereg_mr @ "IBVERBS_1.1": fn(*mut ibv_mr) -> c_int;
    ibv_create_comp_channel @ "IBVERBS_1.0": fn(*mut ibv_context) -> *mut ibv_comp_channel;
    ibv_destroy_comp_channel @ "IBVERBS_1.0": fn(*mut ibv_comp_channel) -> c_int;
    ibv_get_cq_event @ "IBVERBS_1.1":
        fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    ibv_ack_cq_events @ "IBVERBS_1.1": fn(*mut ibv_cq, c_uint) -> ();
    ibv_create_cq @ "IBVERBS_1.1":
        fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    ibv_destroy_cq @ "IBVERBS_1.1": fn(*mut ibv_cq) -> c_int;
    ibv_create_qp @ "IBVERBS_1.1": fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    ibv_modify_qp @ "IBVERBS_1.1": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    ibv_destroy_qp @ "IBVERBS_1.1": fn(*mut ibv_qp) -> c_int;
    ibv_port_state_str @ "IBVERBS_1.1": fn(ibv_port_state::Type) -> *const c_char;
    ibv_wc_status_str @ "IBVERBS_1.1": fn(ibv_wc_status::Type) -> *const c_char;
}

/// The last dl error, as text.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the
    // next dl call on this thread; it is copied at once.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".to_string()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `name` at `version` in `handle` (both NUL-terminated).
///
/// # Safety
/// `handle` must be a live dlopen handle.
unsafe fn symbol(
    handle: *mut c_void,
    name: &'static str,
    version: &'static str,
) -> std::result::Result<*mut c_void, String> {
    let (n, v) = (name.as_ptr().cast::<c_char>(), version.as_ptr().cast());
    // SAFETY: handle is live (caller); name and version are NUL-terminated.
    #[cfg(target_env = "gnu")]
    let p = unsafe { libc::dlvsym(handle, n, v) };
    // No symbol versions outside glibc: the default version.
    #[cfg(not(target_env = "gnu"))]
    // SAFETY: as above.
    let p = unsafe {
        let _ = v;
        libc::dlsym(handle, n)
    };
    if p.is_null() {
        return Err(format!(
            "{} (version {}) not found: {}",
            name.trim_end_matches('\0'),
            version.trim_end_matches('\0'),
            dl_error()
        ));
    }
    Ok(p)
}

/// Opens shared object `soname` and resolves the table in it.
fn open(soname: &str) -> Result<Verbs> {
    let unavailable = |why: String| {
        Error::new(
            ErrorKind::Unsupported,
            format!(
                "the verbs backend needs {LIBIBVERBS} (rdma-core) at run time and it could not \
                 be loaded: {why}. To use an RDMA device, {INSTALL_HINT}"
            ),
        )
    };
    let name = std::ffi::CString::new(soname).map_err(|_| unavailable(format!("{soname:?}")))?;
    // SAFETY: name is NUL-terminated; loading libibverbs runs only its own
    // initialisers (no global state of ours is involved).
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(unavailable(dl_error()));
    }
    // SAFETY: handle is the live handle of libibverbs just opened; its
    // symbols have verbs.h's signatures. It is never closed, so the
    // resolved pointers stay valid for the life of the process.
    unsafe { Verbs::resolve(handle) }.map_err(|why| unavailable(format!("{soname}: {why}")))
}

static LOADED: OnceCell<Verbs> = OnceCell::new();

/// The table, loading libibverbs.so.1 on the first call. A failure is not
/// remembered: a later call tries again.
pub(crate) fn load() -> Result<&'static Verbs> {
    LOADED.get_or_try_init(|| open(LIBIBVERBS))
}

/// The table if libibverbs was loaded already (any verbs object exists).
pub(crate) fn loaded() -> Option<&'static Verbs> {
    LOADED.get()
}

/// The error code a missing provider op reports (verbs.h returns the same
/// for ops a provider leaves out).
const NO_OP: c_int = libc::EOPNOTSUPP;

/// `ibv_poll_cq`: up to `n` completions into `wc`; the count, or negative.
///
/// # Safety
/// `cq` must be a live CQ; `wc` must hold `n` entries.
#[inline]
pub(crate) unsafe fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: a live CQ points at its live context (caller).
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: the provider's own op for this CQ, called as verbs.h does.
        Some(f) => unsafe { f(cq, n, wc) },
        None => -NO_OP,
    }
}

/// `ibv_req_notify_cq`: 0, or an errno.
///
/// # Safety
/// `cq` must be a live CQ.
#[inline]
pub(crate) unsafe fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: a live CQ points at its live context (caller).
    match unsafe { (*(*cq).context).ops.req_notify_cq } {
        // SAFETY: the provider's own op for this CQ, called as verbs.h does.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => NO_OP,
    }
}

/// `ibv_post_recv`: 0, or an errno (`bad` names the first WR not posted).
///
/// # Safety
/// `qp` must be a live QP; `wr` a valid chain whose SGEs lie in registered
/// memory; `bad` a valid out-pointer.
#[inline]
pub(crate) unsafe fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    // SAFETY: a live QP points at its live context (caller).
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: the provider's own op for this QP; wr and bad valid (caller).
        Some(f) => unsafe { f(qp, wr, bad) },
        None => NO_OP,
    }
}

/// `ibv_post_send`: 0, or an errno (`bad` names the first WR not posted).
///
/// # Safety
/// As [`post_recv`].
#[inline]
pub(crate) unsafe fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    // SAFETY: a live QP points at its live context (caller).
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: the provider's own op for this QP; wr and bad valid (caller).
        Some(f) => unsafe { f(qp, wr, bad) },
        None => NO_OP,
    }
}

/// verbs.h's `verbs_get_ctx_op`: the extended context of `ctx` when its
/// provider implements the op at `op_offset` (an `offset_of!` into
/// [`verbs_context`]), else None. The extended context sits in front of the
/// `ibv_context` it embeds (its last field); `sz` is the size the provider
/// built it with: newer ops are added at the front, so an op lies inside a
/// provider's context when `sz` reaches back to it.
///
/// # Safety
/// `ctx` must be a live device context.
unsafe fn ctx_op(ctx: *mut ibv_context, op_offset: usize) -> Option<*mut verbs_context> {
    // verbs.h's __VERBS_ABI_IS_EXTENDED.
    const EXTENDED: usize = usize::MAX;
    // SAFETY: ctx is live (caller).
    if unsafe { (*ctx).abi_compat } as usize != EXTENDED {
        return None;
    }
    let vctx = (ctx as usize - std::mem::offset_of!(verbs_context, context)) as *mut verbs_context;
    // SAFETY: abi_compat says ctx is the `context` field of a verbs_context
    // (verbs.h's container_of); `sz` is its first-known field read as the
    // C code reads it.
    let sz = unsafe { (*vctx).sz };
    (sz >= std::mem::size_of::<verbs_context>() - op_offset).then_some(vctx)
}

/// `ibv_query_device_ex` (no input): 0, or an errno. A provider without
/// the op, or one that answers EOPNOTSUPP/ENOSYS, leaves the extended part
/// zeroed and fills `orig_attr` through `ibv_query_device`, as verbs.h does.
///
/// # Safety
/// `ctx` must be a live device context.
pub(crate) unsafe fn query_device_ex(
    api: &Verbs,
    ctx: *mut ibv_context,
    attr: &mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: ctx is live (caller).
    let op = unsafe { ctx_op(ctx, std::mem::offset_of!(verbs_context, query_device_ex)) }
        // SAFETY: ctx_op returned a live extended context.
        .and_then(|v| unsafe { (*v).query_device_ex });
    if let Some(f) = op {
        let size = std::mem::size_of::<ibv_device_attr_ex>();
        // SAFETY: the provider's op for this context; attr is writable for
        // `size` bytes, the size passed.
        let rc = unsafe { f(ctx, std::ptr::null(), attr, size) };
        if rc != libc::EOPNOTSUPP && rc != libc::ENOSYS {
            return rc;
        }
    }
    // SAFETY: ibv_device_attr_ex is plain data; zeroed is valid.
    *attr = unsafe { std::mem::zeroed() };
    // SAFETY: ctx is live; orig_attr is writable.
    unsafe { (api.ibv_query_device)(ctx, &mut attr.orig_attr) }
}

/// `ibv_create_cq_ex`: the CQ, or NULL with errno set (EOPNOTSUPP when the
/// provider has no extended CQs).
///
/// # Safety
/// `ctx` must be a live device context; `attr`'s channel (if any) live.
pub(crate) unsafe fn create_cq_ex(
    ctx: *mut ibv_context,
    attr: &mut ibv_cq_init_attr_ex,
) -> *mut ibv_cq_ex {
    // SAFETY: ctx is live (caller).
    let op = unsafe { ctx_op(ctx, std::mem::offset_of!(verbs_context, create_cq_ex)) }
        // SAFETY: ctx_op returned a live extended context.
        .and_then(|v| unsafe { (*v).create_cq_ex });
    match op {
        // SAFETY: the provider's op for this context; attr valid (caller).
        Some(f) => unsafe { f(ctx, attr) },
        None => {
            // SAFETY: errno is this thread's.
            unsafe { *libc::__errno_location() = NO_OP };
            std::ptr::null_mut()
        }
    }
}

/// `ibv_query_rt_values_ex`: 0, or an errno.
///
/// # Safety
/// `ctx` must be a live device context.
pub(crate) unsafe fn query_rt_values_ex(
    ctx: *mut ibv_context,
    values: &mut ibv_values_ex,
) -> c_int {
    // SAFETY: ctx is live (caller).
    let op = unsafe { ctx_op(ctx, std::mem::offset_of!(verbs_context, query_rt_values)) }
        // SAFETY: ctx_op returned a live extended context.
        .and_then(|v| unsafe { (*v).query_rt_values });
    match op {
        // SAFETY: the provider's op for this context; values writable.
        Some(f) => unsafe { f(ctx, values) },
        None => NO_OP,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where rdma-core is installed (every build host of the verbs
    /// feature), every entry resolves at its pinned version.
    #[test]
    fn every_verb_resolves_at_its_version() {
        let v = load().expect("libibverbs.so.1 (the build host has rdma-core)");
        // SAFETY: a static string for any status value.
        let text = unsafe { CStr::from_ptr((v.ibv_wc_status_str)(ibv_wc_status::IBV_WC_SUCCESS)) };
        assert_eq!(text.to_str(), Ok("success"));
        assert!(std::ptr::eq(v, loaded().expect("kept after load")));
    }

    /// A library that cannot be loaded: Unsupported, saying what to install.
    #[test]
    fn a_missing_library_says_what_to_install() {
        let e = match open("libibverbs-not-installed.so.1") {
            Ok(_) => panic!("a library that does not exist loaded"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        let m = e.message();
        for needle in [
            "libibverbs.so.1",
            "libibverbs-not-installed.so.1",
            "libibverbs1 ibverbs-providers",
            "rdma-core",
            "\"soft\"",
        ] {
            assert!(m.contains(needle), "{needle:?} missing from: {m}");
        }
    }

    /// A library without the verbs (here libc): names the missing symbol.
    #[test]
    fn a_library_without_the_verbs_names_the_symbol() {
        let e = match open("libc.so.6") {
            Ok(_) => panic!("libc resolved as libibverbs"),
            Err(e) => e,
        };
        assert_eq!(e.kind(), ErrorKind::Unsupported);
        assert!(
            e.message()
                .contains("ibv_get_device_list (version IBVERBS_1.1) not found"),
            "{}",
            e.message()
        );
    }
}
