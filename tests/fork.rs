//! fork() with a server running (issue 38 finding 7): the child has the
//! server's memory but not its receive thread, and may have copies of its
//! locks taken (a child polled or stopped into a deadlock on the pull
//! queue's mutex, 2 runs of ~35; its stop waited the whole stop timeout for
//! a thread that is not there, and `is_running` said 1). Defined now: a
//! handle made before the fork is refused in the child at once
//! (ROCEV2_ERR_STOPPED), `is_running` is 0, destroy returns at once, and the
//! child may create servers of its own. A test binary of its own: the fork
//! happens with no other test's threads about.

use std::time::{Duration, Instant};

use rocev2::ffi::*;

mod common;

fn soft_server(stop_timeout_ms: u32) -> (*mut rocev2_device, *mut rocev2_server) {
    let (dev, srv, _) = common::soft_c_server(4, stop_timeout_ms);
    (dev, srv)
}

/// What the child checks, one bit per failed check (its exit code).
unsafe fn in_the_child(srv: *mut rocev2_server) -> i32 {
    let mut failed = 0;
    if rocev2_server_is_running(srv) != 0 {
        failed |= 1;
    }
    let mut f: rocev2_frame = std::mem::zeroed();
    f.struct_size = std::mem::size_of_val(&f) as u32;
    // A minute's wait: refused at once, not waited out.
    if rocev2_server_poll_frame(srv, 60_000, &mut f) != rocev2_status::ROCEV2_ERR_STOPPED {
        failed |= 2;
    }
    let mut buf = [0 as std::ffi::c_char; 512];
    rocev2_last_error(buf.as_mut_ptr(), buf.len());
    let msg = std::ffi::CStr::from_ptr(buf.as_ptr()).to_string_lossy();
    if !msg.contains("forked") {
        failed |= 4;
    }
    if rocev2_server_stop(srv) != rocev2_status::ROCEV2_ERR_STOPPED {
        failed |= 8;
    }
    if rocev2_server_release(srv, 1 << 16) != rocev2_status::ROCEV2_ERR_STOPPED {
        failed |= 16;
    }
    rocev2_server_destroy(srv);
    // A server of the child's own works.
    let (dev, own) = soft_server(1000);
    let mut hp: rocev2_host_params = std::mem::zeroed();
    hp.struct_size = std::mem::size_of_val(&hp) as u32;
    if rocev2_server_get_host_params(own, &mut hp) != rocev2_status::ROCEV2_OK {
        failed |= 32;
    }
    if rocev2_server_complete_connection(own, 0x4242, 0, 5, 1) != rocev2_status::ROCEV2_OK
        || rocev2_server_is_running(own) != 1
    {
        failed |= 64;
    }
    rocev2_server_destroy(own);
    rocev2_device_close(dev);
    failed
}

#[test]
fn a_forked_child_is_refused_its_parents_servers_at_once_and_may_make_its_own() {
    unsafe {
        // A stop timeout of 10 minutes: a child that waited for the receive
        // thread would not be back within the bound below.
        let (dev, srv) = soft_server(600_000);
        assert_eq!(
            rocev2_server_complete_connection(srv, 0x4242, 0, 5, 1),
            rocev2_status::ROCEV2_OK
        );
        assert_eq!(rocev2_server_is_running(srv), 1);
        let pid = libc::fork();
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            libc::_exit(in_the_child(srv));
        }
        // Bounded against a hang (generous: the child's calls return at once).
        let limit = Instant::now() + Duration::from_secs(120);
        let mut status = 0;
        loop {
            let r = libc::waitpid(pid, &mut status, libc::WNOHANG);
            if r == pid {
                break;
            }
            if Instant::now() > limit {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
                panic!("the child hung on its parent's server (a deadlock or the stop timeout)");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            libc::WIFEXITED(status),
            "the child died: status {status:#x}"
        );
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "failed checks in the child (bits: 1 is_running, 2 poll, 4 message, 8 stop, \
             16 release, 32/64 its own server)"
        );
        // The parent's server is untouched.
        assert_eq!(rocev2_server_is_running(srv), 1);
        assert_eq!(rocev2_server_stop(srv), rocev2_status::ROCEV2_OK);
        rocev2_server_destroy(srv);
        rocev2_device_close(dev);
    }
}
