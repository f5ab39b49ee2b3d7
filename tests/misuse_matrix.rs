//! The C API misuse matrix, driven from Rust through the exported `extern "C"`
//! functions exactly as a C caller would: wrong-state calls, double stop,
//! unknown and double releases, stop from inside the callback, destroy from
//! another thread while frames flow, a panicking Rust callback, and 1000
//! create/stop/destroy cycles with no growth in file descriptors or memory.

use std::ffi::c_void;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rocev2::emulator::pattern;
use rocev2::emulator::{EmulatorConfig, FpgaEmulator};
use rocev2::ffi::*;

mod common;

/// fd and RSS accounting needs the process to itself: the tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

struct Soft {
    dev: *mut rocev2_device,
    srv: *mut rocev2_server,
    hp: rocev2_host_params,
}

fn soft(depth: u32) -> Soft {
    let (dev, srv, hp) = common::soft_c_server(depth, 300);
    Soft { dev, srv, hp }
}

fn emulator(s: &Soft) -> FpgaEmulator {
    let mut c = EmulatorConfig::new(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, s.hp.udp_port),
        s.hp.qpn,
        s.hp.sq_psn,
    );
    c.qpn = 0x4242;
    c.timeout_code = 10;
    c.retry_cnt = 3;
    FpgaEmulator::new(c).unwrap()
}

fn connect(s: &Soft) -> rocev2_status {
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe { rocev2_server_complete_connection(s.srv, 0x4242, s.hp.sq_psn, 5, 1) }
}

fn last_error() -> String {
    let mut buf = [0 as std::ffi::c_char; 512];
    // SAFETY: buf is writable for buf.len() bytes.
    unsafe { rocev2_last_error(buf.as_mut_ptr(), buf.len()) };
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn release_dev(s: Soft) {
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        rocev2_server_destroy(s.srv);
        rocev2_device_close(s.dev);
    }
}

#[test]
fn wrong_state_calls_and_double_stop() {
    let _serial = serial();
    use rocev2_status::*;
    let s = soft(4);
    // SAFETY: a C struct of integers and pointers: all zeroes is a valid value.
    let mut fr: rocev2_frame = unsafe { std::mem::zeroed() };
    fr.struct_size = std::mem::size_of_val(&fr) as u32;
    unsafe {
        // Before the connection: no frame, no thread.
        assert_eq!(
            rocev2_server_poll_frame(s.srv, 0, &mut fr),
            ROCEV2_ERR_TIMEOUT
        );
        assert_eq!(rocev2_server_is_running(s.srv), 0);
        assert_eq!(connect(&s), ROCEV2_OK);
        assert_eq!(connect(&s), ROCEV2_ERR_STATE);
        assert!(last_error().contains("completeConnection already invoked"));
        let gid = [0u8; 16];
        assert_eq!(
            rocev2_server_set_fpga_gid(s.srv, gid.as_ptr()),
            ROCEV2_ERR_STATE
        );
        assert_eq!(rocev2_server_stop(s.srv), ROCEV2_OK);
        assert_eq!(rocev2_server_stop(s.srv), ROCEV2_OK, "double stop");
        assert_eq!(connect(&s), ROCEV2_ERR_STOPPED);
        assert_eq!(
            rocev2_server_poll_frame(s.srv, 0, &mut fr),
            ROCEV2_ERR_STOPPED
        );
        assert_eq!(
            rocev2_server_release(s.srv, 0x1_0000_0000),
            ROCEV2_ERR_UNKNOWN_TOKEN
        );
        let mut st: rocev2_stats = std::mem::zeroed();
        st.struct_size = std::mem::size_of_val(&st) as u32;
        assert_eq!(rocev2_server_get_stats(s.srv, &mut st), ROCEV2_OK);
        assert_eq!(st.invalid_releases, 1);
        // ABI 2: the library writes at most struct_size bytes; 4 is just the
        // size field, less cannot hold it.
        st.struct_size = 4;
        assert_eq!(rocev2_server_get_stats(s.srv, &mut st), ROCEV2_OK);
        assert_eq!(st.struct_size, 4);
        st.struct_size = 3;
        assert_eq!(
            rocev2_server_get_stats(s.srv, &mut st),
            ROCEV2_ERR_INVALID_ARGUMENT
        );
    }
    release_dev(s);
}

