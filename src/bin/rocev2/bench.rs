//! `rocev2 bench`: benchmarks, each against a reference measured in the
//! same run, each figure the min / median / max of three runs.

use std::time::Duration;

use clap::{Args, ValueEnum};
use rocev2::bench::*;
use rocev2::wire::{Opcode, Packet};

use crate::args::{self, num};
use crate::out::lib_err;
use crate::{Exit, Fail, Outcome};

/// Benchmarks, each against a reference measured in the same run
///
/// First the regime an FPGA puts the host in: surf's engine (a window of 4
/// or 16 messages, one packet per datagram, the ACK busy-polled for) at 1/4/8
/// KiB against plain UDP with the same window, and 1, 2, 4, 8 links of
/// window 16 on one host address and port against one link and against
/// ports of their own. Then the host's capacity: the loopback UDP ceilings
/// (plain recvmmsg, GSO into GRO), soft end-to-end at 1/4/8 KiB with a
/// 256-message window and GSO bursts (a NIC's GRO modelled) against the
/// recvmmsg ceiling (and with every received ICRC checked against the
/// unchecked run), ACKs per frame at surf's window, the server thread paced
/// at 10 and 25 GbE rates, server-core dispatch, ICRC vs raw CRC-32. Three
/// runs each: min / median / max.
#[derive(Args, Debug)]
#[command(after_help = crate::after_help(), allow_negative_numbers = true)]
pub struct BenchArgs {
    /// Frames per end-to-end run
    #[arg(long, value_name = "N", default_value = "200000", value_parser = num::<u64>(1, u64::MAX))]
    frames: u64,
    /// Length of each UDP ceiling run and of each paced run
    #[arg(long, value_name = "S", default_value = "1", value_parser = args::seconds)]
    seconds: f64,
    /// Messages the emulator keeps un-ACKed in the end-to-end and paced
    /// rows: as many as the host has slots (256), so the rows measure the
    /// host, not a sender waiting for ACKs (surf fc56630's engine keeps 4:
    /// the surf, links and ACK rows use surf's windows whatever this says)
    #[arg(long, value_name = "MESSAGES", default_value = "256", value_parser = num::<usize>(1, 1024))]
    window: usize,
    /// Which rows (default: all)
    #[arg(long, value_name = "ROWS", value_delimiter = ',')]
    rows: Vec<Row>,
}

/// The bench's row groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Row {
    /// surf's engine: windows of 4 and 16 messages, 1/4/8 KiB, one packet per datagram, the ACK busy-polled for, vs plain UDP with the same window
    Surf,
    /// N = 1, 2, 4, 8 links on one host (surf window 16, 4 KiB): all servers on one address and port vs N = 1, vs ports of their own, slowest link vs the mean
    Links,
    /// UDP ceilings: plain recvmmsg and GSO into GRO
    Ceilings,
    /// soft end-to-end at 1/4/8 KiB vs the recvmmsg ceiling
    E2e,
    /// soft end-to-end with every received ICRC checked vs unchecked (CAP_NET_RAW)
    IcrcE2e,
    /// ACKs per frame with the emulator at surf's window of 4
    Acks,
    /// the server thread paced at 290k and 750k frames/s of 4 KiB
    Paced,
    /// server-core dispatch cost
    Dispatch,
    /// ICRC vs raw CRC-32
    Icrc,
}

const RUNS: usize = 3;

/// The runs' ratios (first field) min / median / max, and the run with the
/// median ratio.
fn median_run<A, B>(runs: &[(f64, A, B)]) -> ((f64, f64, f64), &(f64, A, B)) {
    let ratio = mmm(runs.iter().map(|p| p.0).collect());
    let mid = runs
        .iter()
        .find(|p| p.0 == ratio.1)
        .expect("the median run");
    (ratio, mid)
}

/// Three figures' min / median / max.
fn mmm(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[0], v[v.len() / 2], v[v.len() - 1])
}

fn row(
    figure: &str,
    value: &str,
    reference: &str,
    r: (f64, f64, f64),
    goal: &str,
) -> Result<(), Fail> {
    outln!(
        "{figure:<42} {value:>28} {reference:>30} {:>16} {goal:>9}",
        format!("{:.2}/{:.2}/{:.2}", r.0, r.1, r.2)
    )
}

fn note(text: &str) -> Result<(), Fail> {
    outln!("{:<42} {text}", "")
}

