//! `rocev2 recv`: a server (soft or verbs) that prints its host params as one
//! JSON line, receives frames (counting, verifying, recording them) and ends
//! with a JSON summary.

use std::io::BufRead;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use clap::Args;
use rocev2::{
    BackendStats, ConnectParams, Device, DeviceConfig, Frame, Gid, Server, ServerConfig,
    SoftConfig, Stats, VerbsConfig,
};
use serde_json::json;

use crate::args::{self, num, FpgaArg, IcrcArg, QpnArg, MAX_24BIT, MAX_DEPTH, MAX_PAYLOAD};
use crate::out::{self, lib_err, print_json, round3, SERVER_FLAGS};
use crate::record::RogueWriter;
use crate::signals;
use crate::tally::{Tally, Ticker};
use crate::{Exit, Fail, Outcome};

/// A server (soft or verbs): prints host params as JSON, counts / verifies / records frames
///
/// Prints the host params as one JSON line on stdout (qpn, rq_psn, sq_psn,
/// mr_addr, mr_len, mr_rkey, gid, udp_port), completes the connection, then
/// receives frames until --frames or --idle-timeout: counts them, checks the
/// emulator's pattern (--verify), records them (--out) and prints one JSON
/// summary line (frames, bytes, verify_errors, seconds, gbit_per_s,
/// frames_per_s, rnr_naks, seq_naks, invalid_naks, counter_gaps,
/// ...). The rate is
/// measured from the first to the last frame. SIGINT, SIGTERM or SIGHUP
/// stops it cleanly: the frames taken so far recorded whole, the summary
/// printed, exit 130, 143 or 129. A frame larger than --max-payload is
/// refused (an invalid-request NAK, fatal to the FPGA's QP): a warning
/// names both sizes, the summary counts it (invalid_naks), exit 6. An --out
/// that fails mid-run (a full disk, a FIFO whose reader exited) stops it:
/// a message, the summary (out_error), exit 1.
#[derive(Args, Debug)]
#[command(after_help = crate::after_help(), allow_negative_numbers = true)]
pub struct RecvArgs {
    /// RDMA device (`rocev2 info` lists them), or soft for the userspace backend
    #[arg(long, value_name = "soft|NAME", default_value = "soft")]
    device: String,
    /// soft: local IPv4 address to bind (the host GID)
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    bind: Ipv4Addr,
    /// soft: UDP port to bind (0 = any free port, reported as udp_port)
    #[arg(long, value_name = "N", default_value = "4791", value_parser = num::<u16>(0, 65535))]
    port: u16,
    /// soft: UDP port of the FPGA, where ACKs go (0 = reply to each packet's source port)
    #[arg(long, value_name = "N", default_value = "4791", value_parser = num::<u16>(0, 65535))]
    peer_port: u16,
    /// The FPGA's IPv4 address (or GID)
    #[arg(long, value_name = "IP", required_unless_present = "fpga", conflicts_with = "fpga", value_parser = args::gid)]
    fpga_ip: Option<Gid>,
    /// The FPGA's QP number, or - to read it from stdin after the host params are printed
    #[arg(
        long,
        value_name = "N|-",
        required_unless_present = "fpga",
        conflicts_with = "fpga"
    )]
    fpga_qpn: Option<QpnArg>,
    /// Several FPGAs, one server each (repeat it: --fpga 10.0.0.11:0x11 --fpga 10.0.0.12:0x12), all on --bind/--port (soft: the kernel hands each server its FPGA's packets; docs/operations.md, "Several FPGAs on one host"); a host params line per FPGA first (with "link" and "fpga"), then a summary line per FPGA (--frames and --verify apply to each; not with --out)
    #[arg(long, value_name = "IP:QPN", value_parser = args::fpga, conflicts_with = "out")]
    fpga: Vec<FpgaArg>,
    /// The first PSN the FPGA sends [default: the host SQ PSN, sq_psn]
    #[arg(long, value_name = "N", value_parser = num::<u32>(0, MAX_24BIT))]
    fpga_psn: Option<u32>,
    /// Path MTU code: 1=256 2=512 3=1024 4=2048 5=4096 bytes
    #[arg(long, value_name = "1..5", default_value = "5", value_parser = num::<u32>(1, 5))]
    pmtu: u32,
    /// Min RNR NAK timer code the host advertises (12 = 0.64 ms; IBA table 45)
    #[arg(long, value_name = "0..31", default_value = "12", value_parser = num::<u32>(0, 31))]
    rnr: u32,
    /// Receive slots
    #[arg(long, value_name = "SLOTS", default_value = "256", value_parser = num::<u32>(1, MAX_DEPTH))]
    depth: u32,
    /// Bytes per receive slot: the largest frame the FPGA may send
    #[arg(long, value_name = "BYTES", default_value = "9000", value_parser = num::<u32>(1, MAX_PAYLOAD))]
    max_payload: u32,
    /// Longest the receive thread busy-polls an idle link before it blocks, in microseconds (adaptive below it; on a paced link, where spinning brings no more frames, it naps instead: docs/concepts.md, "Waiting: spin, nap, park"). 0 never spins or naps: it blocks at once
    #[arg(long, value_name = "US", default_value = "50", value_parser = num::<u32>(0, 1_000_000))]
    spin_us: u32,
    /// Pin the receive thread to this CPU [default: not pinned]
    #[arg(long, value_name = "N", value_parser = num::<u32>(0, 1023))]
    cpu: Option<u32>,
    /// verbs: GID table index of the host's RoCE v2 IPv4 address
    #[arg(long, value_name = "N", default_value = "0", value_parser = num::<u8>(0, 255))]
    gid_index: u8,
    /// verbs: device port
    #[arg(long, value_name = "N", default_value = "1", value_parser = num::<u8>(1, 255))]
    ib_port: u8,
    /// soft: received ICRCs: auto checks them by raw capture when allowed (CAP_NET_RAW), else counts them unchecked; require fails without CAP_NET_RAW
    #[arg(long, value_name = "MODE", default_value = "auto")]
    icrc_check: IcrcArg,
    /// Stop after N frames [default: run until --idle-timeout]
    #[arg(long, value_name = "N", value_parser = num::<u64>(1, u64::MAX))]
    frames: Option<u64>,
    /// Stop when no frame arrives for this long
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = args::seconds)]
    idle_timeout: f64,
    /// Record the frames to FILE in rogue's data file format (pyrogue FileReader, rogue StreamReader)
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Check every frame against the emulator's pattern (bytes and order)
    #[arg(long)]
    verify: bool,
    /// Print a line on stderr every S seconds: frames, rate, seq NAKs, RNR NAKs, socket drops, peer restarts (verbs: frames lost to them, stale-peer verdicts, or "peer not watched"), the link's state and the time since its last packet
    #[arg(long, value_name = "S", value_parser = args::seconds)]
    stats_interval: Option<f64>,
    /// Measure the ACK turnaround and the frame delivery latency (soft; kernel receive stamps): p50/p99/p99.9 in the --stats-interval lines and the final JSON
    #[arg(long)]
    measure_latency: bool,
    /// soft: busy-poll the NIC's receive queue up to US microseconds on an empty socket (SO_BUSY_POLL; 0 = off; does nothing on loopback; docs/tuning.md, "What to tune")
    #[arg(long, value_name = "US", default_value = "0", value_parser = num::<u32>(0, 1_000_000))]
    busy_poll_us: u32,
    /// Check the FPGA's frame counter (immediate bits [31:8], +1 per frame, wrapping to 0 at N: its AddrWrapCount) on every frame: gaps (frames it numbered that never arrived) and resets (back to 0) are logged and counted in the summary (counter_gaps, counter_gap_frames, counter_resets). 0: not checked, for FPGAs that put other things there
    #[arg(long, value_name = "N", default_value = "0", value_parser = num::<u32>(0, 1 << 24))]
    counter_wrap: u32,
    /// A consumer that stalls once: after N frames, take none for MS milliseconds (the slots fill, the server RNR-NAKs: tests back-pressure and what follows it, e.g. `fpga-sim --faults sticky-half`)
    #[arg(long, value_name = "N:MS", value_parser = pause_once)]
    pause_once: Option<(u64, u64)>,
}

