//! Two processes over loopback: `rocev2 recv` (a soft-backend server that
//! prints its host params as JSON) and `rocev2 fpga-sim` (the emulator,
//! programmed with those params), as a firmware engineer would run them.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

fn field(json: &str, key: &str) -> u64 {
    let at = json
        .find(&format!("\"{key}\": "))
        .unwrap_or_else(|| panic!("{key} in {json}"));
    json[at + key.len() + 4..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap()
}

#[test]
fn recv_and_fpga_sim_interoperate() {
    let exe = env!("CARGO_BIN_EXE_rocev2");
    let mut recv = Command::new(exe)
        .args([
            "recv",
            "--port",
            "0",
            "--peer-port",
            "0",
            "--fpga-ip",
            "127.0.0.1",
            "--fpga-qpn",
            "0x4242",
            "--frames",
            "5000",
            "--verify",
            "--idle-timeout",
            "60",
            "--depth",
            "64",
            "--max-payload",
            "8192",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(recv.stdout.take().unwrap());
    let mut params = String::new();
    out.read_line(&mut params).unwrap();
    let (qpn, psn, port) = (
        field(&params, "qpn"),
        field(&params, "sq_psn"),
        field(&params, "udp_port"),
    );
    assert_eq!(field(&params, "mr_len"), 64 * 8192);
    let sim = Command::new(exe)
        .args([
            "fpga-sim",
            "--host",
            &format!("127.0.0.1:{port}"),
            "--host-qpn",
            &qpn.to_string(),
            "--psn",
            &psn.to_string(),
            "--qpn",
            "0x4242",
            "--frames",
            "5000",
            "--size",
            "8000",
            "--channels",
            "0,1",
            "--faults",
            "drop=0.005,reorder=0.005",
            "--timeout-code",
            "12",
        ])
        .output()
        .unwrap();
    assert!(
        sim.status.success(),
        "{}",
        String::from_utf8_lossy(&sim.stderr)
    );
    let sim_json = String::from_utf8(sim.stdout).unwrap();
    assert_eq!(field(&sim_json, "frames"), 5000);
    let mut summary = String::new();
    out.read_to_string(&mut summary).unwrap();
    assert!(recv.wait().unwrap().success(), "{summary}");
    assert_eq!(field(&summary, "frames"), 5000, "{summary}");
    assert_eq!(field(&summary, "bytes"), 5000 * 8000);
    assert_eq!(field(&summary, "verify_errors"), 0);
}

#[test]
fn cli_errors_are_clear() {
    let exe = env!("CARGO_BIN_EXE_rocev2");
    let o = Command::new(exe)
        .args(["recv", "--port", "0", "--fpga-qpn", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--fpga-ip is required"));
    let o = Command::new(exe)
        .args(["demo", "--faults", "bogus=1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown fault"));
    let o = Command::new(exe)
        .args(["demo", "--frames"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(exe)
        .args(["demo", "--frames", "2000", "--size", "5000", "--pmtu", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("verify           : OK"));
}
