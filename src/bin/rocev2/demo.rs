//! `rocev2 demo`: a soft server and the FPGA emulator in one process over
//! loopback; every byte, the order and the channel of every frame verified.

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use rocev2::bench::{udp_ceiling, Rate};
use rocev2::emulator::pattern;
use rocev2::emulator::{EmulatorConfig, FpgaEmulator};
use rocev2::{ConnectParams, Device, Frame, Server, ServerConfig, SoftConfig};

use crate::args::{self, num, FaultArgs, IcrcArg, Shape, MAX_DEPTH};
use crate::out::{self, lib_err, FlagNames};
use crate::signals::{self, Stop};
use crate::{Exit, Fail, Outcome};

/// How long the demo's emulator waits through ACK timeouts without progress
/// before it says the host does not answer (`EmulatorConfig::retries_for_stall`).
const DEMO_STALL_BUDGET: Duration = Duration::from_secs(10);

const FLAGS: FlagNames = &[
    ("maxPayload", "--size"),
    ("rxQueueDepth", "--depth"),
    ("pmtu", "--pmtu"),
];

/// Soft server + FPGA emulator in one process over loopback; verifies every frame
///
/// The emulator streams pattern frames to a soft-backend server over
/// loopback; every byte, the order and the channel of every frame are
/// verified, then the throughput and both sides' counters are printed.
/// SIGINT, SIGTERM or SIGHUP ends the stream early: the same report for the
/// frames delivered, exit 130, 143 or 129.
#[derive(Args, Debug)]
#[command(after_help = crate::after_help(), allow_negative_numbers = true)]
pub struct DemoArgs {
    /// Frames to stream
    #[arg(long, value_name = "N", default_value = "200000", value_parser = num::<u64>(1, u64::MAX))]
    frames: u64,
    #[command(flatten)]
    shape: Shape,
    /// Receive slots of the server
    #[arg(long, value_name = "SLOTS", default_value = "256", value_parser = num::<u32>(1, MAX_DEPTH))]
    depth: u32,
    #[command(flatten)]
    faults: FaultArgs,
    /// Also measure raw loopback UDP for this long, as a reference
    #[arg(long, value_name = "SECONDS", value_parser = args::seconds)]
    udp_ceiling: Option<f64>,
    /// Received ICRCs: auto checks them by raw capture when allowed (CAP_NET_RAW), else counts them unchecked; require fails without CAP_NET_RAW
    #[arg(long, value_name = "MODE", default_value = "auto")]
    icrc_check: IcrcArg,
    /// Links: N emulators (from 127.0.0.2, 127.0.0.3, ...) streaming at once to N servers on one address and port (127.0.0.1:--port), as several FPGAs to one host; one summary line per link and a total
    #[arg(long, value_name = "N", default_value = "1", value_parser = num::<u32>(1, 64))]
    links: u32,
    /// With --links: the UDP port all the servers share (0 = a free port, picked by the first server; 4791 = RoCEv2's)
    #[arg(long, value_name = "N", default_value = "0", value_parser = num::<u16>(0, 65535))]
    port: u16,
    /// The emulator waits for ACKs as surf's engine does: with its window full it busy-polls its socket instead of sleeping in poll() (a core kept busy while streaming), so the run measures the host's turnaround, not the emulator's wake-ups
    #[arg(long)]
    busy_wait: bool,
}

/// Checks frames in order against the emulator's pattern.
struct Verifier {
    /// The first frame's sequence number (`--links`: link i's frames are
    /// numbered from i << 40, so a frame of another link shows).
    base: u64,
    next: AtomicU64,
    bytes: AtomicU64,
    first_error: Mutex<Option<String>>,
    channels: Vec<u8>,
}

impl Verifier {
    fn check(&self, f: &Frame) {
        let want = self.base + self.next.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(f.len() as u64, Ordering::Relaxed);
        let err = match pattern::check(f.data()) {
            Err(e) => Some(e),
            Ok(seq) if seq != want => Some(format!("frame {seq} arrived where {want} was due")),
            Ok(seq)
                if f.channel() != self.channels[(seq % self.channels.len() as u64) as usize] =>
            {
                Some(format!("frame {seq} arrived on channel {}", f.channel()))
            }
            Ok(_) => None,
        };
        if let Some(e) = err {
            self.first_error.lock().unwrap().get_or_insert(e);
        }
    }
}

/// A connected soft server with its verifier, and the emulator feeding it.
struct Rig {
    server: Server,
    emu: FpgaEmulator,
    v: Arc<Verifier>,
}