/// `--pause-once N:MS`.
fn pause_once(text: &str) -> Result<(u64, u64), String> {
    let parse = |t: &str| args::parse_u64(t).ok_or_else(|| format!("{t:?} is not a number"));
    let (n, ms) = text.split_once(':').ok_or_else(|| {
        format!("{text:?} is not N:MS (frames, then milliseconds), e.g. 1000:200")
    })?;
    let (n, ms) = (parse(n)?, parse(ms)?);
    if ms > 60_000 {
        return Err(format!("{ms} ms is out of range: at most 60000 ms"));
    }
    Ok((n, ms))
}

pub fn run(a: RecvArgs) -> Outcome {
    signals::catch_stop_signals()?;
    args::check_slab(a.max_payload, a.depth, "--max-payload")?;
    if let Some(cpu) = a.cpu {
        check_cpu(cpu)?;
    }
    if a.device == "soft" {
        out::check_soft_bind(SocketAddrV4::new(a.bind, a.port), "--bind/--port")?;
    }
    if !a.fpga.is_empty() {
        return run_links(&a);
    }
    let (Some(fpga_ip), Some(fpga_qpn)) = (a.fpga_ip, a.fpga_qpn) else {
        return Err(Fail::usage(
            "--fpga-ip and --fpga-qpn, or --fpga IP:QPN, name the FPGA",
        ));
    };
    let mut rec = open_out(a.out.as_deref())?;
    let e = lib_err(SERVER_FLAGS);
    let (_dev, server) = open_server(&a)?;
    // Before the params go out: the FPGA programmed with them may send at
    // once, and its packets wait for complete_connection from here on.
    server.set_fpga_gid(fpga_ip).map_err(&e)?;
    let hp = server.host_params();
    print_json(json!({
        "qpn": hp.qpn, "rq_psn": hp.rq_psn, "sq_psn": hp.sq_psn, "mr_addr": hp.mr_addr,
        "mr_len": hp.mr_len, "mr_rkey": hp.mr_rkey, "gid": hp.gid.to_string(), "udp_port": hp.udp_port,
    }))?;
    let fpga_qpn = match fpga_qpn {
        QpnArg::Qpn(q) => Some(q),
        QpnArg::Stdin => qpn_from_stdin()?,
    };
    let t = match fpga_qpn {
        Some(q) => {
            let psn = a.fpga_psn.unwrap_or(hp.sq_psn);
            let params = ConnectParams::new(q, psn, a.pmtu, a.rnr).map_err(&e)?;
            server.complete_connection(&params).map_err(&e)?;
            errln!(
                "rocev2 recv: connected to FPGA {} QP {q:#x}; waiting for frames",
                fpga_ip
                    .ipv4()
                    .map_or(fpga_ip.to_string(), |ip| ip.to_string())
            );
            receive(&server, &a, &mut rec, None)?
        }
        // A stop signal came before the QP number.
        None => Tally::default(),
    };
    if a.frames.is_some_and(|n| t.frames >= n) {
        linger(&server);
    }
    let s = server.stats();
    let cause = server.end_cause();
    server.stop();
    summary(&t, &s, cause, rec, None)?;
    if let Some(e) = t.out_error {
        return Err(Fail::runtime(e));
    }
    if let Some(stop) = signals::caught() {
        return Ok(stop.exit());
    }
    let refused = s.soft().invalid_naks_tx;
    if refused > 0 {
        errln!(
            "rocev2 recv: {refused} request(s) of the FPGA refused with an invalid-request NAK \
             (invalid_naks; fatal to its QP): a frame larger than --max-payload {} (the warning \
             above gives its size), or a bad opcode or length",
            a.max_payload
        );
    }
    Ok(exit_code(&t, refused, a.frames))
}