unsafe extern "C" fn stop_inside(user: *mut c_void, f: *const rocev2_frame) {
    let srv = user as *mut rocev2_server;
    // SAFETY: f is the frame the library passes to the callback, valid for the call; srv is the server the callback was registered with.
    unsafe {
        assert_eq!(
            rocev2_server_release(srv, (*f).token),
            rocev2_status::ROCEV2_OK
        );
        assert_eq!(
            rocev2_server_release(srv, (*f).token),
            rocev2_status::ROCEV2_ERR_UNKNOWN_TOKEN
        );
        CALLS.fetch_add(1, Ordering::SeqCst);
        assert_eq!(rocev2_server_stop(srv), rocev2_status::ROCEV2_OK);
    }
}
static CALLS: AtomicU64 = AtomicU64::new(0);

#[test]
fn stop_from_inside_the_callback_and_release_twice() {
    let _serial = serial();
    let s = soft(8);
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        assert_eq!(
            rocev2_server_register_frame_callback(s.srv, Some(stop_inside), s.srv as *mut c_void),
            rocev2_status::ROCEV2_OK
        );
    }
    assert_eq!(connect(&s), rocev2_status::ROCEV2_OK);
    let mut emu = emulator(&s);
    for i in 0..5 {
        emu.submit(pattern::make(i, 64), 0);
    }
    let _ = emu.run_until_idle(Duration::from_secs(2)); // may give up once the server stops
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(CALLS.load(Ordering::SeqCst), 1, "no callback after stop");
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    assert_eq!(unsafe { rocev2_server_is_running(s.srv) }, 0);
    release_dev(s);
}

unsafe extern "C" fn count_and_release(user: *mut c_void, f: *const rocev2_frame) {
    let srv = user as *mut rocev2_server;
    // SAFETY: f is the frame the library passes to the callback, valid for the call; srv is the server the callback was registered with.
    unsafe { rocev2_server_release(srv, (*f).token) };
    FLOWING.fetch_add(1, Ordering::SeqCst);
}
static FLOWING: AtomicU64 = AtomicU64::new(0);

#[test]
fn destroy_from_another_thread_while_frames_flow() {
    let _serial = serial();
    let s = soft(32);
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        rocev2_server_register_frame_callback(s.srv, Some(count_and_release), s.srv as *mut c_void)
    };
    assert_eq!(connect(&s), rocev2_status::ROCEV2_OK);
    let mut emu = emulator(&s);
    let srv = s.srv as usize;
    let destroyer = std::thread::spawn(move || {
        while FLOWING.load(Ordering::SeqCst) < 200 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
        unsafe { rocev2_server_destroy(srv as *mut rocev2_server) };
    });
    // The sender streams until the server goes away, then gives up cleanly.
    let r = emu.stream(1_000_000, 64, &[0], 64, Duration::from_secs(30), |_| {});
    assert!(r.is_err(), "the emulator notices that the server is gone");
    destroyer.join().unwrap();
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe { rocev2_device_close(s.dev) };
    assert!(FLOWING.load(Ordering::SeqCst) >= 200);
}

