//! Output and error plumbing: JSON lines, progress on a terminal, library
//! errors mapped back to the flags that set the value, early bind checks.

use std::io::{IsTerminal, Write};
use std::net::{SocketAddrV4, UdpSocket};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rocev2::emulator::FpgaEmulator;
use rocev2::ErrorKind;

use crate::args::Shape;
use crate::{Exit, Fail};

/// serde_json formatting with a space after `:` and `,` (`{"qpn": 1, ...}`),
/// the layout scripts grep for (tests/vm/bench-verbs.sh).
struct Spaced;

impl serde_json::ser::Formatter for Spaced {
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        sep(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        sep(w, first)
    }
}

/// ", " before every key or value but the first.
fn sep<W: ?Sized + Write>(w: &mut W, first: bool) -> std::io::Result<()> {
    if first {
        Ok(())
    } else {
        w.write_all(b", ")
    }
}

/// One JSON line (no trailing newline).
pub fn json_line(v: &serde_json::Value) -> String {
    let mut buf = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, Spaced);
    serde::Serialize::serialize(v, &mut ser).expect("a Value always serializes");
    String::from_utf8(buf).expect("serde_json writes UTF-8")
}

/// One line on stdout, flushed (a reader may be waiting): `outln!(...)?`
/// where `println!` would panic (exit 101) on a write that fails.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::write_line(format_args!($($arg)*))
    };
}

/// One line on stderr, best effort: `errln!(...)` where `eprintln!` would
/// panic. A message stderr cannot take is dropped; the run ends as it would.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::out::note(format_args!($($arg)*))
    };
}

/// Writes `line` and a newline on stdout and flushes it. A failed write (a
/// full disk, /dev/full) is a runtime error naming stdout.
pub fn write_line(line: std::fmt::Arguments) -> Result<(), Fail> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")
        .and_then(|()| out.flush())
        .map_err(stdout_failed)
}

/// The [`Fail`] of a write to stdout that failed.
pub fn stdout_failed(e: std::io::Error) -> Fail {
    Fail::runtime(format!("writing stdout failed: {e}"))
}

/// Writes `line` and a newline on stderr, ignoring a failure (see `errln!`).
pub fn note(line: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Prints one JSON line on stdout and flushes it (a reader may be waiting).
pub fn print_json(v: serde_json::Value) -> Result<(), Fail> {
    outln!("{}", json_line(&v))
}

/// `x` rounded to 3 decimals (rates in the JSON lines).
pub fn round3(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1000.0).round() / 1000.0
    } else {
        0.0
    }
}

/// Streams `frames` pattern frames of `shape` from the emulator (a queue of
/// 64, like the FPGA's ring) with a progress bar on a terminal;
/// `on_progress(bar, done)` may add a message. With `stop`, the stream goes
/// in parts of about 16 MiB, each ACKed before the next, and ends early
/// when `stop()` says so after one. Returns the frames streamed (and ACKed).
pub fn stream_with_progress(
    emu: &mut FpgaEmulator,
    frames: u64,
    shape: &Shape,
    stop: Option<&dyn Fn() -> bool>,
    mut on_progress: impl FnMut(&ProgressBar, u64),
) -> rocev2::Result<u64> {
    let part = match stop {
        Some(_) => (16u64 << 20).div_ceil(shape.size as u64),
        None => frames,
    };
    let bar = progress(Some(frames), "frames");
    let mut sent = 0;
    let mut res = Ok(());
    while sent < frames && res.is_ok() && !stop.is_some_and(|stop| stop()) {
        let n = part.min(frames - sent);
        res = emu.stream(
            n,
            shape.size as usize,
            &shape.channels.0,
            64,
            Duration::from_secs(3600),
            |done| {
                bar.set_position(sent + done);
                on_progress(&bar, sent + done);
            },
        );
        sent += n;
    }
    bar.finish_and_clear();
    res.map(|()| sent)
}

