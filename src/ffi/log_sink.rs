//! The log sink behind `rocev2_set_log_callback` (logging.rs): `log`
//! records go to the host's callback when one is set (rogue forwards them to
//! its logger "rocev2.Server"), otherwise to stderr through env_logger,
//! filtered by RUST_LOG (default: warnings and errors). Installed by the
//! boundary (guard.rs) on the first call; it calls nothing of the C API.

use std::ffi::{c_char, c_void, CString};
use std::sync::{Once, RwLock};

use log::{Level, LevelFilter, Log, Metadata, Record};
use once_cell::sync::Lazy;

/// Log levels for `rocev2_set_log_callback`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum rocev2_log_level {
    /// No logging.
    ROCEV2_LOG_OFF = 0,
    /// Errors.
    ROCEV2_LOG_ERROR = 1,
    /// Warnings.
    ROCEV2_LOG_WARN = 2,
    /// Informational (connection bring-up, stop).
    ROCEV2_LOG_INFO = 3,
    /// Debug.
    ROCEV2_LOG_DEBUG = 4,
    /// Per-frame tracing.
    ROCEV2_LOG_TRACE = 5,
}

/// Receives library log records (from any thread). Strings are valid only
/// during the call.
pub type rocev2_log_callback = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        level: rocev2_log_level,
        target: *const c_char,
        message: *const c_char,
    ),
>;

#[derive(Clone, Copy)]
struct Sink {
    cb: rocev2_log_callback,
    user: *mut c_void,
    level: LevelFilter,
}

// SAFETY: the user pointer is only handed back to the host's callback, which
// the API documents as called from any thread.
unsafe impl Send for Sink {}
// SAFETY: as above.
unsafe impl Sync for Sink {}

struct FfiLogger {
    sink: RwLock<Option<Sink>>,
    fallback: env_logger::Logger,
}

static LOGGER: Lazy<FfiLogger> = Lazy::new(|| FfiLogger {
    sink: RwLock::new(None),
    fallback: env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .build(),
});

static INSTALL: Once = Once::new();

thread_local! {
    /// Set while this thread runs the host's log callback.
    static IN_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Installs the forwarding logger once (unless the host already set a `log`
/// logger, e.g. a Rust program linking the rlib).
pub(crate) fn ensure_installed() {
    INSTALL.call_once(|| {
        if log::set_logger(&*LOGGER).is_ok() {
            log::set_max_level(LOGGER.fallback.filter());
        }
    });
}

fn level_code(l: Level) -> rocev2_log_level {
    match l {
        Level::Error => rocev2_log_level::ROCEV2_LOG_ERROR,
        Level::Warn => rocev2_log_level::ROCEV2_LOG_WARN,
        Level::Info => rocev2_log_level::ROCEV2_LOG_INFO,
        Level::Debug => rocev2_log_level::ROCEV2_LOG_DEBUG,
        Level::Trace => rocev2_log_level::ROCEV2_LOG_TRACE,
    }
}

pub(crate) fn filter_of(code: i32) -> Option<LevelFilter> {
    Some(match code {
        0 => LevelFilter::Off,
        1 => LevelFilter::Error,
        2 => LevelFilter::Warn,
        3 => LevelFilter::Info,
        4 => LevelFilter::Debug,
        5 => LevelFilter::Trace,
        _ => return None,
    })
}

/// Sets (or with `cb = None` clears) the callback and its level.
pub(crate) fn set_callback(cb: rocev2_log_callback, user: *mut c_void, level: LevelFilter) {
    ensure_installed();
    let mut sink = LOGGER.sink.write().unwrap_or_else(|e| e.into_inner());
    *sink = cb.map(|f| Sink {
        cb: Some(f),
        user,
        level,
    });
    let max = match &*sink {
        Some(s) => s.level,
        None => LOGGER.fallback.filter(),
    };
    log::set_max_level(max);
}

impl Log for FfiLogger {
    fn enabled(&self, m: &Metadata) -> bool {
        match &*self.sink.read().unwrap_or_else(|e| e.into_inner()) {
            Some(s) => m.level() <= s.level,
            None => self.fallback.enabled(m),
        }
    }

    fn log(&self, record: &Record) {
        // A copy, and no lock held while the host's callback runs: it may
        // replace itself (rocev2_set_log_callback takes the write lock).
        let sink = *self.sink.read().unwrap_or_else(|e| e.into_inner());
        if IN_CALLBACK.with(|c| c.get()) {
            // Logged by a library call made inside the callback: not back
            // into it (no recursion).
            return self.fallback.log(record);
        }
        match sink {
            Some(s) if record.level() <= s.level => {
                let target = CString::new(record.target().replace('\0', " ")).unwrap_or_default();
                let msg =
                    CString::new(record.args().to_string().replace('\0', " ")).unwrap_or_default();
                if let Some(f) = s.cb {
                    IN_CALLBACK.with(|c| c.set(true));
                    // SAFETY: a host-provided function with the documented
                    // signature; both strings live until it returns.
                    unsafe {
                        f(
                            s.user,
                            level_code(record.level()),
                            target.as_ptr() as *const c_char,
                            msg.as_ptr() as *const c_char,
                        )
                    };
                    IN_CALLBACK.with(|c| c.set(false));
                }
            }
            Some(_) => {}
            None => self.fallback.log(record),
        }
    }

    fn flush(&self) {
        self.fallback.flush();
    }
}