pub fn run(a: BenchArgs) -> Outcome {
    let rows = if a.rows.is_empty() {
        Row::value_variants().to_vec()
    } else {
        a.rows.clone()
    };
    let secs = Duration::from_secs_f64(a.seconds);
    outln!(
        "rocev2 bench ({} CPUs, load {}; {RUNS} runs each: min/median/max; every ratio is \
         against a reference measured in this run)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| "?".into())
    )?;
    outln!(
        "{:<42} {:>28} {:>30} {:>16} {:>9}",
        "figure",
        "value (median)",
        "reference (median)",
        "ratio",
        "goal"
    )?;
    let mut regime = String::new();
    for r in rows {
        if regime_of(r, a.window) != regime {
            regime = regime_of(r, a.window);
            outln!("-- {regime}")?;
        }
        match r {
            Row::Surf => surf_rows(a.frames, secs)?,
            Row::Links => links_row(a.frames)?,
            Row::Ceilings => ceilings(secs)?,
            Row::E2e => e2e_rows(a.frames, secs, a.window)?,
            Row::IcrcE2e => icrc_e2e_rows(a.frames, a.window)?,
            Row::Acks => acks_row(a.frames)?,
            Row::Paced => paced_rows(a.seconds, a.window)?,
            Row::Dispatch => dispatch_row(a.frames)?,
            Row::Icrc => icrc_row()?,
        }
    }
    Ok(Exit::Ok)
}

/// The regime a row group measures, printed above it.
fn regime_of(r: Row, window: usize) -> String {
    match r {
        Row::Surf => "surf's engine as it runs: a window of 4 or 16 messages, one packet per \
                      datagram, the emulator busy-polling for each ACK; the host's ACK \
                      turnaround sets the rate"
            .into(),
        Row::Links => "several surf links on one host: one address and port for all".into(),
        Row::Ceilings => "the kernel's UDP ceilings over loopback".into(),
        Row::E2e | Row::IcrcE2e => format!(
            "the host's capacity, a NIC's GRO modelled by GSO: a {window}-message window, \
             bursts as UDP GSO datagrams"
        ),
        Row::Acks => "ACK coalescing at surf's window of 4, bursts as UDP GSO datagrams".into(),
        Row::Paced => format!(
            "a paced link, a NIC's interrupt coalescing modelled by GSO bursts every 20 us \
             ({window}-message window)"
        ),
        Row::Dispatch | Row::Icrc => "the server core and the ICRC alone (no sockets)".into(),
    }
}

/// The datagram a frame of `size` travels in (one per pmtu of 4096).
fn datagram(size: usize) -> usize {
    Packet::wire_len(Opcode::SendOnlyImm, size.min(4096))
}

fn ceilings(secs: Duration) -> Result<(), Fail> {
    let e = lib_err(&[]);
    for size in [1024usize, 4096] {
        let dg = datagram(size);
        let (mut plain, mut gro) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            plain.push(udp_ceiling(dg, secs).map_err(&e)?);
            gro.push(gso_gro_ceiling(dg, secs).map_err(&e)?);
        }
        let ratio = mmm(plain
            .iter()
            .zip(&gro)
            .map(|(p, g)| g.per_sec / p.per_sec)
            .collect());
        let med = |v: &[Rate]| mmm(v.iter().map(|r| r.per_sec).collect()).1;
        row(
            &format!("UDP ceiling, GSO into GRO, {dg} B"),
            &format!("{:.0} dg/s", med(&gro)),
            &format!("recvmmsg: {:.0} dg/s", med(&plain)),
            ratio,
            "",
        )?;
    }
    Ok(())
}

fn e2e_rows(frames: u64, secs: Duration, window: usize) -> Result<(), Fail> {
    for (size, goal) in [(1024usize, 1.5), (4096, 1.8), (8192, 1.5)] {
        let dg = datagram(size);
        let s = E2eSetup {
            window,
            ..E2eSetup::new(size, frames)
        };
        let runs = trials(s, || udp_ceiling(dg, secs))?;
        let figure = format!("soft e2e, {size} B frames");
        let e2e = trials_row(
            &figure,
            &runs,
            &format!("recvmmsg {dg} B"),
            &format!(">={goal}"),
        )?;
        note(&server_line(&e2e))?;
    }
    Ok(())
}

