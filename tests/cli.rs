//! The `rocev2` command line as a user meets it: help for every command,
//! `help CMD`, `--version`, typos, value ranges, errors that name the flag
//! and come before anything is created, exit codes, a closed stdout pipe,
//! the periodic stats line, and `recv --out` recordings read back with a
//! reader written from rogue's data file format description.

use std::io::{BufRead, BufReader, Read};
use std::net::UdpSocket;
use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Output, Stdio};

mod common;

use rocev2::emulator::pattern;
use serde_json::{json, Value};

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_rocev2")
}

fn run(args: &[&str]) -> Output {
    Command::new(exe()).args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A usage error: exit 2, nothing on stdout, stderr containing every `want`.
fn usage_error(args: &[&str], want: &[&str]) {
    let o = run(args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(o.stdout.is_empty(), "{args:?} printed {}", text(&o.stdout));
    for w in want {
        assert!(err.contains(w), "{args:?}: {w:?} not in {err}");
    }
}

const COMMANDS: &[&str] = &[
    "demo",
    "recv",
    "fpga-sim",
    "verbs-fpga",
    "bench",
    "info",
    "version",
];

#[test]
fn every_command_has_help_with_defaults() {
    for cmd in COMMANDS {
        let o = run(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd} --help: {}", text(&o.stderr));
        let help = text(&o.stdout);
        assert!(help.contains(&format!("Usage: rocev2 {cmd}")), "{help}");
        // `rocev2 help CMD` is the same page.
        let o = run(&["help", cmd]);
        assert!(o.status.success());
        assert_eq!(text(&o.stdout), help, "rocev2 help {cmd}");
        assert!(help.contains("Exit codes:"), "{help}");
    }
    let help = text(&run(&["demo", "--help"]).stdout);
    for want in [
        "--frames <N>",
        "[default: 200000]",
        "[default: 4096]",
        "--faults <SPEC>",
    ] {
        assert!(help.contains(want), "{want:?} not in {help}");
    }
    let help = text(&run(&["recv", "--help"]).stdout);
    for want in [
        "--idle-timeout <SECONDS>",
        "[default: 10]",
        "--stats-interval <S>",
        "rogue's data file format",
        "[possible values: auto, off, require]",
    ] {
        assert!(help.contains(want), "{want:?} not in {help}");
    }
    let help = text(&run(&["fpga-sim", "--help"]).stdout);
    assert!(help.contains("[default: 127.0.0.1:4791]"), "{help}");
    assert!(help.contains("--busy-wait"), "{help}");
    // Every command is listed at the top level; no command exits 2.
    let top = run(&["--help"]);
    assert!(top.status.success());
    for cmd in COMMANDS {
        assert!(text(&top.stdout).contains(cmd), "{cmd}");
    }
    let none = run(&[]);
    assert_eq!(none.status.code(), Some(2));
    assert!(text(&none.stderr).contains("Usage: rocev2 <COMMAND>"));
}

#[test]
fn version_flag_and_command() {
    let want = format!("rocev2 {} (C ABI {})", rocev2::VERSION, rocev2::ABI_VERSION);
    for args in [&["--version"][..], &["version"], &["-V"]] {
        let o = run(args);
        assert!(o.status.success());
        assert_eq!(text(&o.stdout).trim(), want, "{args:?}");
    }
}

#[test]
fn typos_are_rejected_with_suggestions() {
    // Before: `demo --frame 1000` ran 200000 frames and exited 0.
    usage_error(
        &["demo", "--frame", "1000"],
        &["unexpected argument '--frame'", "'--frames'"],
    );
    usage_error(&["dmeo"], &["unrecognized subcommand 'dmeo'", "'demo'"]);
    usage_error(&["recv", "--verfy"], &["'--verify'"]);
    usage_error(&["help", "dmeo"], &["dmeo"]);
}

/// Issue 38 (12): `--device sfot` said only "No RDMA devices found on this
/// host"; `fpga-sim --host 127.0.0.1` said "invalid IPv4 socket address
/// syntax".
#[test]
fn a_mistyped_device_or_a_host_without_port_says_what_was_meant() {
    let o = common::recv_command()
        .args(["--device", "sfot", "--idle-timeout", "0.1"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(
        err.contains("--device sfot: ") && err.contains("did you mean --device soft"),
        "{err}"
    );
    // A name far from soft: where the backends and devices are.
    let o = common::recv_command()
        .args(["--device", "mlx5_9", "--idle-timeout", "0.1"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(
        err.contains("--device soft is the userspace backend") && err.contains("rocev2 info"),
        "{err}"
    );
    usage_error(
        &[
            "fpga-sim",
            "--host",
            "127.0.0.1",
            "--host-qpn",
            "1",
            "--psn",
            "0",
        ],
        &["--host", "has no port", "e.g. 127.0.0.1:4791"],
    );
    usage_error(
        &[
            "fpga-sim",
            "--host",
            "localhost:4791",
            "--host-qpn",
            "1",
            "--psn",
            "0",
        ],
        &["is not IP:PORT, e.g. 127.0.0.1:4791"],
    );
}

/// Issue 38 (12): `recv --help` showed the --busy-poll-us default twice and
/// pointed to a README section that had moved to docs/tuning.md. Every
/// option of every command shows at most one default, and every docs page
/// and section a help text names exists.
#[test]
fn help_shows_each_default_once_and_its_doc_references_exist() {
    let root = env!("CARGO_MANIFEST_DIR");
    let headings = |file: &str| -> Vec<String> {
        let page = std::fs::read_to_string(format!("{root}/{file}"))
            .unwrap_or_else(|e| panic!("{file}, named by a --help: {e}"));
        page.lines()
            .filter(|l| l.starts_with('#'))
            .map(|l| l.trim_start_matches('#').trim().to_string())
            .collect()
    };
    for cmd in COMMANDS {
        let help = text(&run(&[cmd, "--help"]).stdout);
        // One option's entry: from its line (starting with -) to the next.
        let mut entries: Vec<String> = Vec::new();
        for line in help.lines() {
            if line.trim_start().starts_with('-') || entries.is_empty() {
                entries.push(String::new());
            }
            entries.last_mut().unwrap().push_str(line);
            entries.last_mut().unwrap().push(' ');
        }
        for e in &entries {
            assert!(e.matches("[default").count() <= 1, "{cmd}: {e}");
        }
        let flat = unwrapped(&help);
        if let Some(at) = flat.find("README \"") {
            panic!(
                "{cmd} --help names a README section (they moved to docs/): {}",
                &flat[at..]
            );
        }
        for (at, _) in flat.match_indices("docs/") {
            let rest = &flat[at..];
            let file = &rest[..rest.find(".md").expect("docs/NAME.md") + 3];
            let found = headings(file);
            if let Some(section) = rest[file.len()..].strip_prefix(", \"") {
                let section = &section[..section.find('"').unwrap()];
                assert!(
                    found.iter().any(|h| h.contains(section)),
                    "{cmd} --help: {file} has no section {section:?} (its: {found:?})"
                );
            }
        }
    }
}

/// Issue 38 (12): the README's and docs/cli.md's command lists omitted
/// `verbs-fpga` and `version`. Each names every command `rocev2 --help`
/// lists.
#[test]
fn the_documented_command_lists_name_every_command() {
    let help = text(&run(&["--help"]).stdout);
    let listed: Vec<&str> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(listed.contains(&"verbs-fpga"), "{help}");
    for page in ["README.md", "docs/cli.md"] {
        let doc =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/").to_string() + page)
                .unwrap();
        for cmd in &listed {
            assert!(
                doc.lines()
                    .any(|l| l.starts_with(&format!("rocev2 {cmd} "))),
                "{page}'s command list lacks `rocev2 {cmd}`"
            );
        }
    }
}

#[test]
fn values_are_typed_and_range_checked() {
    // Before: 5000000000 wrapped to a u32.
    usage_error(
        &["demo", "--size", "5000000000"],
        &["'--size <BYTES>'", "5000000000", "8..=1073741824"],
    );
    usage_error(&["demo", "--frames", "0"], &["--frames", "at least 1"]);
    usage_error(&["demo", "--size", "7"], &["--size", "8..=1073741824"]);
    usage_error(&["demo", "--size", "-5"], &["--size", "not a number"]);
    usage_error(&["demo", "--pmtu", "6"], &["--pmtu", "1..=5"]);
    usage_error(&["demo", "--depth", "65537"], &["--depth", "1..=65536"]);
    usage_error(&["demo", "--channels", "0,256"], &["--channels", "256"]);
    usage_error(&["demo", "--faults", "drop=2"], &["--faults", "0..1"]);
    usage_error(
        &["demo", "--faults", "bogus=1"],
        &["--faults", "unknown fault"],
    );
    usage_error(&["demo", "--udp-ceiling", "-1"], &["--udp-ceiling", "> 0"]);
    usage_error(
        &["demo", "--icrc-check", "maybe"],
        &["--icrc-check", "require"],
    );
    usage_error(&["demo", "--frames"], &["--frames"]);
    let recv = ["recv", "--fpga-ip", "127.0.0.1", "--fpga-qpn"];
    usage_error(
        &[&recv[..], &["0x1000000"]].concat(),
        &["--fpga-qpn", "24 bits"],
    );
    usage_error(
        &[&recv[..], &["1", "--rnr", "32"]].concat(),
        &["--rnr", "0..=31"],
    );
    usage_error(
        &[&recv[..], &["1", "--port", "65536"]].concat(),
        &["--port", "0..=65535"],
    );
    usage_error(
        &[&recv[..], &["1", "--fpga-psn", "0x1000000"]].concat(),
        &["--fpga-psn"],
    );
    usage_error(
        &[&recv[..], &["1", "--bind", "localhost"]].concat(),
        &["--bind"],
    );
    usage_error(
        &[&recv[..], &["1", "--idle-timeout", "0"]].concat(),
        &["--idle-timeout"],
    );
    usage_error(
        &["recv", "--fpga-ip", "10.0.0", "--fpga-qpn", "1"],
        &["--fpga-ip", "not an IPv4 address"],
    );
    let sim = ["fpga-sim", "--host-qpn", "1", "--psn", "1"];
    usage_error(&[&sim[..], &["--host", "1.2.3.4"]].concat(), &["--host"]);
    usage_error(
        &[&sim[..], &["--busy-wait", "--gso"]].concat(),
        &["--busy-wait", "--gso"],
    );
    usage_error(&["bench", "--seconds", "nan"], &["--seconds"]);
    // Hex is accepted where numbers are.
    let o = run(&[
        "demo",
        "--frames",
        "0x40",
        "--size",
        "0x100",
        "--channels",
        "7",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("64 frames x 256 B"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn errors_name_flags_and_come_before_anything_is_created() {
    // Before: recv created a server and printed host params, then found
    // --fpga-ip missing.
    usage_error(
        &["recv", "--port", "0", "--fpga-qpn", "1"],
        &["--fpga-ip <IP>"],
    );
    usage_error(
        &["recv", "--port", "0", "--fpga-ip", "127.0.0.1"],
        &["--fpga-qpn"],
    );
    // The slab, named by the flags that size it (not maxPayload).
    usage_error(
        &["recv", "--fpga-ip", "127.0.0.1", "--fpga-qpn", "1"]
            .iter()
            .chain(&["--port", "0", "--max-payload", "65536", "--depth", "65536"])
            .copied()
            .collect::<Vec<_>>(),
        &[
            "--max-payload 65536 x --depth 65536",
            "lower --max-payload or --depth",
        ],
    );
    usage_error(
        &["demo", "--size", "0x10000", "--depth", "0x10000"],
        &["--size 65536 x --depth 65536", "4 GiB"],
    );
    // A port in use: exit 1, the flags and the cause, nothing printed on stdout.
    let held = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = held.local_addr().unwrap().port().to_string();
    let o = run(&[
        "recv",
        "--port",
        &port,
        "--fpga-ip",
        "127.0.0.1",
        "--fpga-qpn",
        "1",
    ]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert!(
        err.contains(&format!(
            "--bind/--port: binding UDP 127.0.0.1:{port} failed"
        )),
        "{err}"
    );
    assert!(err.contains("in use"), "{err}");
    // The holder named: this test's process (its socket does not share).
    assert!(
        err.contains(&format!("another process, pid {}", std::process::id())),
        "{err}"
    );
    // --faults is echoed in its own syntax.
    let o = run(&[
        "demo",
        "--frames",
        "300",
        "--size",
        "64",
        "--faults",
        "duplicate=0.01",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains(", faults dup=0.01\n"),
        "{}",
        text(&o.stdout)
    );
}

/// Before: `rocev2 info | head -1` panicked (exit 101). Its stdout here is a
/// pipe whose reader is gone before rocev2 starts, so the first write fails.
#[test]
fn a_closed_stdout_pipe_ends_the_process_quietly() {
    for args in [
        &["info"][..],
        &["--help"],
        &["demo", "--frames", "10", "--size", "64"],
    ] {
        let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().unwrap();
        let write_end = reader.stdin.take().unwrap();
        reader.wait().unwrap();
        let child = Command::new(exe())
            .args(args)
            .stdout(Stdio::from(write_end))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let err = text(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            o.status
        );
    }
}

/// `rocev2 recv` on a free port with ACKs to the source port, its host
/// params line parsed.
fn recv(extra: &[&str]) -> (Child, BufReader<std::process::ChildStdout>, Value) {
    let mut cmd = common::recv_command();
    cmd.args(["--max-payload", "4096", "--depth", "64"])
        .args(extra);
    spawn_recv(cmd)
}

/// Starts recv command `cmd`; its host params line parsed.
fn spawn_recv(mut cmd: Command) -> (Child, BufReader<std::process::ChildStdout>, Value) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let params: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    (child, out, params)
}

/// `rocev2 fpga-sim` pointed at `params`, `frames` frames of `size` bytes.
fn fpga_sim_command(params: &Value, frames: u64, size: usize) -> Command {
    let mut c = Command::new(exe());
    c.args([
        "fpga-sim",
        "--host",
        &format!("127.0.0.1:{}", params["udp_port"]),
    ])
    .args(["--host-qpn", &params["qpn"].to_string()])
    .args(["--psn", &params["sq_psn"].to_string(), "--qpn", "0x4242"])
    .args(["--frames", &frames.to_string(), "--size", &size.to_string()]);
    c
}

/// `rocev2 fpga-sim` streaming `frames` frames of `size` bytes to `params`.
fn fpga_sim(params: &Value, frames: u64, size: usize, channels: &str, extra: &[&str]) -> Output {
    let o = fpga_sim_command(params, frames, size)
        .args(["--channels", channels])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
    o
}

/// The JSON summary line and the exit code of a finished recv.
fn finish(mut child: Child, mut out: BufReader<std::process::ChildStdout>) -> (Value, i32, String) {
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let code = child.wait().unwrap().code().unwrap();
    let v = serde_json::from_str(rest.trim()).unwrap_or_else(|e| panic!("{e}: {rest:?} {err}"));
    (v, code, err)
}

#[test]
fn recv_exit_codes_mean_something() {
    // Nothing sent: exit 3; the periodic stats line came while waiting.
    let (child, out, params) = recv(&["--idle-timeout", "0.6", "--stats-interval", "0.2"]);
    for key in [
        "qpn", "rq_psn", "sq_psn", "mr_addr", "mr_len", "mr_rkey", "udp_port",
    ] {
        assert!(params[key].is_u64(), "{key} in {params}");
    }
    assert!(params["gid"].as_str().unwrap().ends_with("ffff:7f00:0001"));
    let (sum, code, err) = finish(child, out);
    assert_eq!(code, 3, "{sum} {err}");
    assert_eq!(sum["frames"], 0);
    assert!(
        err.contains("0 frames") && err.contains("RNR NAKs 0"),
        "{err}"
    );
    // Fewer frames than --frames: exit 5 (timeout), the frames counted.
    let (child, out, params) = recv(&["--frames", "20", "--idle-timeout", "1"]);
    fpga_sim(&params, 8, 512, "0", &[]);
    let (sum, code, err) = finish(child, out);
    assert_eq!((code, sum["frames"].as_u64()), (5, Some(8)), "{sum} {err}");
    // Damaged frames (a corrupting link, ICRCs unchecked): exit 4.
    let (child, out, params) = recv(&["--frames", "300", "--verify", "--icrc-check", "off"]);
    let faults = [
        "--faults",
        "corrupt=0.2",
        "--seed",
        "5",
        "--timeout-code",
        "8",
    ];
    fpga_sim(&params, 300, 1024, "0", &faults);
    let (sum, code, err) = finish(child, out);
    assert_eq!(code, 4, "{sum} {err}");
    assert!(sum["verify_errors"].as_u64().unwrap() > 0, "{sum}");
    assert!(err.contains("verify:"), "{err}");
}

#[test]
fn fpga_sim_without_a_server_times_out_with_exit_5() {
    // A bound socket that never answers: the emulator exhausts its retries.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    let host = silent.local_addr().unwrap().to_string();
    let o = run(
        &["fpga-sim", "--host", &host, "--host-qpn", "1", "--psn", "0"]
            .iter()
            .chain(&["--frames", "1", "--timeout-code", "1"])
            .copied()
            .collect::<Vec<_>>(),
    );
    assert_eq!(o.status.code(), Some(5), "{}", text(&o.stderr));
}

/// One record of rogue's data file format, parsed from its description
/// (rogue docs/src/built_in_modules/utilities/fileio/format.rst): headerA =
/// payload bytes + 4, headerB = channel[31:24] error[23:16] flags[15:0],
/// both little-endian, then the payload.
struct Record<'a> {
    channel: u8,
    error: u8,
    flags: u16,
    payload: &'a [u8],
}

fn rogue_records(mut file: &[u8]) -> Vec<Record<'_>> {
    let mut v = Vec::new();
    while !file.is_empty() {
        assert!(file.len() >= 8, "a truncated header at the end");
        let a = u32::from_le_bytes(file[..4].try_into().unwrap()) as usize;
        let b = u32::from_le_bytes(file[4..8].try_into().unwrap());
        assert!(
            a >= 4 && file.len() >= 4 + a,
            "record size {a} overruns the file"
        );
        v.push(Record {
            channel: (b >> 24) as u8,
            error: (b >> 16) as u8,
            flags: b as u16,
            payload: &file[8..4 + a],
        });
        file = &file[4 + a..];
    }
    v
}

/// Checks a recording of `n` frames of `size` bytes (the emulator's pattern,
/// in order) and returns its records; `ctx` goes into the length message.
fn check_recording<'a>(file: &'a [u8], n: u64, size: usize, ctx: &str) -> Vec<Record<'a>> {
    assert_eq!(file.len() as u64, n * (8 + size as u64), "{ctx}");
    let recs = rogue_records(file);
    assert_eq!(recs.len() as u64, n);
    for (i, r) in recs.iter().enumerate() {
        assert!(
            r.payload == pattern::make(i as u64, size),
            "record {i} differs"
        );
    }
    recs
}

#[test]
fn recv_out_writes_rogues_data_file_format() {
    let dir = std::env::temp_dir().join(format!("rocev2-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.dat");
    let (n, size, channels) = (1500u64, 3000usize, [0u8, 5, 255]);
    let (child, out, params) = recv(&[
        "--frames",
        &n.to_string(),
        "--verify",
        "--out",
        path.to_str().unwrap(),
    ]);
    // Drops and reordering: the recording still holds each frame once, in order.
    let faults = ["--faults", "drop=0.01,reorder=0.01", "--timeout-code", "10"];
    fpga_sim(&params, n, size, "0,5,255", &faults);
    let (sum, code, err) = finish(child, out);
    assert_eq!(code, 0, "{sum} {err}");
    assert_eq!(
        (sum["recorded"].as_u64(), sum["verify_errors"].as_u64()),
        (Some(n), Some(0))
    );
    let file = std::fs::read(&path).unwrap();
    let recs = check_recording(&file, n, size, "");
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r.channel, channels[i % 3], "record {i}");
        assert_eq!((r.error, r.flags), (0, 0), "record {i}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn recv_out_to_an_unwritable_path_fails_before_the_server_starts() {
    let o = run(&[
        "recv",
        "--port",
        "0",
        "--fpga-ip",
        "127.0.0.1",
        "--fpga-qpn",
        "1",
        "--out",
        "/nonexistent-dir/x.dat",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert!(text(&o.stderr).contains("--out /nonexistent-dir/x.dat: cannot create"));
}

/// An FPGA re-programmed after a reload starts over at the host SQ PSN with
/// the same params: the server re-synchronises, delivers every frame, counts
/// the restart and says what happened.
#[test]
fn a_restarted_fpga_is_detected_and_its_new_stream_delivered() {
    // The issue's scenario: one live recv, fpga-sim twice with the same params.
    let (child, out, params) = recv(&["--frames", "2000", "--idle-timeout", "20"]);
    for _ in 0..2 {
        let o = fpga_sim(&params, 1000, 4096, "0,1", &[]);
        let sim: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(sim["frames"], 1000);
    }
    let (sum, code, err) = finish(child, out);
    assert_eq!((code, &sum["frames"]), (0, &json!(2000)), "{sum} {err}");
    assert_eq!(sum["peer_restarts"], 1, "{sum}");
    assert!(
        err.contains("peer restart #1: the FPGA sent a new message at PSN"),
        "{err}"
    );
    // --restart-after: in one run, the frames' sequence numbers going on (--verify).
    let (child, out, params) = recv(&["--frames", "3000", "--verify", "--idle-timeout", "20"]);
    let o = fpga_sim(&params, 3000, 1024, "0", &["--restart-after", "1000"]);
    let sim: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(sim["restarts"], 2, "{sim}");
    let (sum, code, err) = finish(child, out);
    assert_eq!(code, 0, "{sum} {err}");
    assert_eq!(
        (&sum["frames"], &sum["verify_errors"], &sum["peer_restarts"]),
        (&json!(3000), &json!(0), &json!(2)),
        "{sum}"
    );
}

/// `fpga-sim --busy-wait` (surf's window of 4, the ACK busy-polled for):
/// every frame arrives, verified.
#[test]
fn a_busy_waiting_fpga_sim_streams_every_frame_verified() {
    let (child, out, params) = recv(&["--frames", "3000", "--verify", "--idle-timeout", "20"]);
    let o = fpga_sim(&params, 3000, 4096, "0,1", &["--busy-wait"]);
    let sim: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(sim["frames"], 3000, "{sim}");
    let (sum, code, err) = finish(child, out);
    assert_eq!(code, 0, "{sum} {err}");
    assert_eq!(
        (&sum["frames"], &sum["verify_errors"]),
        (&json!(3000), &json!(0)),
        "{sum}"
    );
}

#[test]
fn recv_takes_spin_us_and_cpu_and_refuses_a_cpu_it_may_not_use() {
    // --spin-us 0 (block at once) and --cpu: the stream still arrives whole.
    let (child, out, params) = recv(&[
        "--frames",
        "200",
        "--verify",
        "--spin-us",
        "0",
        "--cpu",
        "0",
    ]);
    fpga_sim(&params, 200, 2048, "0,1", &[]);
    let (sum, code, err) = finish(child, out);
    assert_eq!(
        (code, sum["frames"].as_u64()),
        (0, Some(200)),
        "{sum} {err}"
    );
    assert_eq!(sum["verify_errors"], 0);
    // A CPU this process may not use is refused before the server starts,
    // naming the CPUs it may use.
    let o = run(&[
        "recv",
        "--fpga-ip",
        "127.0.0.1",
        "--fpga-qpn",
        "1",
        "--port",
        "0",
        "--cpu",
        "1023",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("--cpu 1023: this process may run on CPUs"),
        "{}",
        text(&o.stderr)
    );
}

/// `text` with every run of whitespace (clap's wrapping) one space.
fn unwrapped(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Before: the help gave the code's formula only; 0 (infinite in IB) never
/// times out, which a lost last packet turns into a stream that waits forever.
#[test]
fn fpga_sim_help_says_timeout_code_0_never_times_out() {
    let o = run(&["fpga-sim", "--help"]);
    assert!(o.status.success());
    let help = unwrapped(&text(&o.stdout));
    assert!(help.contains("0 = never time out"), "{help}");
}

/// `rocev2 ARGS` with stdout on /dev/full (every write fails with ENOSPC).
fn to_dev_full(args: &[&str]) -> Output {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    Command::new(exe())
        .args(args)
        .stdout(full)
        .output()
        .unwrap()
}

/// Before: println! panicked (exit 101, not a listed code) when stdout could
/// not be written. Now: exit 1 (runtime error) with the cause on stderr.
#[test]
fn an_unwritable_stdout_is_a_runtime_error_naming_stdout() {
    let recv = [
        "recv",
        "--port",
        "0",
        "--peer-port",
        "0",
        "--fpga-ip",
        "127.0.0.1",
        "--fpga-qpn",
        "1",
        "--idle-timeout",
        "0.2",
    ];
    for args in [
        &["version"][..],
        &["--version"],
        &["--help"],
        &["help", "recv"],
        &["info"],
        &["demo", "--frames", "10", "--size", "64"],
        &["bench", "--rows", "icrc", "--seconds", "0.01"],
        &recv,
    ] {
        let o = to_dev_full(args);
        let err = text(&o.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("error: writing stdout failed: No space left on device"),
            "{args:?}: {err}"
        );
    }
}

/// Before: eprintln! panicked (exit 101) when stderr could not be written.
/// Messages on stderr are best effort: the run ends as it would, here with
/// exit 3 (no frame) and its summary on stdout.
#[test]
fn an_unwritable_stderr_does_not_change_the_outcome() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = common::recv_command()
        .args(["--idle-timeout", "0.3", "--stats-interval", "0.1"])
        .stderr(full)
        .output()
        .unwrap();
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(3), "{out}");
    let summary: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(summary["frames"], 0, "{out}");
}

/// Sends signal `name` (INT, TERM, HUP) to `child`, a process this test started.
fn send_signal(child: &Child, name: &str) {
    let st = Command::new("kill")
        .args(["-s", name, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -s {name}");
}

/// `recv --out` in the middle of a long stream gets signal `name`: it stops
/// cleanly, with exit `code`, its summary on stdout and a whole recording.
/// Before: it died by the signal, no summary, and the recording ended in a
/// cut record (its write buffer lost).
fn recv_stops_cleanly_on(name: &str, code: i32) {
    let dir = std::env::temp_dir().join(format!("rocev2-cli-sig{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.dat");
    let size = 3000usize;
    let (child, out, params) = recv(&[
        "--verify",
        "--out",
        path.to_str().unwrap(),
        "--idle-timeout",
        "60",
    ]);
    // Far more frames than the test waits for: the stream is still going
    // when the signal comes.
    let mut sim = endless_fpga_sim(&params, size);
    // Mid-stream: the recording has begun (its first buffer written out).
    let begun = std::time::Instant::now();
    while std::fs::metadata(&path).map_or(0, |m| m.len()) == 0 {
        assert!(
            begun.elapsed() < std::time::Duration::from_secs(120),
            "no frame was recorded"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    send_signal(&child, name);
    let (sum, got, err) = finish(child, out);
    sim.kill().unwrap();
    sim.wait().unwrap();
    assert_eq!(got, code, "{sum} {err}");
    assert!(err.contains(&format!("SIG{name}; stopping")), "{err}");
    // Every frame received is in the recording, whole and in order.
    let n = sum["recorded"].as_u64().unwrap();
    assert!(n > 0, "{sum}");
    assert_eq!(
        (&sum["frames"], &sum["verify_errors"]),
        (&json!(n), &json!(0))
    );
    let file = std::fs::read(&path).unwrap();
    check_recording(&file, n, size, &sum.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn recv_stops_cleanly_on_sigint_with_exit_130() {
    recv_stops_cleanly_on("INT", 130);
}

#[test]
fn recv_stops_cleanly_on_sigterm_with_exit_143() {
    recv_stops_cleanly_on("TERM", 143);
}

/// Issue 38 (3): a closed terminal or a dropped ssh session sends SIGHUP.
/// Before: recv died by it (rc 129 from the shell, no summary, the last
/// record cut).
#[test]
fn recv_stops_cleanly_on_sighup_with_exit_129() {
    recv_stops_cleanly_on("HUP", 129);
}

/// `fpga-sim` streaming "forever" to `params` in the background (killed by
/// the caller once the test has what it waits for).
fn endless_fpga_sim(params: &Value, size: usize) -> Child {
    fpga_sim_command(params, 1_000_000_000, size)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Issue 38 (4): `recv --out FIFO` whose reader exits mid-stream. Before:
/// recv died by SIGPIPE (no message, no summary). Now: the write fails
/// (EPIPE), recv stops, says why, prints its summary (with out_error) and
/// exits 1, the code --help lists for a file that cannot be written.
#[test]
fn recv_out_to_a_fifo_whose_reader_exits_stops_with_a_message_and_a_summary() {
    let dir = std::env::temp_dir().join(format!("rocev2-cli-fifo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("frames.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    // The reader takes 64 KiB of the recording and exits.
    let mut reader = Command::new("head")
        .args(["-c", "65536"])
        .arg(&fifo)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (child, out, params) = recv(&["--out", fifo.to_str().unwrap(), "--idle-timeout", "60"]);
    let mut sim = endless_fpga_sim(&params, 3000);
    let (sum, code, err) = finish(child, out);
    sim.kill().unwrap();
    sim.wait().unwrap();
    assert!(reader.wait().unwrap().success());
    assert_eq!(code, 1, "{sum} {err}");
    assert!(
        err.contains("writing the recording failed") && err.contains("reader exited"),
        "{err}"
    );
    assert!(
        sum["out_error"].as_str().unwrap().contains("reader exited"),
        "{sum}"
    );
    // Every frame taken is counted, the ones after the failure unrecorded.
    let recorded = sum["recorded"].as_u64().unwrap();
    assert!(recorded > 0, "{sum}");
    assert!(sum["frames"].as_u64().unwrap() >= recorded, "{sum}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue 38 (12): frames larger than --max-payload. Before: recv logged
/// nothing, its summary had no count and it exited 3 ("no frame arrived");
/// only fpga-sim said "fatal NAK InvalidRequest". Now: a warning naming
/// max_payload and the frame's size, invalid_naks in the summary, exit 6.
#[test]
fn frames_larger_than_max_payload_are_said_where_the_user_looks() {
    let mut cmd = common::recv_command();
    cmd.args(["--max-payload", "1024", "--depth", "16"])
        .args(["--idle-timeout", "1"]);
    let (child, out, params) = spawn_recv(cmd);
    let sim = fpga_sim_command(&params, 4, 4096).output().unwrap();
    assert!(!sim.status.success(), "{}", text(&sim.stderr));
    let (sum, code, err) = finish(child, out);
    assert_eq!(code, 6, "{sum} {err}");
    assert!(sum["invalid_naks"].as_u64().unwrap() >= 1, "{sum}");
    assert!(
        err.contains("max_payload 1024") && err.contains("a frame of at least"),
        "{err}"
    );
    assert!(err.contains("--max-payload"), "{err}");
}

/// A signal while recv waits for `--fpga-qpn -` on stdin (no connection
/// yet): the same clean stop, with a summary of no frames.
#[test]
fn recv_stops_cleanly_on_sigint_while_it_waits_for_the_qpn() {
    let mut child = Command::new(exe())
        .args([
            "recv",
            "--port",
            "0",
            "--fpga-ip",
            "127.0.0.1",
            "--fpga-qpn",
            "-",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("\"qpn\""), "{line}");
    send_signal(&child, "INT");
    let stdin = child.stdin.take();
    let (sum, code, err) = finish(child, out);
    drop(stdin);
    assert_eq!(code, 130, "{sum} {err}");
    assert_eq!(sum["frames"], 0, "{sum}");
}

/// `demo` in the middle of a long stream gets SIGINT: it stops cleanly,
/// prints its report with the frames delivered (all verified) and exits 130.
/// Before: it died by the signal with no report.
#[test]
fn demo_stops_cleanly_on_sigint_with_exit_130() {
    let mut child = Command::new(exe())
        .args(["demo", "--frames", "1000000000", "--size", "1024"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("rocev2 demo: "), "{line}");
    send_signal(&child, "INT");
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let o = child.wait_with_output().unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{rest} {err}");
    assert!(rest.contains("frames delivered : "), "{rest}");
    assert!(
        rest.contains("verify           : OK for the ") && rest.contains(" before SIGINT"),
        "{rest}"
    );
}

/// A line with every number (decimal, 0x hex, with a fraction) as `N`: what
/// stays the same from run to run.
fn shape(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c.is_ascii_digit() {
            while chars
                .peek()
                .is_some_and(|d| d.is_ascii_hexdigit() || *d == '.' || *d == 'x')
            {
                chars.next();
            }
            out.push('N');
        } else {
            out.push(c);
        }
    }
    out
}

/// The text of `page` from `start` to the end of its fenced block.
fn doc_text_from(page: &str, start: &str) -> String {
    let doc = std::fs::read_to_string(format!("{}/{page}", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let at = doc
        .find(start)
        .unwrap_or_else(|| panic!("{start:?} not in {page}"));
    let rest = &doc[at..];
    let end = rest[start.len()..]
        .find("```")
        .unwrap_or_else(|| panic!("{page}: no closing fence after {start:?}"));
    rest[..start.len() + end].to_string()
}

/// Issue 38 (12): docs/install.md's sample demo output lacked the naps
/// count and the latency line, though it says the lines do not change. The
/// sample's lines are the demo's, numbers aside.
#[test]
fn the_install_docs_sample_demo_output_is_what_demo_prints() {
    let sample = doc_text_from("docs/install.md", "\n```\nrocev2 demo: ");
    let sample = &sample[5..];
    let o = run(&["demo", "--frames", "2000", "--size", "256"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let printed = text(&o.stdout);
    let want: Vec<String> = sample.lines().map(shape).collect();
    let got: Vec<String> = printed.lines().map(shape).collect();
    assert_eq!(
        got, want,
        "demo printed:\n{printed}\ndocs/install.md:\n{sample}"
    );
}

/// The exit-code table in the user guide's CLI page (docs/cli.md) is the
/// one `--help` shows (clap's wrapping aside).
#[test]
fn the_documented_exit_codes_are_the_help_exit_codes() {
    let table = doc_text_from("docs/cli.md", "\nExit codes:\n");
    let table = table.as_str();
    for args in [&["--help"][..], &["recv", "--help"], &["demo", "--help"]] {
        let help = text(&run(args).stdout);
        assert!(
            unwrapped(&help).contains(&unwrapped(table)),
            "{args:?}: docs/cli.md:\n{table}\nhelp:\n{help}"
        );
    }
}

/// issue 36: `recv --counter-wrap` finds every frame number `fpga-sim
/// --faults skip` skipped (as gaps, with how many), and every restart of
/// the emulator's counter (as a reset); the frames themselves all arrive.
#[test]
fn recv_counter_wrap_reports_the_gaps_and_resets_the_emulator_made() {
    let (child, out, params) = recv(&[
        "--frames",
        "8000",
        "--verify",
        "--counter-wrap",
        "4096",
        "--idle-timeout",
        "30",
    ]);
    let o = fpga_sim(
        &params,
        8000,
        256,
        "0,1",
        &[
            "--counter-wrap",
            "4096",
            "--faults",
            "skip=0.002",
            "--restart-after",
            "5000",
        ],
    );
    let sim: Value = serde_json::from_slice(&o.stdout).unwrap();
    let skipped = sim["skipped_numbers"].as_u64().unwrap();
    assert!(skipped > 0, "{sim}");
    assert!(
        text(&o.stderr).contains(&format!("skipped {skipped} frame number(s)")),
        "{}",
        text(&o.stderr)
    );
    let (sum, code, err) = finish(child, out);
    assert_eq!((code, &sum["verify_errors"]), (0, &json!(0)), "{sum} {err}");
    assert_eq!(
        (
            &sum["counter_gaps"],
            &sum["counter_gap_frames"],
            &sum["counter_resets"]
        ),
        (&json!(skipped), &json!(skipped), &sim["restarts"]),
        "{sum} {sim}"
    );
    assert_eq!(sim["restarts"], 1, "{sim}");
    assert_eq!(
        err.matches("FPGA frame counter gap: frame ").count() as u64,
        skipped,
        "{err}"
    );
    assert!(
        err.contains("FPGA frame counter reset: frame 5001 carries counter 0"),
        "{err}"
    );
}

/// issue 36: `fpga-sim --faults sticky-half` (every packet twice after the
/// first RNR NAK) against a consumer that pauses once gets the
/// duplicating-peer verdict; the pause (1 s, every slot held) is an RNR
/// storm. Without the latch: the storm, no duplicating peer.
#[test]
fn a_sticky_half_fpga_is_named_a_duplicating_peer_and_a_long_pause_an_rnr_storm() {
    for sticky in [true, false] {
        let (child, out, params) = recv(&[
            "--pause-once",
            "500:1000",
            "--frames",
            "4000",
            "--verify",
            "--idle-timeout",
            "30",
        ]);
        let faults = if sticky { "sticky-half" } else { "none" };
        let o = fpga_sim(&params, 4000, 1024, "0", &["--faults", faults]);
        let sim: Value = serde_json::from_slice(&o.stdout).unwrap();
        let (sum, code, err) = finish(child, out);
        assert_eq!((code, &sum["verify_errors"]), (0, &json!(0)), "{sum} {err}");
        assert!(sim["rnr_naks"].as_u64().unwrap() > 0, "{sim}");
        assert_eq!(sum["rnr_storms"], 1, "{sum} {err}");
        assert!(err.contains("RNR storm on 'soft'"), "{err}");
        assert!(err.contains("loans outstanding"), "{err}");
        assert_eq!(sum["duplicating_peer"], sticky, "{sum} {err}");
        assert_eq!(sum["duplicating_peers"], sticky as u64, "{sum} {err}");
        assert_eq!(
            err.contains("duplicating peer on 'soft'") && err.contains("toggle the FPGA's TxEn"),
            sticky,
            "{err}"
        );
        if sticky {
            let (dups, sent_twice) = (
                sum["duplicates"].as_u64().unwrap(),
                sim["sent_twice"].as_u64().unwrap(),
            );
            assert!(dups > 2000 && dups <= sent_twice, "{sum} {sim}");
        }
    }
}
