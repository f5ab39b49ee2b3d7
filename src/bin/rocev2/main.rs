//! `rocev2` command-line tool: a soft-backend demo, a receive server, the
//! FPGA emulator, a verbs requester, benchmarks and a device report.
//!
//! Every value is parsed and range-checked by clap before anything is
//! created; errors name the flag. Exit codes: see [`Exit`].

#[macro_use]
mod out;

mod args;
mod bench;
mod demo;
mod info;
mod record;
mod recv;
mod signals;
mod sim;
mod tally;

use std::io::Write;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

/// The process exit code. What each means is written once, in
/// [`Exit::TABLE`], which `--help` shows (see [`after_help`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Runtime = 1,
    Usage = 2,
    NoFrames = 3,
    Verify = 4,
    Timeout = 5,
    Refused = 6,
    HungUp = 129,
    Interrupted = 130,
    Terminated = 143,
}

impl Exit {
    /// Every exit code and what it means, as `--help` shows them.
    pub const TABLE: [(Exit, &'static str); 10] = [
        (Exit::Ok, "success"),
        (
            Exit::Runtime,
            "runtime error (device, server, socket, file, or stdout cannot be written; recv: \
             --out failing mid-run, e.g. a FIFO whose reader exited, stops it with a message \
             and the summary)",
        ),
        (
            Exit::Usage,
            "usage error (unknown option, bad or out-of-range value)",
        ),
        (
            Exit::NoFrames,
            "recv: no frame arrived before --idle-timeout",
        ),
        (
            Exit::Verify,
            "verification failed (a frame's bytes, order or channel)",
        ),
        (
            Exit::Timeout,
            "timeout: fewer frames than --frames arrived, or the emulator ran out of retries",
        ),
        (
            Exit::Refused,
            "recv: the server refused the FPGA's requests (invalid-request NAKs, fatal to its \
             QP): a frame larger than --max-payload, or a bad opcode or length; the log says \
             which",
        ),
        (
            Exit::HungUp,
            "recv, demo: stopped by SIGHUP (the terminal closed, an ssh session dropped), \
             cleanly, as for SIGINT",
        ),
        (
            Exit::Interrupted,
            "recv, demo: stopped by SIGINT (Ctrl-C), cleanly: the recording whole, the summary \
             printed",
        ),
        (
            Exit::Terminated,
            "recv, demo: the same for SIGTERM (a second SIGINT, SIGTERM or SIGHUP ends the \
             process at once)",
        ),
    ];
}

/// Shown under every command's help: options' common rules and
/// [`Exit::TABLE`].
pub fn after_help() -> String {
    let mut text = String::from(
        "Numbers accept 0x hex. Logging: RUST_LOG=info (or debug, trace).\n\
         `rocev2 help COMMAND` or `rocev2 COMMAND --help` shows a command's options and \
         defaults.\n\nExit codes:\n",
    );
    for (code, meaning) in Exit::TABLE {
        text.push_str(&format!("  {:<4} {meaning}\n", code as u8));
    }
    text.push_str(
        "  SIGPIPE ends the process quietly when stdout is a pipe closed early \
         (`rocev2 info | head -1`)",
    );
    text
}

/// A failed command: the message (naming the flag) and the exit code.
#[derive(Debug)]
pub struct Fail {
    pub code: Exit,
    pub msg: String,
}

impl Fail {
    pub fn usage(msg: impl Into<String>) -> Fail {
        Fail {
            code: Exit::Usage,
            msg: msg.into(),
        }
    }
    pub fn runtime(msg: impl Into<String>) -> Fail {
        Fail {
            code: Exit::Runtime,
            msg: msg.into(),
        }
    }
}

pub type Outcome = Result<Exit, Fail>;

#[derive(Parser)]
#[command(
    name = "rocev2",
    about = "RoCEv2 RC receive server for FPGA data streams: soft backend, verbs backend, FPGA emulator",
    after_help = after_help(),
    arg_required_else_help = true,
    max_term_width = 100
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Demo(demo::DemoArgs),
    Recv(recv::RecvArgs),
    FpgaSim(sim::FpgaSimArgs),
    #[cfg(feature = "verbs")]
    VerbsFpga(sim::VerbsFpgaArgs),
    Bench(bench::BenchArgs),
    /// Backends, RDMA devices, ports and GID tables.
    #[command(after_help = after_help())]
    Info,
    /// Library and C ABI versions.
    #[command(after_help = after_help())]
    Version,
}

fn version_line() -> String {
    format!("{} (C ABI {})", rocev2::VERSION, rocev2::ABI_VERSION)
}

fn command() -> clap::Command {
    // clap wants a &'static str for the version; built once per process.
    let version: &'static str = Box::leak(version_line().into_boxed_str());
    Cli::command().version(version)
}

/// Ends the process as clap's `Error::exit` does (help and version on
/// stdout with exit 0, usage errors on stderr with exit 2), except that help
/// or version that stdout cannot take is a runtime error, as for any command.
fn clap_exit(e: clap::Error) -> ! {
    let printed = e.print().and_then(|()| std::io::stdout().lock().flush());
    let code = match printed {
        Err(io) if !e.use_stderr() => {
            errln!("rocev2: error: {}", out::stdout_failed(io).msg);
            Exit::Runtime as i32
        }
        _ => e.exit_code(),
    };
    std::process::exit(code)
}

fn main() -> ExitCode {
    signals::default_sigpipe();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let matches = command().try_get_matches().unwrap_or_else(|e| clap_exit(e));
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let (name, res) = match cli.cmd {
        Cmd::Demo(a) => ("demo", demo::run(a)),
        Cmd::Recv(a) => ("recv", recv::run(a)),
        Cmd::FpgaSim(a) => ("fpga-sim", sim::fpga_sim(a)),
        #[cfg(feature = "verbs")]
        Cmd::VerbsFpga(a) => ("verbs-fpga", sim::verbs_fpga(a)),
        Cmd::Bench(a) => ("bench", bench::run(a)),
        Cmd::Info => ("info", info::run()),
        Cmd::Version => (
            "version",
            outln!("rocev2 {}", version_line()).map(|()| Exit::Ok),
        ),
    };
    match res {
        Ok(code) => ExitCode::from(code as u8),
        Err(f) => {
            errln!("rocev2 {name}: error: {}", f.msg);
            if f.code == Exit::Usage {
                errln!("\nFor more information, try 'rocev2 help {name}'.");
            }
            ExitCode::from(f.code as u8)
        }
    }
}