/// The `--out` file's writer, if asked for.
fn open_out(out: Option<&std::path::Path>) -> Result<Option<RogueWriter>, Fail> {
    let Some(p) = out else { return Ok(None) };
    let w = RogueWriter::create(p).map_err(|e| {
        Fail::runtime(format!(
            "--out {}: cannot create the file: {e}",
            p.display()
        ))
    })?;
    if !w.is_regular_file() {
        // A pipe or FIFO: its reader may exit before the stream ends; then
        // the write fails (EPIPE) and recv stops cleanly, not by SIGPIPE.
        signals::ignore_sigpipe();
    }
    Ok(Some(w))
}

/// `--fpga IP:QPN` repeated: a server per FPGA on --bind/--port, each
/// received by a thread of its own, each with its own summary line (with
/// "link" and "fpga"). Exits with the first link's code that is not 0.
fn run_links(a: &RecvArgs) -> Outcome {
    let e = lib_err(SERVER_FLAGS);
    let mut links = Vec::new();
    for (i, f) in a.fpga.iter().enumerate() {
        let (dev, server) = open_server(a)?;
        server.set_fpga_gid(f.gid).map_err(&e)?;
        let hp = server.host_params();
        let ip = f.gid.ipv4().map_or(f.gid.to_string(), |ip| ip.to_string());
        print_json(json!({
            "link": i, "fpga": ip,
            "qpn": hp.qpn, "rq_psn": hp.rq_psn, "sq_psn": hp.sq_psn, "mr_addr": hp.mr_addr,
            "mr_len": hp.mr_len, "mr_rkey": hp.mr_rkey, "gid": hp.gid.to_string(), "udp_port": hp.udp_port,
        }))?;
        links.push((dev, server, *f, ip));
    }
    for (_, server, f, ip) in &links {
        let hp = server.host_params();
        let psn = a.fpga_psn.unwrap_or(hp.sq_psn);
        let params = ConnectParams::new(f.qpn, psn, a.pmtu, a.rnr).map_err(&e)?;
        server.complete_connection(&params).map_err(&e)?;
        errln!("rocev2 recv: connected to FPGA {ip} QP {:#x}", f.qpn);
    }
    errln!("rocev2 recv: {} FPGAs; waiting for frames", links.len());
    let tallies: Vec<Result<Tally, Fail>> = std::thread::scope(|s| {
        let handles: Vec<_> = links
            .iter()
            .enumerate()
            .map(|(i, (_, server, _, _))| s.spawn(move || receive(server, a, &mut None, Some(i))))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Fail::runtime("a link's receive loop panicked")))
            })
            .collect()
    });
    let mut code = Exit::Ok;
    for (i, ((_, server, _, ip), t)) in links.iter().zip(tallies).enumerate() {
        let t = t?;
        if a.frames.is_some_and(|n| t.frames >= n) {
            linger(server);
        }
        let s = server.stats();
        let cause = server.end_cause();
        server.stop();
        summary(&t, &s, cause, None, Some(json!({"link": i, "fpga": ip})))?;
        let c = exit_code(&t, s.soft().invalid_naks_tx, a.frames);
        if matches!(code, Exit::Ok) {
            code = c;
        }
    }
    if let Some(stop) = signals::caught() {
        return Ok(stop.exit());
    }
    Ok(code)
}