/// A progress bar on stderr when stderr is a terminal; hidden otherwise.
/// `total` None draws a spinner with the count.
pub fn progress(total: Option<u64>, what: &str) -> ProgressBar {
    let target = if std::io::stderr().is_terminal() {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let (bar, template) = match total {
        Some(n) => (
            ProgressBar::with_draw_target(Some(n), target),
            format!("[{{bar:30}}] {{percent:>3}}%  {{pos}}/{{len}} {what}  {{msg}}"),
        ),
        None => (
            ProgressBar::with_draw_target(None, target),
            format!("{{spinner}} {{pos}} {what}  {{msg}}"),
        ),
    };
    bar.set_style(
        ProgressStyle::with_template(&template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Library field names and the flag that sets each, for one command.
pub type FlagNames = &'static [(&'static str, &'static str)];

/// Flags of commands that create a server (`--max-payload` in recv).
pub const SERVER_FLAGS: FlagNames = &[
    ("maxPayload", "--max-payload"),
    ("rxQueueDepth", "--depth"),
    ("fpgaQpn", "--fpga-qpn"),
    ("fpgaRqPsn", "--fpga-psn"),
    ("minRnrTimer", "--rnr"),
    ("pmtu", "--pmtu"),
    ("gid_index", "--gid-index"),
    ("gidIndex", "--gid-index"),
    ("udp_port", "--port"),
    ("ib_port", "--ib-port"),
];

/// A library error as a [`Fail`]: library field names replaced by `flags`,
/// by kind: invalid arguments exit 2, timeouts 5 (the emulator's retries
/// running out among them), everything else 1.
pub fn lib_err(flags: FlagNames) -> impl Fn(rocev2::Error) -> Fail {
    move |e| {
        let mut msg = e.message().to_string();
        for (field, flag) in flags {
            msg = replace_word(&msg, field, flag);
        }
        let code = match e.kind() {
            ErrorKind::InvalidArgument => Exit::Usage,
            ErrorKind::Timeout => Exit::Timeout,
            _ => Exit::Runtime,
        };
        Fail { code, msg }
    }
}

/// `--device NAME` that could not be opened: the library's message (rogue's
/// text) and what the user likely meant: `soft` for a name a typo away from
/// it, else where the names are.
pub fn device_hint(name: &str) -> impl Fn(Fail) -> Fail + '_ {
    move |mut f| {
        let hint = if typo_distance(&name.to_ascii_lowercase(), "soft") <= 2 {
            "did you mean --device soft (the userspace backend)?".to_string()
        } else {
            "--device soft is the userspace backend (no RDMA NIC needed); `rocev2 info` lists \
             the RDMA devices"
                .to_string()
        };
        f.msg = format!("--device {name}: {}; {hint}", f.msg);
        f
    }
}

/// Levenshtein distance between `a` and `b` (short names).
fn typo_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// `text` with every whole-word `word` replaced by `by`.
fn replace_word(text: &str, word: &str, by: &str) -> String {
    let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        out.push_str(&rest[..at]);
        if before.is_none_or(|c| !is_word(c)) && after.is_none_or(|c| !is_word(c)) {
            out.push_str(by);
        } else {
            out.push_str(word);
        }
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

/// Checks that UDP `addr` can be bound before anything is created, with an
/// error naming `flags` (the options that set the address).
pub fn check_bind(addr: SocketAddrV4, flags: &str) -> Result<(), Fail> {
    UdpSocket::bind(addr).map(drop).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                "another process (a rocev2 server, rdma_rxe) holds it: pick another port \
                 (0 = any free port)"
            }
            std::io::ErrorKind::AddrNotAvailable => {
                "the address is not configured on this host (see `ip -4 addr`)"
            }
            std::io::ErrorKind::PermissionDenied => {
                "ports below 1024 need root or CAP_NET_BIND_SERVICE"
            }
            _ => "check the address and port",
        };
        Fail::runtime(format!("{flags}: cannot bind UDP {addr}: {e}; {hint}"))
    })
}

/// `addr` can be bound by a soft server now (shared with the servers that
/// may already serve other FPGAs on it); else a runtime failure naming
/// `flags`, who holds the port and what to do.
pub fn check_soft_bind(addr: SocketAddrV4, flags: &str) -> Result<(), Fail> {
    rocev2::soft::check_bind(addr).map_err(|e| Fail::runtime(format!("{flags}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_keep_the_spaced_layout() {
        let v =
            serde_json::json!({"qpn": 5, "gid": "::1", "list": [1, 2], "rate": round3(2.41234)});
        assert_eq!(
            json_line(&v),
            r#"{"qpn": 5, "gid": "::1", "list": [1, 2], "rate": 2.412}"#
        );
    }

    #[test]
    fn library_fields_become_flags() {
        let e = rocev2::Error::invalid("maxPayload must be in the range 1..9; got 0");
        let f = lib_err(SERVER_FLAGS)(e);
        assert_eq!(f.msg, "--max-payload must be in the range 1..9; got 0");
        assert_eq!(f.code, Exit::Usage);
        assert_eq!(
            replace_word("pmtu_x pmtu", "pmtu", "--pmtu"),
            "pmtu_x --pmtu"
        );
    }

    #[test]
    fn a_bound_port_is_reported_with_the_flag() {
        let held = UdpSocket::bind("127.0.0.1:0").unwrap();
        let SocketAddr::V4(a) = held.local_addr().unwrap() else {
            unreachable!()
        };
        let f = check_bind(a, "--bind/--port").unwrap_err();
        assert!(
            f.msg
                .starts_with("--bind/--port: cannot bind UDP 127.0.0.1:"),
            "{}",
            f.msg
        );
        assert!(f.msg.contains("pick another port"), "{}", f.msg);
    }
    use std::net::SocketAddr;
}