fn build(a: &DemoArgs) -> Result<Rig, Fail> {
    build_on(a, 0, None)
}

/// A rig whose server binds 127.0.0.1:`port` (0 = a free port), and whose
/// emulator sends from `fpga` (None: the server's address, a free port).
fn build_on(a: &DemoArgs, port: u16, fpga: Option<Ipv4Addr>) -> Result<Rig, Fail> {
    let e = lib_err(FLAGS);
    let dev = Device::open(
        &SoftConfig {
            icrc_check: a.icrc_check.into(),
            udp_port: port,
            ..SoftConfig::ephemeral("127.0.0.1")
        }
        .into(),
    )
    .map_err(&e)?;
    let cfg = ServerConfig {
        max_payload: a.shape.size,
        rx_queue_depth: a.depth,
        // The summary prints the ACK turnaround and the delivery latency.
        measure_latency: true,
        ..Default::default()
    };
    let server = Server::create(&dev, &cfg).map_err(&e)?;
    let hp = server.host_params();
    let mut ecfg = EmulatorConfig::for_server(&hp).map_err(&e)?;
    let mut base = 0;
    if let Some(ip) = fpga {
        ecfg.bind = std::net::SocketAddrV4::new(ip, 0);
        // Link i (from 127.0.0.2) numbers its frames from i << 40.
        base = u64::from(u32::from(ip) - u32::from(Ipv4Addr::new(127, 0, 0, 2))) << 40;
        ecfg.first_seq = base;
    }
    ecfg.pmtu = args::mtu(a.shape.pmtu);
    ecfg.faults = a.faults.faults();
    ecfg.busy_wait = a.busy_wait;
    if a.faults.any() {
        ecfg.timeout_code = 12;
    }
    // The emulator shares this machine with the server: its stalls are no
    // host failure (the soak stage, 1M frames with faults beside two busy
    // loops, lost its emulator to 7 timeouts of 16.8 ms in a row).
    ecfg.retries_for_stall(DEMO_STALL_BUDGET);
    let emu = FpgaEmulator::new(ecfg).map_err(&e)?;
    server.set_fpga_gid(emu.gid()).map_err(&e)?;
    let v = Arc::new(Verifier {
        base,
        next: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
        first_error: Mutex::new(None),
        channels: a.shape.channels.0.clone(),
    });
    let v2 = v.clone();
    server
        .set_frame_callback(move |f| v2.check(&f))
        .map_err(&e)?;
    let params = ConnectParams::new(emu.qpn(), hp.sq_psn, a.shape.pmtu, 1).map_err(&e)?;
    server.complete_connection(&params).map_err(&e)?;
    Ok(Rig { server, emu, v })
}

pub fn run(a: DemoArgs) -> Outcome {
    signals::catch_stop_signals()?;
    args::check_slab(a.shape.size, a.depth, "--size")?;
    if a.links > 1 {
        return run_links(&a);
    }
    let Rig { server, mut emu, v } = build(&a)?;
    let hp = server.host_params();
    outln!(
        "rocev2 demo: soft server {}:{} (QP {:#08x}) <- FPGA emulator {} (QP {:#08x}); {}",
        Ipv4Addr::LOCALHOST,
        hp.udp_port,
        hp.qpn,
        emu.local_addr(),
        emu.qpn(),
        what(&a, "")
    )?;
    let t0 = Instant::now();
    let stop_asked = || signals::caught().is_some();
    let streamed = out::stream_with_progress(
        &mut emu,
        a.frames,
        &a.shape,
        Some(&stop_asked),
        |bar, done| {
            let r = Rate::of(done, done * a.shape.size as u64, t0.elapsed());
            bar.set_message(format!("{:.2} Gbit/s", r.gbit));
        },
    );
    // The frames streamed were ACKed: they reach the verifier soon. A stop
    // signal that comes while waiting for them ends the wait.
    let sent = *streamed.as_ref().unwrap_or(&0);
    let stopped_streaming = stop_asked();
    let deadline = Instant::now() + Duration::from_secs(10);
    while v.next.load(Ordering::Relaxed) < sent
        && Instant::now() < deadline
        && (stopped_streaming || !stop_asked())
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let elapsed = t0.elapsed();
    server.stop();
    streamed.map_err(out::lib_err(FLAGS))?;
    let got = v.next.load(Ordering::Relaxed);
    let rate = Rate::of(got, v.bytes.load(Ordering::Relaxed), elapsed);
    report(&a, &server, &emu, got, elapsed, rate)?;
    let err = v.first_error.lock().unwrap().clone();
    verdict(err, got, a.frames, signals::caught())
}