/// The device and the server `recv` asks for (the device kept open beside
/// its server).
fn open_server(a: &RecvArgs) -> Result<(Device, Server), Fail> {
    let e = lib_err(SERVER_FLAGS);
    let dc: DeviceConfig = match a.device.as_str() {
        "soft" => SoftConfig {
            bind_addr: a.bind.to_string(),
            udp_port: a.port,
            peer_udp_port: a.peer_port,
            icrc_check: a.icrc_check.into(),
            busy_poll_us: a.busy_poll_us,
        }
        .into(),
        name => VerbsConfig {
            gid_index: a.gid_index,
            ib_port: a.ib_port,
            ..VerbsConfig::new(name)
        }
        .into(),
    };
    let dev = Device::open(&dc)
        .map_err(&e)
        .map_err(out::device_hint(&a.device))?;
    let cfg = ServerConfig {
        max_payload: a.max_payload,
        rx_queue_depth: a.depth,
        spin_us: a.spin_us,
        cpu_affinity: a.cpu,
        measure_latency: a.measure_latency,
        counter_wrap: a.counter_wrap,
        ..Default::default()
    };
    let server = Server::create(&dev, &cfg).map_err(&e)?;
    Ok((dev, server))
}

/// How a finished recv exits: a bad frame, requests refused (`refused`
/// invalid-request NAKs: the FPGA's QP is dead), no frame, fewer than
/// `--frames` (`want`), or all well.
fn exit_code(t: &Tally, refused: u64, want: Option<u64>) -> Exit {
    if t.bad > 0 {
        Exit::Verify
    } else if refused > 0 {
        Exit::Refused
    } else if t.frames == 0 {
        Exit::NoFrames
    } else if want.is_some_and(|n| t.frames < n) {
        Exit::Timeout
    } else {
        Exit::Ok
    }
}