/// [`RUNS`] pairs of an end-to-end run of `s` and its `reference`, back to
/// back, the order alternating (run then reference, reference then run,
/// ...: issue 39, the machine changes mode between pairs, and a pair's
/// ratio holds): (frames/s x packets per frame / the reference's
/// datagrams/s, the run, the reference) per pair.
fn trials(
    s: E2eSetup,
    reference: impl Fn() -> rocev2::Result<Rate>,
) -> Result<Vec<(f64, E2e, Rate)>, Fail> {
    let e = lib_err(&[]);
    let pkts = s.size.div_ceil(4096) as f64;
    (0..RUNS)
        .map(|k| {
            let (r, c) = if k % 2 == 0 {
                let r = soft_end_to_end(s).map_err(&e)?;
                (r, reference().map_err(&e)?)
            } else {
                let c = reference().map_err(&e)?;
                (soft_end_to_end(s).map_err(&e)?, c)
            };
            Ok((r.rate.per_sec * pkts / c.per_sec, r, c))
        })
        .collect()
}

/// The row of [`trials`] against a reference in datagrams/s (`reference`
/// names it); returns the runs' figures, for the notes below it.
fn trials_row(
    figure: &str,
    runs: &[(f64, E2e, Rate)],
    reference: &str,
    goal: &str,
) -> Result<Vec<E2e>, Fail> {
    let (ratio, mid) = median_run(runs);
    let against = format!("{reference}: {:.0} dg/s", mid.2.per_sec);
    row(figure, &rate_text(&mid.1.rate), &against, ratio, goal)?;
    Ok(runs.iter().map(|p| p.1).collect())
}

/// surf's (window, frame size) pairs, each with its goal against the
/// reference (issue 24; the 8 KiB row is a report).
const SURF: [(usize, usize, &str); 5] = [
    (4, 4096, ">=0.9"),
    (16, 4096, ">=0.9"),
    (4, 1024, ">=0.8"),
    (16, 1024, ">=0.8"),
    (4, 8192, ""),
];

fn surf_rows(frames: u64, secs: Duration) -> Result<(), Fail> {
    for (window, size, goal) in SURF {
        // pmtu 4096: an 8 KiB message is two packets, its window twice as
        // many datagrams.
        let pkts = size.div_ceil(4096);
        let (dg, in_flight) = (datagram(size), window * pkts);
        let s = E2eSetup::surf(size, frames, window);
        let runs = trials(s, || udp_window(dg, in_flight, secs, true))?;
        let figure = format!("surf window {window}, {size} B");
        let e2e = trials_row(
            &figure,
            &runs,
            &format!("UDP window {in_flight} x {dg} B"),
            goal,
        )?;
        note(&waits_line(&e2e))?;
        note(&server_line(&e2e))?;
        note(&latency_line(s, &runs, in_flight)?)?;
    }
    Ok(())
}

/// One more run of `s` with the server measuring its latency: the ACK
/// turnaround and the delivery latency beside the reference's round trip
/// (its window over its rate), and what measuring cost (that run's rate
/// against the unmeasured runs' median).
fn latency_line(s: E2eSetup, runs: &[(f64, E2e, Rate)], in_flight: usize) -> Result<String, Fail> {
    let measured = soft_end_to_end(E2eSetup {
        measure_latency: true,
        ..s
    })
    .map_err(lib_err(&[]))?;
    let (_, mid) = median_run(runs);
    let us = |ns: u64| ns as f64 / 1000.0;
    let (t, d) = (measured.ack_turnaround, measured.delivery);
    Ok(format!(
        "latency (one more run, measured): ACK turnaround p50/p99/p99.9 {:.1}/{:.1}/{:.1} us, \
         delivery {:.1}/{:.1}/{:.1} us; the reference's round trip {:.1} us ({in_flight} \
         datagrams / its rate); that run {:.0} f/s = {:.2} of the unmeasured median",
        us(t.p50_ns),
        us(t.p99_ns),
        us(t.p999_ns),
        us(d.p50_ns),
        us(d.p99_ns),
        us(d.p999_ns),
        in_flight as f64 / mid.2.per_sec * 1e6,
        measured.rate.per_sec,
        measured.rate.per_sec / mid.1.rate.per_sec
    ))
}

/// The links' counts: 1 (the reference) and more on one host.
const LINKS: [usize; 4] = [1, 2, 4, 8];

/// Pairs per row (issue 39: each a reference and a measurement, run one
/// after the other, the order alternating from pair to pair).
const PAIRS: usize = 3;