/// What is streamed (`each`: after the frames' size), for the first line.
fn what(a: &DemoArgs, each: &str) -> String {
    format!(
        "{} frames x {} B{each}, pmtu {}, {} slots, channels {}{}",
        a.frames,
        a.shape.size,
        128u32 << a.shape.pmtu,
        a.depth,
        a.shape.channels,
        a.faults.suffix(", ")
    )
}

/// Streams `a.frames` frames on every rig at once, a thread each; each
/// link's outcome (frames sent) and when it ended, since `t0`.
fn stream_links(
    a: &DemoArgs,
    rigs: &mut [Rig],
    t0: Instant,
) -> Vec<(rocev2::Result<u64>, Duration)> {
    let stop_asked = || signals::caught().is_some();
    // Each link streams in parts (ACKed before the next), so a stop signal
    // ends every stream soon.
    let part = (16u64 << 20).div_ceil(a.shape.size as u64);
    std::thread::scope(|s| {
        let handles: Vec<_> = rigs
            .iter_mut()
            .map(|r| {
                let emu = &mut r.emu;
                s.spawn(move || {
                    let mut sent = 0;
                    while sent < a.frames && !stop_asked() {
                        let n = part.min(a.frames - sent);
                        let size = a.shape.size as usize;
                        let chans = &a.shape.channels.0;
                        if let Err(e) =
                            emu.stream(n, size, chans, 64, Duration::from_secs(3600), |_| {})
                        {
                            return (Err(e), t0.elapsed());
                        }
                        sent += n;
                    }
                    (Ok(sent), t0.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a link's stream"))
            .collect()
    })
}

/// Waits (10 s at most) until each rig's server delivered what its
/// emulator sent.
fn await_delivery(rigs: &[Rig], results: &[(rocev2::Result<u64>, Duration)]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    for (r, (res, _)) in rigs.iter().zip(results) {
        let sent = *res.as_ref().unwrap_or(&0);
        while r.v.next.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// `--links N`: N rigs, the servers on one address and port, streamed at
/// once; a line per link and a total.
fn run_links(a: &DemoArgs) -> Outcome {
    let first = build_on(a, a.port, Some(Ipv4Addr::new(127, 0, 0, 2)))?;
    let port = first.server.host_params().udp_port;
    let mut rigs = vec![first];
    for i in 1..a.links {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 0, 2)) + i);
        rigs.push(build_on(a, port, Some(ip))?);
    }
    outln!(
        "rocev2 demo: {} soft servers on {}:{port} <- {} FPGA emulators (127.0.0.2..); {}",
        a.links,
        Ipv4Addr::LOCALHOST,
        a.links,
        what(a, " each")
    )?;
    let t0 = Instant::now();
    let results = stream_links(a, &mut rigs, t0);
    await_delivery(&rigs, &results);
    let elapsed = t0.elapsed();
    let mut first_error = None;
    let (mut total, mut bytes, mut rates) = (0u64, 0u64, Vec::new());
    for (i, (r, (res, took))) in rigs.iter().zip(results).enumerate() {
        r.server.stop();
        let got = r.v.next.load(Ordering::Relaxed);
        let b = r.v.bytes.load(Ordering::Relaxed);
        let rate = Rate::of(got, b, took);
        let (s, e) = (r.server.stats(), r.emu.stats());
        let err = match res {
            Err(e) => Some(format!("the emulator failed: {e}")),
            Ok(_) => r.v.first_error.lock().unwrap().clone(),
        };
        let verify = match &err {
            Some(e) => format!("FAILED: {e}"),
            None if got == a.frames || signals::caught().is_some() => "OK".to_string(),
            None => format!("FAILED: {got} of {} frames", a.frames),
        };
        outln!(
            "link {i:<2}: FPGA {} QP {:#08x} -> QP {:#08x}: {got} frames, {:.3} Gbit/s, {:.0} \
             frames/s; {} packets in, {} ACKs, {} seq NAKs, {} duplicates, {} foreign; \
             emulator {} retransmits, {} timeouts; verify {verify}",
            r.emu.local_addr().ip(),
            r.emu.qpn(),
            r.server.host_params().qpn,
            rate.gbit,
            rate.per_sec,
            s.soft().packets_rx,
            s.soft().acks_tx,
            s.soft().seq_naks_tx,
            s.soft().duplicates,
            s.soft().foreign_packets,
            e.requester.retransmits,
            e.requester.timeouts
        )?;
        if verify != "OK" && first_error.is_none() {
            first_error = Some(format!(
                "link {i}: {}",
                verify.trim_start_matches("FAILED: ")
            ));
        }
        total += got;
        bytes += b;
        rates.push(rate.per_sec);
    }
    let all = Rate::of(total, bytes, elapsed);
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let slowest = rates.iter().copied().fold(f64::INFINITY, f64::min);
    outln!(
        "total  : {total} frames in {:.3} s, {:.3} Gbit/s, {:.0} frames/s; slowest link {:.2} \
         of the mean",
        elapsed.as_secs_f64(),
        all.gbit,
        all.per_sec,
        if mean > 0.0 { slowest / mean } else { 0.0 }
    )?;
    let want = a.frames * u64::from(a.links);
    let got = if first_error.is_none() { total } else { 0 };
    verdict(first_error, got, want, signals::caught())
}

/// The verify line and the exit code (130, 143 or 129 after a stop signal).
fn verdict(err: Option<String>, got: u64, frames: u64, stop: Option<Stop>) -> Outcome {
    Ok(match (err, stop) {
        (Some(e), _) => {
            outln!("verify           : FAILED: {e}")?;
            stop.map_or(Exit::Verify, Stop::exit)
        }
        (None, Some(stop)) => {
            outln!(
                "verify           : OK for the {got} frames delivered before {stop} (every byte, \
                 order and channel)"
            )?;
            stop.exit()
        }
        (None, None) if got == frames => {
            outln!("verify           : OK (every byte, order and channel of every frame)")?;
            Exit::Ok
        }
        (None, None) => {
            outln!("verify           : FAILED: only {got} of {frames} frames arrived")?;
            Exit::Timeout
        }
    })
}

/// The summary lines (and the UDP ceiling, when asked for).
fn report(
    a: &DemoArgs,
    server: &Server,
    emu: &FpgaEmulator,
    got: u64,
    elapsed: Duration,
    rate: Rate,
) -> Result<(), Fail> {
    let s = server.stats();
    let e = emu.stats();
    outln!(
        "frames delivered : {got} of {} in {:.3} s",
        a.frames,
        elapsed.as_secs_f64()
    )?;
    outln!(
        "throughput       : {:.3} Gbit/s, {:.0} frames/s",
        rate.gbit,
        rate.per_sec
    )?;
    outln!(
        "emulator         : {} packets, {} retransmits, {} RNR NAKs, {} seq NAKs, {} timeouts",
        e.requester.packets,
        e.requester.retransmits,
        e.requester.rnr_naks,
        e.requester.seq_naks,
        e.requester.timeouts
    )?;
    if a.faults.any() {
        outln!(
            "faults injected  : {} dropped, {} duplicated, {} reordered, {} corrupted",
            e.dropped,
            e.duplicated,
            e.reordered,
            e.corrupted
        )?;
    }
    outln!(
        "server           : {} packets in, {} ACKs, {} RNR NAKs, {} seq NAKs, {} duplicates, {} parks, {} naps, {} socket drops",
        s.soft().packets_rx, s.soft().acks_tx, s.soft().rnr_naks_tx, s.soft().seq_naks_tx, s.soft().duplicates, s.parks, s.naps, s.soft().socket_drops
    )?;
    outln!(
        "payload copies   : {} packets received straight into their slot, {} copied (missed landing guess); \
         ICRC {} checked, {} unchecked",
        s.soft().payload_direct, s.soft().payload_copied, s.soft().icrc_checked, s.soft().icrc_unchecked
    )?;
    outln!(
        "latency          : ACK turnaround {}; delivery {} (kernel receive stamp to the callback)",
        s.ack_turnaround,
        s.delivery_latency
    )?;
    if s.soft().icrc_errors > 0 {
        outln!(
            "ICRC errors      : {} packets dropped for a bad ICRC (resent by the emulator)",
            s.soft().icrc_errors
        )?;
    }
    if let Some(secs) = a.udp_ceiling {
        let mtu_bytes = 128usize << a.shape.pmtu;
        let size = a.shape.size as usize;
        let wire =
            rocev2::wire::Packet::wire_len(rocev2::wire::Opcode::SendOnlyImm, size.min(mtu_bytes));
        let c = udp_ceiling(wire, Duration::from_secs_f64(secs)).map_err(lib_err(FLAGS))?;
        let pkts_per_frame = size.div_ceil(mtu_bytes) as f64;
        outln!(
            "UDP ceiling      : {:.3} Gbit/s, {:.0} datagrams/s of {wire} B (raw loopback, same batching); \
             demo/ceiling = {:.2} (packets/s)",
            c.gbit,
            c.per_sec,
            rate.per_sec * pkts_per_frame / c.per_sec
        )?;
    }
    Ok(())
}