#[test]
fn a_panicking_rust_callback_is_counted_and_the_thread_survives() {
    let _serial = serial();
    let d = rocev2::DeviceConfig::soft_ephemeral("127.0.0.1");
    let server = rocev2::Server::create(
        &rocev2::Device::open(&d).unwrap(),
        &rocev2::ServerConfig {
            max_payload: 1024,
            rx_queue_depth: 8,
            ..Default::default()
        },
    )
    .unwrap();
    let hp = server.host_params();
    let mut c = EmulatorConfig::new(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, hp.udp_port),
        hp.qpn,
        hp.sq_psn,
    );
    c.qpn = 0x77;
    let mut emu = FpgaEmulator::new(c).unwrap();
    server.set_fpga_gid(emu.gid()).unwrap();
    let ok = std::sync::Arc::new(AtomicU64::new(0));
    let ok2 = ok.clone();
    server
        .set_frame_callback(move |f| {
            if pattern::check(f.data()).unwrap() % 10 == 3 {
                panic!("consumer bug (expected by the test)");
            }
            ok2.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    server
        .complete_connection(&rocev2::ConnectParams::new(0x77, hp.sq_psn, 5, 1).unwrap())
        .unwrap();
    emu.stream(100, 64, &[0], 16, Duration::from_secs(30), |_| {})
        .unwrap();
    wait_until(|| ok.load(Ordering::SeqCst) >= 90);
    assert_eq!(ok.load(Ordering::SeqCst), 90);
    let st = server.stats();
    assert_eq!(st.callback_panics, 10);
    assert_eq!(
        st.loans_outstanding, 0,
        "the panicking callback's frame was released"
    );
    assert!(server.is_running());
}

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    s.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 4
}

#[test]
fn a_thousand_create_stop_destroy_cycles_leak_nothing() {
    let _serial = serial();
    let cycle = |i: u32| {
        let s = soft(16);
        if i % 2 == 0 {
            assert_eq!(connect(&s), rocev2_status::ROCEV2_OK);
            // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
            unsafe { assert_eq!(rocev2_server_stop(s.srv), rocev2_status::ROCEV2_OK) };
        }
        release_dev(s);
    };
    for i in 0..50 {
        cycle(i); // warm-up: thread stacks, allocator arenas, logger
    }
    let (fd0, rss0) = (fds(), rss_kib());
    for i in 0..1000 {
        cycle(i);
    }
    let (fd1, rss1) = (fds(), rss_kib());
    assert_eq!(fd1, fd0, "file descriptors leaked over 1000 cycles");
    assert!(
        rss1 < rss0 + 8 * 1024,
        "RSS grew from {rss0} KiB to {rss1} KiB over 1000 cycles"
    );
    println!("1000 cycles: fds {fd0} -> {fd1}, RSS {rss0} -> {rss1} KiB");
}

/// Streams `n` pattern frames (sequence numbers from `first`) from `emu` to
/// its server, which has no callback: they queue for poll_frame.
fn queue_frames(emu: &mut FpgaEmulator, first: u64, n: u64) {
    for i in first..first + n {
        emu.submit(pattern::make(i, 64), 0);
    }
    emu.run_until_idle(Duration::from_secs(10))
        .expect("the server ACKs every frame");
}