/// N surf links (window 16, 4 KiB) on one host, N = 1, 2, 4, 8: all
/// servers on one address and port against N = 1 (aggregate frames/s; the
/// cost per link), against the same N on ports of their own (the shared
/// port's own cost), and the slowest link against the mean. `frames` is
/// each run's total, split among its links. Each figure from pairs run
/// back to back, the order alternating (A B, B A, ...): the machine's mode
/// changes between pairs, not inside one.
fn links_row(frames: u64) -> Result<(), Fail> {
    let e = lib_err(&[]);
    let run = |n: usize, ports: Ports| {
        let s = E2eSetup::surf(4096, (frames / n as u64).max(1), 16);
        soft_links_on(s, n, ports).map_err(&e)
    };
    // pair k: (A, B) in the order k says.
    let pair =
        |k: usize, a: &dyn Fn() -> Result<Links, Fail>, b: &dyn Fn() -> Result<Links, Fail>| {
            if k % 2 == 0 {
                let x = a()?;
                Ok::<_, Fail>((x, b()?))
            } else {
                let y = b()?;
                Ok((a()?, y))
            }
        };
    for n in LINKS {
        // vs N = 1, shared port.
        let (mut vs_one, mut vs_sep) = (Vec::new(), Vec::new());
        for k in 0..PAIRS {
            if n > 1 {
                let (one, many) = pair(k, &|| run(1, Ports::Shared), &|| run(n, Ports::Shared))?;
                vs_one.push((many.rate.per_sec / one.rate.per_sec, many, one));
            }
            let (sep, shared) = pair(k, &|| run(n, Ports::Separate), &|| run(n, Ports::Shared))?;
            vs_sep.push((shared.rate.per_sec / sep.rate.per_sec, shared, sep));
        }
        links_rows(n, &vs_one, &vs_sep)?;
    }
    note(&format!(
        "{PAIRS} pairs each, the order alternating; frames/s the aggregate of all links until the \
         last frame; CPU the servers' receive threads' share of a core, per link; emulators \
         from 127.0.0.2.. on CPU 0, servers' threads on CPU 1; {frames} frames per run in all"
    ))?;
    Ok(())
}

/// A `--links` figure's receive-thread CPU, per link (% of a core).
fn links_cpu(l: &Links) -> f64 {
    l.each.iter().map(|e| e.cpu).sum::<f64>() / l.each.len() as f64 * 100.0
}

/// A `--links` run's slowest link over the mean link.
fn slowest_link(l: &Links) -> f64 {
    let r: Vec<f64> = l.each.iter().map(|e| e.rate.per_sec).collect();
    let mean = r.iter().sum::<f64>() / r.len() as f64;
    r.iter().copied().fold(f64::INFINITY, f64::min) / mean
}

/// The rows of `n` links: one shared port vs one link (n > 1), vs a port
/// per link, and the slowest link over the mean (n > 1).
fn links_rows(
    n: usize,
    vs_one: &[(f64, Links, Links)],
    vs_sep: &[(f64, Links, Links)],
) -> Result<(), Fail> {
    let figure = |what: &str| {
        format!(
            "{n} link{}, W16 4 KiB, {what}",
            if n > 1 { "s" } else { "" }
        )
    };
    if n > 1 {
        let (ratio, mid) = median_run(vs_one);
        row(
            &figure("one port vs N=1"),
            &format!(
                "{:.0} f/s, {:.0}% CPU/link",
                mid.1.rate.per_sec,
                links_cpu(&mid.1)
            ),
            &format!(
                "N=1: {:.0} f/s, {:.0}% CPU",
                mid.2.rate.per_sec,
                links_cpu(&mid.2)
            ),
            ratio,
            if n == 8 { ">=0.9" } else { "" },
        )?;
    }
    let (ratio, mid) = median_run(vs_sep);
    row(
        &figure("one port vs own ports"),
        &format!(
            "{:.0} f/s, {:.0}% CPU/link",
            mid.1.rate.per_sec,
            links_cpu(&mid.1)
        ),
        &format!("own ports: {:.0} f/s", mid.2.rate.per_sec),
        ratio,
        ">=0.95",
    )?;
    if n > 1 {
        let shared: Vec<&Links> = vs_sep
            .iter()
            .map(|p| &p.1)
            .chain(vs_one.iter().map(|p| &p.1))
            .collect();
        let sm = mmm(shared.iter().map(|l| slowest_link(l)).collect());
        row(
            &figure("slowest link / mean"),
            &format!(
                "{:.0} f/s",
                mmm(shared
                    .iter()
                    .flat_map(|l| l.each.iter().map(|e| e.rate.per_sec))
                    .collect())
                .0
            ),
            "the mean link",
            sm,
            ">=0.5",
        )?;
    }
    Ok(())
}

