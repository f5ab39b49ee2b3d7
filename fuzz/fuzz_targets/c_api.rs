//! Arbitrary sequences of C API calls on a soft-backend server (wrong states,
//! bogus tokens, odd parameters, NULLs) and arbitrary datagrams sent to its
//! socket: no panic escapes, nothing crashes, every call returns a status.
//! Tokens and lifetimes are checked too: a token that is not outstanding
//! (made up, released already, or one of ours with another server's tag) is
//! refused, and a destroyed handle is refused, never dereferenced.
#![no_main]
use std::ffi::CString;
use std::ptr;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rocev2::ffi::*;

#[derive(Arbitrary, Debug)]
enum Call {
    SetGid([u8; 16]),
    SetGidNull,
    HostParams,
    Connect {
        qpn: u32,
        psn: u32,
        pmtu: u8,
        rnr: u8,
    },
    Poll,
    Release(u64),
    /// One of ours with its tag (the server's, bits 40..64) replaced.
    ReleaseRetagged(u32),
    Stats(u8),
    Destroy,
    Stop,
    Datagram(Vec<u8>),
}

fuzz_target!(|input: (u16, u16, Vec<Call>)| {
    let (depth, payload, calls) = input;
    unsafe {
        let mut dc: rocev2_device_config = std::mem::zeroed();
        rocev2_device_config_init(&mut dc, std::mem::size_of_val(&dc));
        let name = CString::new("soft").unwrap();
        dc.name = name.as_ptr();
        dc.udp_port = 0;
        dc.peer_udp_port = 0;
        // The datagrams below come from a plain UDP socket (IP ID not 0), so
        // a checked ICRC would stop them all before the responder; and each
        // raw capture socket costs an RCU grace period to close.
        dc.icrc_check = ROCEV2_ICRC_OFF;
        let mut dev = ptr::null_mut();
        if rocev2_device_open(&dc, &mut dev) != rocev2_status::ROCEV2_OK {
            return;
        }
        let mut sc: rocev2_server_config = std::mem::zeroed();
        rocev2_server_config_init(&mut sc, std::mem::size_of_val(&sc));
        sc.rx_queue_depth = (depth % 40) as u32;
        sc.max_payload = (payload % 9000) as u32;
        sc.spin_us = 0;
        let mut srv = ptr::null_mut();
        if rocev2_server_create(dev, &sc, &mut srv) != rocev2_status::ROCEV2_OK {
            rocev2_device_close(dev);
            return;
        }
        let mut hp: rocev2_host_params = std::mem::zeroed();
        hp.struct_size = std::mem::size_of_val(&hp) as u32;
        rocev2_server_get_host_params(srv, &mut hp);
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut frames: Vec<u64> = Vec::new();
        let mut destroyed = false;
        for c in calls.into_iter().take(64) {
            match c {
                Call::SetGid(g) => {
                    rocev2_server_set_fpga_gid(srv, g.as_ptr());
                }
                Call::SetGidNull => {
                    rocev2_server_set_fpga_gid(srv, ptr::null());
                }
                Call::HostParams => {
                    rocev2_server_get_host_params(srv, &mut hp);
                }
                Call::Connect {
                    qpn,
                    psn,
                    pmtu,
                    rnr,
                } => {
                    rocev2_server_complete_connection(srv, qpn, psn, pmtu as u32, rnr as u32);
                }
                Call::Poll => {
                    let mut f: rocev2_frame = std::mem::zeroed();
                    f.struct_size = std::mem::size_of_val(&f) as u32;
                    if rocev2_server_poll_frame(srv, 0, &mut f) == rocev2_status::ROCEV2_OK {
                        frames.push(f.token);
                    }
                }
                Call::Release(t) => {
                    // A token of ours, or an arbitrary one (which must be refused).
                    if t % 2 == 0 && !frames.is_empty() {
                        let token = frames.remove((t as usize / 2) % frames.len());
                        let st = rocev2_server_release(srv, token);
                        assert_eq!(st, rocev2_status::ROCEV2_OK, "an outstanding token");
                    } else if !frames.contains(&t) {
                        let st = rocev2_server_release(srv, t);
                        assert_ne!(st, rocev2_status::ROCEV2_OK, "token {t:#x} is not ours");
                    }
                }
                Call::ReleaseRetagged(tag) => {
                    if let Some(&t) = frames.first() {
                        let other = (t & 0xff_ffff_ffff) | ((tag as u64) << 40);
                        if other != t {
                            let st = rocev2_server_release(srv, other);
                            assert_ne!(st, rocev2_status::ROCEV2_OK, "another server's token");
                        }
                    }
                }
                Call::Destroy => {
                    // Later calls act on a destroyed handle: refused.
                    if !destroyed {
                        rocev2_server_destroy(srv);
                        destroyed = true;
                    }
                }
                Call::Stats(n) => {
                    let mut st: rocev2_stats = std::mem::zeroed();
                    st.struct_size = std::mem::size_of_val(&st) as u32;
                    st.struct_size = n as u32 * 4;
                    rocev2_server_get_stats(srv, &mut st);
                }
                Call::Stop => {
                    rocev2_server_stop(srv);
                }
                Call::Datagram(d) => {
                    let _ = sock.send_to(&d, ("127.0.0.1", hp.udp_port));
                }
            }
        }
        if !destroyed {
            rocev2_server_destroy(srv);
        }
        for &t in &frames {
            assert_eq!(rocev2_server_release(srv, t), rocev2_status::ROCEV2_OK);
        }
        // Every token is back, the server gone: its handle is refused.
        for &t in &frames {
            assert_ne!(rocev2_server_release(srv, t), rocev2_status::ROCEV2_OK);
        }
        assert_ne!(rocev2_server_stop(srv), rocev2_status::ROCEV2_OK);
        rocev2_device_close(dev);
    }
});