/// Waits until `done()` holds, for at most 10 s (the assertion after it
/// says what was expected).
fn wait_until(mut done: impl FnMut() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A soft server, connected.
fn connected(depth: u32) -> Soft {
    let s = soft(depth);
    assert_eq!(connect(&s), rocev2_status::ROCEV2_OK);
    s
}

fn release(srv: *mut rocev2_server, token: u64) -> rocev2_status {
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe { rocev2_server_release(srv, token) }
}

fn poll(srv: *mut rocev2_server) -> (rocev2_status, rocev2_frame) {
    // SAFETY: a C struct of integers and pointers: all zeroes is a valid value.
    let mut fr: rocev2_frame = unsafe { std::mem::zeroed() };
    fr.struct_size = std::mem::size_of_val(&fr) as u32;
    let st = unsafe { rocev2_server_poll_frame(srv, 5000, &mut fr) };
    (st, fr)
}

fn payload(fr: &rocev2_frame) -> &[u8] {
    // SAFETY: fr was loaned by a poll that returned OK and is not released yet: data..data+len is its slot's payload, kept alive by the loan.
    unsafe { std::slice::from_raw_parts(fr.data, fr.len as usize) }
}

fn stats(srv: *mut rocev2_server) -> rocev2_stats {
    // SAFETY: a C struct of integers and pointers: all zeroes is a valid value.
    let mut st: rocev2_stats = unsafe { std::mem::zeroed() };
    st.struct_size = std::mem::size_of_val(&st) as u32;
    assert_eq!(
        unsafe { rocev2_server_get_stats(srv, &mut st) },
        rocev2_status::ROCEV2_OK
    );
    st
}

#[test]
fn a_token_of_another_server_releases_nothing() {
    let _serial = serial();
    use rocev2_status::*;
    let (a, b) = (connected(2), connected(2));
    queue_frames(&mut emulator(&a), 0, 1);
    queue_frames(&mut emulator(&b), 100, 1);
    let (sa, fa) = poll(a.srv);
    let (sb, fb) = poll(b.srv);
    assert_eq!((sa, sb), (ROCEV2_OK, ROCEV2_OK));
    // Both first loans: the same slot. The tokens still differ (every loan
    // of the process has its own serial), and B's does nothing to A.
    assert_eq!((fa.slot, fb.slot), (0, 0));
    assert_ne!(fa.token, fb.token);
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        assert_eq!(
            rocev2_server_release(a.srv, fb.token),
            ROCEV2_ERR_UNKNOWN_TOKEN
        );
        assert!(
            last_error().contains("another server's"),
            "{}",
            last_error()
        );
        assert_eq!(
            rocev2_server_release_many(a.srv, &fb.token, 1),
            ROCEV2_ERR_UNKNOWN_TOKEN
        );
    }
    let st = stats(a.srv);
    assert_eq!((st.loans_outstanding, st.invalid_releases), (1, 2));
    assert_eq!(pattern::check(payload(&fa)), Ok(0), "A's frame is intact");
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        assert_eq!(rocev2_server_release(a.srv, fa.token), ROCEV2_OK);
        assert_eq!(rocev2_server_release(b.srv, fb.token), ROCEV2_OK);
    }
    release_dev(a);
    release_dev(b);
}

#[test]
fn no_token_can_take_a_frame_queued_for_poll() {
    let _serial = serial();
    use rocev2_status::*;
    let (s, b) = (connected(4), connected(4));
    let mut emu = emulator(&s);
    queue_frames(&mut emu, 0, 1);
    queue_frames(&mut emulator(&b), 100, 1);
    // B's first token names slot 0, generation 1: the loan of the frame
    // waiting in this server's poll queue. It must not end that loan.
    let (_, fb) = poll(b.srv);
    assert_eq!(release(s.srv, fb.token), ROCEV2_ERR_UNKNOWN_TOKEN);
    let (st, first) = poll(s.srv);
    assert_eq!((st, first.slot, first.len), (ROCEV2_OK, 0, 64));
    assert_eq!(pattern::check(payload(&first)), Ok(0));
    assert_eq!(release(s.srv, first.token), ROCEV2_OK);
    // The next frame lands in slot 1 under generation 1 and waits in the
    // poll queue: its loan is a frame's, which no token may end, even one
    // with this server's tag and that slot and generation.
    queue_frames(&mut emu, 1, 1);
    // The server ACKs a frame before it hands it on: the emulator may see
    // the ACK before the frame is queued.
    wait_until(|| stats(s.srv).loans_outstanding >= 1);
    let tag = first.token & !0xff_ffff_ffff;
    for forged in [tag | (1 << 16) | 1, tag | (2 << 16) | 1, first.token] {
        assert_eq!(release(s.srv, forged), ROCEV2_ERR_UNKNOWN_TOKEN);
    }
    assert_eq!(stats(s.srv).loans_outstanding, 1);
    let (st, fr) = poll(s.srv);
    assert_eq!((st, fr.slot, fr.len), (ROCEV2_OK, 1, 64));
    assert_eq!(pattern::check(payload(&fr)), Ok(1));
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        assert_eq!(rocev2_server_stop(s.srv), ROCEV2_OK);
        assert_eq!(rocev2_server_release(s.srv, fr.token), ROCEV2_OK);
        assert_eq!(rocev2_server_release(b.srv, fb.token), ROCEV2_OK);
    }
    release_dev(s);
    release_dev(b);
}