/// `--fpga-qpn -`: one line from stdin; `None` when a stop signal comes
/// first. (The line is read by a thread of its own, as a read of stdin does
/// not end for a signal; the process ends without waiting for it.)
fn qpn_from_stdin() -> Result<Option<u32>, Fail> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let n = std::io::stdin().lock().read_line(&mut line);
        let _ = tx.send(n.map(|n| (n, line)));
    });
    let (n, line) = loop {
        match rx.recv_timeout(signals::CHECK_EVERY) {
            Ok(read) => {
                break read.map_err(|e| {
                    Fail::runtime(format!("--fpga-qpn -: reading stdin failed: {e}"))
                })?
            }
            Err(_) if signals::caught().is_some() => return Ok(None),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Fail::runtime("--fpga-qpn -: the stdin reader ended"))
            }
        }
    };
    if n == 0 {
        return Err(Fail::usage(
            "--fpga-qpn -: stdin ended before a QP number arrived",
        ));
    }
    args::qpn24(&line)
        .map(Some)
        .map_err(|why| Fail::usage(format!("--fpga-qpn - (read from stdin): {why}")))
}

/// After the last frame, keeps answering until the link has been quiet for
/// a moment: the FPGA may still wait for the ACK of its last messages (one
/// the network lost is sent again when it resends them); a host gone at
/// once would leave it retrying until it gives up.
fn linger(server: &Server) {
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end && signals::caught().is_none() {
        if server
            .stats()
            .since_last_packet
            .is_some_and(|d| d >= Duration::from_millis(200))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Receives on `server` until --frames, --idle-timeout or a stop signal;
/// `link` (with several --fpga): no progress bar, and the lines it prints
/// say which link.
fn receive(
    server: &Server,
    a: &RecvArgs,
    rec: &mut Option<RogueWriter>,
    link: Option<usize>,
) -> Result<Tally, Fail> {
    let idle = Duration::from_secs_f64(a.idle_timeout);
    let want = a.frames.unwrap_or(u64::MAX);
    let bar = match link {
        None => out::progress(a.frames, "frames"),
        Some(_) => indicatif::ProgressBar::hidden(),
    };
    let who = link.map_or(String::new(), |i| format!(" link {i}"));
    let mut ticker = a.stats_interval.map(Ticker::new);
    let mut t = Tally::default();
    // Counts and records a frame. Once --out has failed, frames are counted
    // only, and the loop stops; run() says why after the summary.
    let mut take = |t: &mut Tally, f: Frame| {
        t.add(&f, a.verify);
        bar.inc(1);
        if t.out_error.is_none() {
            if let Some(Err(e)) = rec.as_mut().map(|w| w.write(f.channel(), f.data())) {
                t.out_error = Some(e);
            }
        }
        drop(f);
        if let Some((n, ms)) = a.pause_once.filter(|(n, _)| t.frames == *n) {
            bar.suspend(|| errln!("rocev2 recv: --pause-once: pausing {ms} ms after frame {n}"));
            std::thread::sleep(Duration::from_millis(ms));
        }
    };
    let mut active = Instant::now();
    while t.frames < want {
        let stop = signals::caught();
        if stop.is_some() || t.out_error.is_some() {
            // The frames the server holds were ACKed to the FPGA: they go
            // into the tally (and the recording, if it still takes them): a
            // queue's worth at most.
            for _ in t.frames..want.min(t.frames + u64::from(a.depth)) {
                match server.poll_frame(Some(Duration::ZERO)) {
                    Ok(Some(f)) => take(&mut t, f),
                    _ => break,
                }
            }
            if let Some(stop) = stop {
                bar.suspend(|| errln!("rocev2 recv{who}: {stop}; stopping"));
            }
            break;
        }
        let now = Instant::now();
        let idle_left = idle.saturating_sub(now - active);
        if idle_left.is_zero() {
            bar.suspend(|| errln!("rocev2 recv{who}: no frame for {idle:?}; stopping"));
            break;
        }
        let wait = match &ticker {
            Some(tk) => tk.next.saturating_duration_since(now).min(idle_left),
            None => idle_left,
        };
        if let Some(f) = server
            .poll_frame(Some(wait.min(signals::CHECK_EVERY)))
            .map_err(lib_err(SERVER_FLAGS))?
        {
            take(&mut t, f);
            active = Instant::now();
        }
        if let Some(tk) = ticker.as_mut().filter(|tk| Instant::now() >= tk.next) {
            let line = tk.line(&t, &server.stats(), link);
            bar.suspend(|| errln!("{line}"));
        }
    }
    bar.finish_and_clear();
    if let Some(e) = &t.first_error {
        errln!(
            "rocev2 recv{who}: verify: {} frames failed; the first: {e}",
            t.bad
        );
    }
    Ok(t)
}

/// The summary line; `link` (with several --fpga): which link, first.
fn summary(
    t: &Tally,
    s: &Stats,
    end_cause: Option<String>,
    rec: Option<RogueWriter>,
    link: Option<serde_json::Value>,
) -> Result<(), Fail> {
    let (gbit, fps) = t.rate();
    let mut v = json!({
        "frames": t.frames, "bytes": t.bytes, "verify_errors": t.bad, "seconds": round3(t.span()),
        "gbit_per_s": round3(gbit), "frames_per_s": fps.round(), "rnr_naks": s.soft().rnr_naks_tx,
        "seq_naks": s.soft().seq_naks_tx, "invalid_naks": s.soft().invalid_naks_tx, "duplicates": s.soft().duplicates, "socket_drops": s.soft().socket_drops,
        "icrc_checked": s.soft().icrc_checked, "icrc_errors": s.soft().icrc_errors,
        "icrc_unchecked": s.soft().icrc_unchecked, "peer_restarts": s.peer_restarts(),
        "stale_packets": s.soft().stale_packets, "link_state": s.link.as_str(), "end_cause": end_cause,
        "parks": s.parks, "naps": s.naps, "counter_gaps": s.counter_gaps,
        "counter_gap_frames": s.counter_gap_frames, "counter_resets": s.counter_resets,
        "duplicating_peer": s.duplicating_peer != 0, "duplicating_peers": s.duplicating_peers,
        "rnr_storm": s.rnr_storm != 0, "rnr_storms": s.rnr_storms,
    });
    if let BackendStats::Verbs(vs) = s.backend {
        v["port_duplicates"] = json!(vs.port_duplicates);
        v["port_rnr_naks"] = json!(vs.port_rnr_naks);
        v["lost_frames_estimate"] = json!(vs.lost_frames_estimate);
        v["stale_peers"] = json!(vs.stale_peers);
        v["stale_peer"] = json!(vs.stale != 0);
        v["peer_watched"] = json!(vs.watched != 0);
    }
    for (key, l) in [
        ("ack_turnaround", s.ack_turnaround),
        ("delivery_latency", s.delivery_latency),
    ] {
        if l.count > 0 {
            v[key] = json!({
                "count": l.count, "p50_ns": l.p50_ns, "p99_ns": l.p99_ns, "p999_ns": l.p999_ns,
                "max_ns": l.max_ns,
            });
        }
    }
    if let Some(w) = rec {
        v["recorded"] = json!(w.records);
        v["recorded_skipped_empty"] = json!(w.skipped_empty);
        match &t.out_error {
            // The recording ends where the write failed: nothing to flush.
            Some(e) => v["out_error"] = json!(e),
            None => w.finish().map_err(Fail::runtime)?,
        }
    }
    if let Some(mut l) = link {
        l.as_object_mut()
            .expect("a JSON object")
            .extend(std::mem::take(v.as_object_mut().expect("a JSON object")));
        v = l;
    }
    print_json(v)?;
    Ok(())
}

/// `--cpu` names a CPU this process may run on (the library would only
/// warn and leave the thread unpinned).
fn check_cpu(cpu: u32) -> Result<(), Fail> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(str::trim)
    else {
        return Ok(());
    };
    let allowed = list.split(',').any(|r| {
        let mut ends = r.split('-').map(|n| n.trim().parse::<u32>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => cpu == a,
            (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&cpu),
            _ => false,
        }
    });
    if allowed {
        return Ok(());
    }
    Err(Fail::usage(format!(
        "--cpu {cpu}: this process may run on CPUs {list} only; pick one of them"
    )))
}