/// A frame rate as the value column shows it.
fn rate_text(r: &Rate) -> String {
    format!("{:.2} Gbit/s {:.0} f/s", r.gbit, r.per_sec)
}

/// How the server's thread answered and waited over runs: ACKs, parks and
/// naps per frame.
fn waits_line(runs: &[E2e]) -> String {
    let of = |f: fn(&E2e) -> f64| {
        let m = mmm(runs.iter().map(f).collect());
        format!("{:.3}/{:.3}/{:.3}", m.0, m.1, m.2)
    };
    format!(
        "per frame (min/median/max): ACKs {}, parks {}, naps {}",
        of(|r| r.acks_per_frame),
        of(|r| r.parks_per_frame),
        of(|r| r.naps_per_frame)
    )
}

/// The server thread's figures over runs: busy ns per frame, ACKs and
/// copies per frame.
fn server_line(runs: &[E2e]) -> String {
    let busy = mmm(runs.iter().map(|r| r.busy_ns_per_frame).collect());
    let acks = mmm(runs.iter().map(|r| r.acks_per_frame).collect());
    let copied = mmm(runs.iter().map(|r| r.copied_per_frame).collect());
    let emu = mmm(runs.iter().map(|r| r.emulator_ns_per_frame).collect());
    let resent: u64 = runs.iter().map(|r| r.retransmits).sum();
    let naks: u64 = runs.iter().map(|r| r.naks).sum();
    let drops: u64 = runs.iter().map(|r| r.socket_drops).sum();
    format!(
        "CPU per frame: server thread {:.0}/{:.0}/{:.0} ns (spinning included), emulator {:.0} ns; \
         {:.3} ACKs, {:.3} copies per frame; in all runs {resent} resent, {naks} NAKs, {drops} socket drops",
        busy.0, busy.1, busy.2, emu.1, acks.1, copied.1
    )
}

fn icrc_e2e_rows(frames: u64, window: usize) -> Result<(), Fail> {
    let e = lib_err(&[]);
    if !rocev2::soft::raw_capture_allowed() {
        outln!(
            "(no CAP_NET_RAW: the rows with received ICRCs checked by raw capture are skipped)"
        )?;
        return Ok(());
    }
    for size in [1024usize, 4096, 8192] {
        let mut runs = Vec::new();
        for _ in 0..RUNS {
            let unchecked = E2eSetup {
                window,
                ..E2eSetup::new(size, frames)
            };
            let checked = E2eSetup {
                icrc: rocev2::IcrcCheck::Require,
                ..unchecked
            };
            let c = soft_end_to_end(checked).map_err(&e)?;
            let u = soft_end_to_end(unchecked).map_err(&e)?;
            runs.push((c.rate.per_sec / u.rate.per_sec, c, u));
        }
        let (ratio, mid) = median_run(&runs);
        row(
            &format!("soft e2e, {size} B frames, rx ICRC checked"),
            &rate_text(&mid.1.rate),
            &format!("unchecked: {:.0} f/s", mid.2.rate.per_sec),
            ratio,
            ">=0.9",
        )?;
        note(&server_line(&runs.iter().map(|p| p.1).collect::<Vec<_>>()))?;
    }
    Ok(())
}

fn acks_row(frames: u64) -> Result<(), Fail> {
    let e = lib_err(&[]);
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        let s = E2eSetup {
            window: 4,
            ..E2eSetup::new(4096, frames)
        };
        runs.push(soft_end_to_end(s).map_err(&e)?);
    }
    let acks = mmm(runs.iter().map(|r| r.acks_per_frame).collect());
    let stalls: u64 = runs.iter().map(|r| r.retransmits).sum();
    row(
        "ACKs per frame, 4096 B, surf's window (4)",
        &format!("{:.3} ACKs/frame", acks.1),
        "one per 4 messages: 0.25",
        (acks.0 / 0.25, acks.1 / 0.25, acks.2 / 0.25),
        "<=1.0",
    )?;
    note(&format!(
        "{stalls} emulator retransmits in {RUNS} runs (a stalled window would time out)"
    ))?;
    Ok(())
}

