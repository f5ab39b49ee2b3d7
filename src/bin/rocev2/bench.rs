//! `rocev2 bench`: benchmarks, each against a reference measured in the
//! same run.

use std::time::Duration;

use clap::Args;
use rocev2::bench::*;
use rocev2::wire::{Opcode, Packet};

use crate::args::{self, num};
use crate::out::lib_err;
use crate::{Exit, Fail, Outcome, AFTER_HELP};

/// Benchmarks, each against a reference measured in the same run
///
/// Soft end-to-end vs the raw loopback UDP ceiling (1024/4096/8192 B),
/// server-core dispatch cost, ICRC vs raw CRC-32.
#[derive(Args, Debug)]
#[command(after_help = AFTER_HELP, allow_negative_numbers = true)]
pub struct BenchArgs {
    /// Frames per end-to-end run
    #[arg(long, value_name = "N", default_value = "200000", value_parser = num::<u64>(1, u64::MAX))]
    frames: u64,
    /// Length of each UDP ceiling run
    #[arg(long, value_name = "S", default_value = "1", value_parser = args::seconds)]
    seconds: f64,
}

pub fn run(a: BenchArgs) -> Outcome {
    let frames = a.frames;
    let secs = Duration::from_secs_f64(a.seconds);
    let e = lib_err(&[]);
    println!(
        "rocev2 bench ({} CPUs; every ratio is against a reference measured in this run)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    println!(
        "{:<44} {:>26} {:>34} {:>7} {:>7}",
        "figure", "value", "reference", "ratio", "goal"
    );
    // Received ICRCs: unchecked rows (UDP socket), plus one row verifying
    // every received ICRC by raw capture where this process may (CAP_NET_RAW).
    let raw_ok = rocev2::soft::raw_capture_allowed();
    let mut rows = vec![
        (1024usize, rocev2::IcrcCheck::Off),
        (4096, rocev2::IcrcCheck::Off),
        (8192, rocev2::IcrcCheck::Off),
    ];
    if raw_ok {
        rows.push((4096, rocev2::IcrcCheck::Require));
    }
    for (size, icrc) in rows {
        e2e_row(size, icrc, frames, secs)?;
    }
    if !raw_ok {
        println!("(no CAP_NET_RAW: the row with received ICRCs checked by raw capture is skipped)");
    }
    let ns = dispatch_ns_per_frame(frames.max(1_000_000), 256).map_err(&e)?;
    println!(
        "{:<44} {:>26} {:>34} {:>7.2} {:>7}",
        "server-core dispatch (in-memory completions)",
        format!("{ns:.1} ns/frame"),
        "goal 50 ns/frame",
        ns / 50.0,
        "<=1.0"
    );
    let (icrc, raw) = icrc_vs_raw_crc(4096, 200_000);
    println!(
        "{:<44} {:>26} {:>34} {:>7.2} {:>7}",
        "ICRC over 4 KiB SEND packets",
        format!("{icrc:.2} GB/s"),
        format!("crc32fast raw: {raw:.2} GB/s"),
        icrc / raw,
        ">=0.93"
    );
    Ok(Exit::Ok)
}

/// One end-to-end row: three (run, UDP reference) pairs, the median ratio.
fn e2e_row(size: usize, icrc: rocev2::IcrcCheck, frames: u64, secs: Duration) -> Result<(), Fail> {
    let e = lib_err(&[]);
    // Three alternating pairs (run, reference); the median ratio is shown
    // with the pair it came from, so one noisy moment does not decide.
    let pkts = size.div_ceil(4096) as f64;
    let dg = Packet::wire_len(Opcode::SendOnlyImm, size.min(4096));
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let r = soft_end_to_end(size, frames, rocev2::Mtu::Mtu4096, 256, icrc).map_err(&e)?;
        let c = udp_ceiling(dg, secs).map_err(&e)?;
        pairs.push((r.per_sec * pkts / c.per_sec, r, c));
    }
    pairs.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (ratio, r, c) = pairs[1];
    let rx = if icrc == rocev2::IcrcCheck::Off {
        ""
    } else {
        ", rx ICRC checked"
    };
    println!(
        "{:<44} {:>26} {:>34} {:>7.2} {:>7}",
        format!("soft e2e, {size} B frames{rx}"),
        format!("{:.2} Gbit/s {:.0} f/s", r.gbit, r.per_sec),
        format!("UDP {dg} B: {:.2} Gbit/s {:.0} dg/s", c.gbit, c.per_sec),
        ratio,
        ">=0.8"
    );
    println!(
        "{:<44} {:>26}",
        "",
        format!(
            "(3 runs: {})",
            pairs
                .iter()
                .map(|p| format!("{:.2}", p.0))
                .collect::<Vec<_>>()
                .join(" ")
        )
    );
    Ok(())
}
