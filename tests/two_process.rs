//! Two processes over loopback: `rocev2 recv` (a soft-backend server that
//! prints its host params as JSON) and `rocev2 fpga-sim` (the emulator,
//! programmed with those params), as a firmware engineer would run them.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

mod common;
use common::{number, recv_command};

#[test]
fn recv_and_fpga_sim_interoperate() {
    let exe = env!("CARGO_BIN_EXE_rocev2");
    let mut recv = recv_command()
        .args([
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
        number(&params, "qpn"),
        number(&params, "sq_psn"),
        number(&params, "udp_port"),
    );
    assert_eq!(number(&params, "mr_len"), 64 * 8192);
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
    assert_eq!(number(&sim_json, "frames"), 5000);
    let mut summary = String::new();
    out.read_to_string(&mut summary).unwrap();
    assert!(recv.wait().unwrap().success(), "{summary}");
    assert_eq!(number(&summary, "frames"), 5000, "{summary}");
    assert_eq!(number(&summary, "bytes"), 5000 * 8000);
    assert_eq!(number(&summary, "verify_errors"), 0);
}

#[test]
fn cli_errors_are_clear() {
    let exe = env!("CARGO_BIN_EXE_rocev2");
    let o = Command::new(exe)
        .args(["recv", "--port", "0", "--fpga-qpn", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--fpga-ip <IP>"));
    assert!(o.stdout.is_empty(), "no host params before the check");
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

/// Received ICRCs through the CLI: checked by raw capture with CAP_NET_RAW,
/// and without it (the capability dropped with setpriv) `auto` falls back to
/// unchecked while `require` refuses with an error that says what to do.
#[test]
fn icrc_check_modes_follow_cap_net_raw() {
    let exe = env!("CARGO_BIN_EXE_rocev2");
    // `pre` runs the demo under another program (setpriv); `more` adds options.
    let demo_with = |pre: &[&str], mode: &str, more: &[&str]| {
        let mut args: Vec<&str> = pre.to_vec();
        let common = ["demo", "--frames", "3000", "--size", "2000", "--icrc-check"];
        args.push(exe);
        args.extend(common);
        args.push(mode);
        args.extend(more);
        Command::new(args[0]).args(&args[1..]).output().unwrap()
    };
    let demo = |pre: &[&str], mode: &str| demo_with(pre, mode, &[]);
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let o = demo(&[], "off");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ICRC 0 checked, 3000 unchecked"),
        "{}",
        text(&o)
    );
    if !rocev2::soft::raw_capture_allowed() {
        assert!(
            std::env::var_os("ROCEV2_REQUIRE_RAW").is_none(),
            "ROCEV2_REQUIRE_RAW is set but raw capture is not allowed"
        );
        eprintln!("no CAP_NET_RAW: the checked-ICRC half of this test is not run");
        return;
    }
    let o = demo(&[], "require");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ICRC 3000 checked, 0 unchecked"),
        "{}",
        text(&o)
    );
    // A corrupting link: the check drops the damaged packets, the emulator
    // resends them, every byte still verifies.
    let o = demo_with(&[], "require", &["--faults", "corrupt=0.05", "--seed", "7"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("verify           : OK"), "{}", text(&o));
    // Every corrupted packet was caught (nothing else is lost on loopback).
    let number_before = |t: &str, word: &str| -> u64 {
        let at = t.find(word).unwrap_or_else(|| panic!("no {word:?} in {t}"));
        t[..at].split_whitespace().last().unwrap().parse().unwrap()
    };
    let t = text(&o);
    let corrupted = number_before(&t, " corrupted");
    assert!(corrupted > 50, "{t}");
    assert_eq!(
        number_before(&t, " packets dropped for a bad ICRC"),
        corrupted,
        "{t}"
    );
    // Without CAP_NET_RAW (when setpriv is there to drop it).
    let setpriv = ["setpriv", "--inh-caps=-net_raw", "--bounding-set=-net_raw"];
    if Command::new("setpriv").arg("--version").output().is_err() {
        eprintln!("setpriv not installed: the no-CAP_NET_RAW half is not run");
        return;
    }
    let o = demo(&setpriv, "auto");
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("ICRC 0 checked, 3000 unchecked"),
        "{}",
        text(&o)
    );
    let o = demo(&setpriv, "require");
    assert!(!o.status.success());
    assert!(text(&o).contains("CAP_NET_RAW"), "{}", text(&o));
}