fn paced_rows(seconds: f64, window: usize) -> Result<(), Fail> {
    let e = lib_err(&[]);
    for (rate, gbe, goal) in [(290_000.0, 10, "<=35% CPU"), (750_000.0, 25, "<=700 ns")] {
        // The default spin budget, then none (block at once when idle).
        let mut by_spin = Vec::new();
        for spin_us in [None, Some(0)] {
            let mut runs = Vec::new();
            for _ in 0..RUNS {
                let s = E2eSetup {
                    rate: Some(rate),
                    window,
                    spin_us,
                    ..E2eSetup::new(4096, (rate * seconds) as u64)
                };
                runs.push(soft_end_to_end(s).map_err(&e)?);
            }
            by_spin.push(runs);
        }
        let runs = &by_spin[0];
        let busy = mmm(runs.iter().map(|r| r.busy_ns_per_frame).collect());
        let cpu = mmm(runs.iter().map(|r| r.cpu * 100.0).collect());
        let got = mmm(runs.iter().map(|r| r.rate.per_sec).collect());
        let ratio = if gbe == 10 {
            (cpu.0 / 35.0, cpu.1 / 35.0, cpu.2 / 35.0)
        } else {
            (busy.0 / 700.0, busy.1 / 700.0, busy.2 / 700.0)
        };
        row(
            &format!("server paced {:.0}k f/s ({gbe} GbE), 4096 B", rate / 1000.0),
            &format!("{:.0} ns/frame, {:.0}% CPU", busy.1, cpu.1),
            &format!("{:.0} f/s arrived", got.1),
            ratio,
            goal,
        )?;
        for (runs, what) in by_spin.iter().zip(["spin_us 50 (judged)", "spin_us 0"]) {
            let busy = mmm(runs.iter().map(|r| r.busy_ns_per_frame).collect());
            let cpu = mmm(runs.iter().map(|r| r.cpu * 100.0).collect());
            let frames_per = |x: f64| if x > 0.0 { 1.0 / x } else { 0.0 };
            let naps = mmm(runs.iter().map(|r| frames_per(r.naps_per_frame)).collect());
            let parks = mmm(runs.iter().map(|r| frames_per(r.parks_per_frame)).collect());
            note(&format!(
                "{what}: {:.0}/{:.0}/{:.0} ns/frame, CPU {:.0}/{:.0}/{:.0}%; \
                 {:.0} frames per nap, {:.0} per park; {}",
                busy.0,
                busy.1,
                busy.2,
                cpu.0,
                cpu.1,
                cpu.2,
                naps.1,
                parks.1,
                loss_line(runs, rate)
            ))?;
        }
    }
    Ok(())
}

/// How many runs were loss-free: no resend, NAK or socket drop, and the
/// rate reached (97%).
fn loss_line(runs: &[E2e], rate: f64) -> String {
    let ok = runs
        .iter()
        .filter(|r| r.retransmits + r.naks + r.socket_drops == 0 && r.rate.per_sec >= rate * 0.97)
        .count();
    format!("loss-free and at rate in {ok} of {RUNS} runs")
}

fn dispatch_row(frames: u64) -> Result<(), Fail> {
    let e = lib_err(&[]);
    let mut ns = Vec::new();
    for _ in 0..RUNS {
        ns.push(dispatch_ns_per_frame(frames.max(1_000_000), 256).map_err(&e)?);
    }
    let r = mmm(ns);
    row(
        "server-core dispatch (in-memory completions)",
        &format!("{:.1} ns/frame", r.1),
        "goal 25 ns/frame",
        (r.0 / 25.0, r.1 / 25.0, r.2 / 25.0),
        "<=1.0",
    )?;
    Ok(())
}

fn icrc_row() -> Result<(), Fail> {
    let mut runs = Vec::new();
    for _ in 0..RUNS {
        runs.push(icrc_vs_raw_crc(4096, 200_000));
    }
    let r = mmm(runs.iter().map(|(i, c)| i / c).collect());
    let med = |f: fn(&(f64, f64)) -> f64| mmm(runs.iter().map(f).collect()).1;
    row(
        "ICRC over 4 KiB SEND packets",
        &format!("{:.2} GB/s", med(|p| p.0)),
        &format!("crc32fast raw: {:.2} GB/s", med(|p| p.1)),
        r,
        ">=0.93",
    )
}
