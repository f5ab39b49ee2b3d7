//! Helpers shared by the integration tests that drive the `rocev2` CLI.

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
