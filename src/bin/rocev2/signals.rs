//! Signals, the CLI's one module that talks to the kernel: SIGPIPE back to
//! its default (or ignored, for `recv --out` to a pipe or FIFO), and SIGINT /
//! SIGTERM / SIGHUP as a request to stop that `recv` and `demo` check in
//! their receive and wait loops, so they finish cleanly (a whole recording,
//! the summary) and exit 130, 143 or 129.

use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use crate::{Exit, Fail};

/// How often the loops that wait look at [`caught`]: the longest a stop
/// signal goes unnoticed.
pub const CHECK_EVERY: Duration = Duration::from_millis(50);

/// The first stop signal caught; 0 before one is.
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// A stop signal that was caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Int,
    Term,
    /// The terminal closed (a dropped ssh session, a closed window).
    Hup,
}

impl Stop {
    /// The exit code of a run it stopped (128 + the signal number).
    pub fn exit(self) -> Exit {
        match self {
            Stop::Int => Exit::Interrupted,
            Stop::Term => Exit::Terminated,
            Stop::Hup => Exit::HungUp,
        }
    }
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stop::Int => "SIGINT",
            Stop::Term => "SIGTERM",
            Stop::Hup => "SIGHUP",
        })
    }
}

/// The handler: one compare-exchange on a lock-free atomic, which is
/// async-signal-safe (no lock, no allocation, no I/O). The first signal wins.
extern "C" fn on_stop_signal(sig: libc::c_int) {
    let _ = CAUGHT.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// Catches SIGINT, SIGTERM and SIGHUP from now on: [`caught`] tells the loops. The
/// handler is reset once it ran (SA_RESETHAND), so a second one ends the
/// process at once, should the clean stop hang; system calls the signal
/// interrupts are restarted (SA_RESTART).
pub fn catch_stop_signals() -> Result<(), Fail> {
    let handler: extern "C" fn(libc::c_int) = on_stop_signal;
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid value (no flags, an empty
        // mask, which sigemptyset sets again); the handler it installs only
        // touches an atomic (see on_stop_signal), and sigaction reads `act`
        // during the call only.
        let rc = unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = handler as libc::sighandler_t;
            act.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(Fail::runtime(format!(
                "installing the SIGINT/SIGTERM/SIGHUP handler failed: {}",
                std::io::Error::last_os_error()
            )));
        }
    }
    Ok(())
}

/// The stop signal caught since [`catch_stop_signals`], if any.
pub fn caught() -> Option<Stop> {
    match CAUGHT.load(Ordering::SeqCst) {
        libc::SIGINT => Some(Stop::Int),
        libc::SIGTERM => Some(Stop::Term),
        libc::SIGHUP => Some(Stop::Hup),
        _ => None,
    }
}

/// Restores the default SIGPIPE action, so a closed stdout pipe ends the
/// process quietly (as for any Unix filter) instead of a write error.
pub fn default_sigpipe() {
    // SAFETY: signal(2) with SIG_DFL installs no handler code; it is called
    // before any thread is started, and the library sends only on UDP and
    // AF_PACKET sockets, which never raise SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Ignores SIGPIPE from now on: a write to a pipe or FIFO whose reader is
/// gone then fails with EPIPE, which `recv --out` reports (a message, the
/// summary, exit 1) instead of dying without either. Stdout's writes fail
/// the same way then (a runtime error naming stdout).
pub fn ignore_sigpipe() {
    // SAFETY: signal(2) with SIG_IGN installs no handler code; the library's
    // threads send only on UDP and AF_PACKET sockets, which never raise
    // SIGPIPE, so nothing else depends on its action.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
