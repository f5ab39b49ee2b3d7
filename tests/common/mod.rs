//! Helpers shared by the integration tests that drive the `rocev2` CLI or
//! the C API.

/// The value of `key` in one line of the CLI's JSON output, as text: a
/// number, or a string without its quotes (GIDs keep their colons).
pub fn field(json: &str, key: &str) -> String {
    let at = json
        .find(&format!("\"{key}\": "))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    let rest = &json[at + key.len() + 4..];
    let rest = rest.trim_start_matches('"');
    rest.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == ':')
        .collect()
}

/// [`field`] of a number.
#[allow(dead_code)] // not every test crate reads numbers
pub fn number(json: &str, key: &str) -> u64 {
    let v = field(json, key);
    v.parse()
        .unwrap_or_else(|_| panic!("{key} = {v:?} is not a number in {json}"))
}

/// `rocev2 recv` on a free UDP port, ACKing each packet's source port, for
/// an FPGA emulator on 127.0.0.1 with QP 0x4242; add the rest with `.args`.
#[allow(dead_code)] // not every test crate starts a receiver
pub fn recv_command() -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_rocev2"));
    c.args(["recv", "--port", "0", "--peer-port", "0"]).args([
        "--fpga-ip",
        "127.0.0.1",
        "--fpga-qpn",
        "0x4242",
    ]);
    c
}

/// Runs `cmd` to its end; panics with its stderr unless it succeeded.
#[allow(dead_code)] // not every test crate runs commands
pub fn output_ok(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Through the C API: a soft device and a server on it (127.0.0.1, a free
/// UDP port, ACKs to each packet's source port; 1 KiB slots, `depth` of
/// them, `stop_timeout_ms`), the FPGA GID 127.0.0.1 set; with its host
/// params.
#[allow(dead_code)] // not every test crate drives the C API
pub fn soft_c_server(
    depth: u32,
    stop_timeout_ms: u32,
) -> (
    *mut rocev2::ffi::rocev2_device,
    *mut rocev2::ffi::rocev2_server,
    rocev2::ffi::rocev2_host_params,
) {
    use rocev2::ffi::*;
    // SAFETY: the C API called as a C caller would: structs initialised by
    // their init functions, out-pointers valid, every status checked.
    unsafe {
        let mut dc: rocev2_device_config = std::mem::zeroed();
        assert_eq!(
            rocev2_device_config_init(&mut dc, std::mem::size_of_val(&dc)),
            rocev2_status::ROCEV2_OK
        );
        let name = std::ffi::CString::new("soft").unwrap();
        dc.name = name.as_ptr();
        dc.udp_port = 0;
        dc.peer_udp_port = 0;
        let mut dev = std::ptr::null_mut();
        assert_eq!(rocev2_device_open(&dc, &mut dev), rocev2_status::ROCEV2_OK);
        let mut sc: rocev2_server_config = std::mem::zeroed();
        rocev2_server_config_init(&mut sc, std::mem::size_of_val(&sc));
        sc.max_payload = 1024;
        sc.rx_queue_depth = depth;
        sc.stop_timeout_ms = stop_timeout_ms;
        let mut srv = std::ptr::null_mut();
        assert_eq!(
            rocev2_server_create(dev, &sc, &mut srv),
            rocev2_status::ROCEV2_OK
        );
        let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1u8];
        assert_eq!(
            rocev2_server_set_fpga_gid(srv, gid.as_ptr()),
            rocev2_status::ROCEV2_OK
        );
        let mut hp: rocev2_host_params = std::mem::zeroed();
        hp.struct_size = std::mem::size_of_val(&hp) as u32;
        assert_eq!(
            rocev2_server_get_host_params(srv, &mut hp),
            rocev2_status::ROCEV2_OK
        );
        (dev, srv, hp)
    }
}
