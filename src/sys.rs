//! File descriptors and calls into the kernel the core needs: the eventfd
//! that wakes the receive thread, poll, CPU pinning and entropy. (The
//! receive slab lives with the server core: `server/slab.rs`.)

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{Error, Result};

/// A non-blocking eventfd: the receive thread's wake-up line.
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new non-blocking, close-on-exec eventfd.
    pub fn new() -> Result<EventFd> {
        // SAFETY: plain syscall with constant flags; the returned fd is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
    /// Makes the fd readable (never blocks).
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our own fd; EAGAIN (counter
        // saturated) means it is readable already, which is all we want.
        unsafe { libc::write(self.0.as_raw_fd(), &one as *const u64 as *const _, 8) };
    }
    /// Clears the readable state (never blocks).
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our own non-blocking fd.
        unsafe { libc::read(self.0.as_raw_fd(), &mut v as *mut u64 as *mut _, 8) };
    }
    /// The raw fd, for poll().
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Blocks until one of `fds` is readable (or a signal interrupts); returns which
/// of them are readable. `timeout_ms` < 0 waits forever. (Arrays in and out:
/// the receive thread calls this per wake-up, without allocating.)
pub fn poll_readable<const N: usize>(fds: [RawFd; N], timeout_ms: i32) -> Result<[bool; N]> {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: pfds is a valid array of N pollfd structs.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            return Ok([false; N]);
        }
        return Err(Error::io("poll", err));
    }
    Ok(pfds.map(|p| p.revents != 0))
}

/// Sets the calling thread's timer slack (how late the kernel may fire its
/// sleeps' timers, to batch wake-ups; 50 us by default) to `ns`.
pub fn set_timer_slack(ns: u64) -> Result<()> {
    // SAFETY: PR_SET_TIMERSLACK takes its value in the second argument and
    // touches no memory of ours; the unused arguments are 0 as prctl wants.
    let rc = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        return Err(Error::io(
            &format!("prctl(PR_SET_TIMERSLACK, {ns})"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// Pins the calling thread to `cpu`.
pub fn pin_current_thread(cpu: u32) -> Result<()> {
    if cpu as usize >= libc::CPU_SETSIZE as usize {
        return Err(Error::invalid(format!(
            "cpu_affinity must be below {}; got {cpu}",
            libc::CPU_SETSIZE
        )));
    }
    // SAFETY: cpu_set_t is a plain bit set; zeroed is its empty value, CPU_SET
    // writes inside it (index checked above), and sched_setaffinity(0) reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(Error::io(
            &format!("sched_setaffinity(cpu {cpu})"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The calling thread pinned to one CPU until the guard drops, which puts
/// its former CPU set back (the benchmarks' sender thread).
pub struct PinnedThread(libc::cpu_set_t, std::marker::PhantomData<*const ()>);

impl PinnedThread {
    /// Pins the calling thread to `cpu`, keeping its current CPU set.
    pub fn pin(cpu: u32) -> Result<PinnedThread> {
        // SAFETY: cpu_set_t is a plain bit set; zeroed is a valid value, and
        // sched_getaffinity(0) writes at most its size into ours.
        let before = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Err(Error::io(
                    "sched_getaffinity",
                    std::io::Error::last_os_error(),
                ));
            }
            set
        };
        pin_current_thread(cpu)?;
        Ok(PinnedThread(before, std::marker::PhantomData))
    }
}

impl Drop for PinnedThread {
    fn drop(&mut self) {
        // SAFETY: the set read by pin(), of its own size, for the calling
        // thread: the pinned one (the guard is not Send).
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) };
    }
}

/// A random 32-bit value from the kernel (getrandom), for PSNs and QPNs.
pub fn random_u32() -> u32 {
    let mut v: u32 = 0;
    // SAFETY: writes at most 4 bytes into a valid u32.
    let n = unsafe { libc::getrandom(&mut v as *mut u32 as *mut _, 4, 0) };
    if n != 4 {
        // getrandom cannot fail for 4 bytes after boot; fall back to std's
        // per-process random hash keys rather than a constant.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        v = h.finish() as u32;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eventfd_signal_and_poll() {
        let e = EventFd::new().unwrap();
        assert_eq!(poll_readable([e.raw()], 0).unwrap(), [false]);
        e.signal();
        e.signal();
        assert_eq!(poll_readable([e.raw()], 0).unwrap(), [true]);
        e.drain();
        assert_eq!(poll_readable([e.raw()], 0).unwrap(), [false]);
    }

    #[test]
    fn random_values_vary() {
        let v: Vec<u32> = (0..8).map(|_| random_u32()).collect();
        assert!(v.windows(2).any(|w| w[0] != w[1]));
    }

    #[test]
    fn pin_rejects_out_of_range_cpu() {
        assert!(pin_current_thread(100_000).is_err());
    }
}