#[test]
fn a_destroyed_handle_is_refused_not_dereferenced() {
    let _serial = serial();
    use rocev2_status::*;
    let s = connected(2);
    queue_frames(&mut emulator(&s), 0, 1);
    let (_, fr) = poll(s.srv);
    let (srv, dev) = (s.srv, s.dev);
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        rocev2_server_destroy(srv);
        // The token keeps the slab: the frame is readable after destroy.
        assert_eq!(pattern::check(payload(&fr)), Ok(0));
        assert_eq!(rocev2_server_stop(srv), ROCEV2_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("was destroyed"), "{}", last_error());
        assert_eq!(rocev2_server_release(srv, fr.token), ROCEV2_OK);
        // The last token is back: the server is gone, and so is its handle.
        assert_eq!(
            rocev2_server_release(srv, fr.token),
            ROCEV2_ERR_UNKNOWN_TOKEN
        );
        assert_eq!(
            rocev2_server_release_many(srv, &fr.token, 1),
            ROCEV2_ERR_UNKNOWN_TOKEN
        );
        assert_eq!(rocev2_server_stop(srv), ROCEV2_ERR_INVALID_ARGUMENT);
        rocev2_server_destroy(srv); // logged, nothing else
                                    // A pointer that never was a handle.
        let bogus = 0xdead_bee0usize as *mut rocev2_server;
        assert_eq!(rocev2_server_stop(bogus), ROCEV2_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("not a handle"), "{}", last_error());
        rocev2_device_close(dev);
    }
}

static LOGGED: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn count_log(
    _: *mut c_void,
    _: rocev2_log_level,
    _: *const std::ffi::c_char,
    _: *const std::ffi::c_char,
) {
    LOGGED.fetch_add(1, Ordering::SeqCst);
}

/// Replaces itself with `count_log`, and logs from inside (a bogus destroy
/// logs an error): that record goes to stderr, not back in here.
unsafe extern "C" fn replace_self(
    _: *mut c_void,
    _: rocev2_log_level,
    _: *const std::ffi::c_char,
    _: *const std::ffi::c_char,
) {
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    unsafe {
        rocev2_server_destroy(0xbad0 as *mut rocev2_server);
        let st = rocev2_set_log_callback(Some(count_log), ptr::null_mut(), 1);
        assert_eq!(st, rocev2_status::ROCEV2_OK);
    }
}

/// A log callback may call rocev2_set_log_callback (finding 9 of the
/// hardening issue: it deadlocked on the sink's lock).
#[test]
fn a_log_callback_may_replace_itself() {
    let _serial = serial();
    let (tx, rx) = std::sync::mpsc::channel();
    // SAFETY: the C API called as a C caller would, misuse included: the library checks every handle against its registry (a bogus, stale or destroyed handle is refused, never dereferenced), and every pointer passed here is valid for the call.
    std::thread::spawn(move || unsafe {
        let bogus = 0xbad0 as *mut rocev2_server;
        rocev2_set_log_callback(Some(replace_self), ptr::null_mut(), 1);
        rocev2_server_destroy(bogus); // logs: replace_self runs
        rocev2_server_destroy(bogus); // logs: count_log runs
        rocev2_set_log_callback(None, ptr::null_mut(), 0);
        tx.send(LOGGED.load(Ordering::SeqCst)).unwrap();
    });
    let logged = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the log callback deadlocked");
    assert_eq!(logged, 1);
}
