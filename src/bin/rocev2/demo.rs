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
    /// The emulator waits for ACKs as surf's engine does: with its window full it busy-polls its socket instead of sleeping in poll() (a core kept busy while streaming), so the run measures the host's turnaround, not the emulator's wake-ups
    #[arg(long)]
    busy_wait: bool,
}

/// Checks frames in order against the emulator's pattern.
struct Verifier {
    next: AtomicU64,
    bytes: AtomicU64,
    first_error: Mutex<Option<String>>,
    channels: Vec<u8>,
}

impl Verifier {
    fn check(&self, f: &Frame) {
        let want = self.next.fetch_add(1, Ordering::Relaxed);
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
    let e = lib_err(FLAGS);
    let dev = Device::open(
        &SoftConfig {
            icrc_check: a.icrc_check.into(),
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
    ecfg.pmtu = args::mtu(a.shape.pmtu);
    ecfg.faults = a.faults.faults();
    ecfg.busy_wait = a.busy_wait;
    if a.faults.any() {
        ecfg.timeout_code = 12;
    }
    let emu = FpgaEmulator::new(ecfg).map_err(&e)?;
    server.set_fpga_gid(emu.gid()).map_err(&e)?;
    let v = Arc::new(Verifier {
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
    let Rig { server, mut emu, v } = build(&a)?;
    let hp = server.host_params();
    outln!(
        "rocev2 demo: soft server {}:{} (QP {:#08x}) <- FPGA emulator {} (QP {:#08x}); {} frames x {} B, \
         pmtu {}, {} slots, channels {}{}",
        Ipv4Addr::LOCALHOST,
        hp.udp_port,
        hp.qpn,
        emu.local_addr(),
        emu.qpn(),
        a.frames,
        a.shape.size,
        128u32 << a.shape.pmtu,
        a.depth,
        a.shape.channels,
        a.faults.suffix(", ")
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
