//! The FPGA side: `rocev2 fpga-sim` (the soft emulator over UDP) and
//! `rocev2 verbs-fpga` (an RC requester on an RDMA device).

use std::net::SocketAddrV4;
use std::time::Instant;

use clap::Args;
use rocev2::bench::Rate;
use rocev2::emulator::{EmulatorConfig, FpgaEmulator};
use serde_json::json;

use crate::args::{self, num, FaultArgs, Shape, MAX_24BIT};
use crate::out::{self, lib_err, print_json, round3, FlagNames};
use crate::{Exit, Outcome};

const FLAGS: FlagNames = &[("pmtu", "--pmtu"), ("udp_port", "--bind")];

/// The FPGA emulator, pointed at a server by its host params
///
/// surf's RoCEv2 engine in software: streams pattern frames to a server
/// (`rocev2 recv` prints the values for --host, --host-qpn and --psn), with
/// optional seeded fault injection; prints one JSON summary line.
#[derive(Args, Debug)]
#[command(after_help = crate::after_help(), allow_negative_numbers = true)]
pub struct FpgaSimArgs {
    /// The server's address: its IP and UDP port (udp_port of `rocev2 recv`)
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:4791", value_parser = args::socket_v4)]
    host: SocketAddrV4,
    /// The server's QP number (qpn)
    #[arg(long, value_name = "N", required = true, value_parser = num::<u32>(0, MAX_24BIT))]
    host_qpn: u32,
    /// The first PSN to send: the host SQ PSN (sq_psn)
    #[arg(long, value_name = "N", required = true, value_parser = num::<u32>(0, MAX_24BIT))]
    psn: u32,
    /// The emulator's own QP number [default: random]
    #[arg(long, value_name = "N", value_parser = num::<u32>(0, MAX_24BIT))]
    qpn: Option<u32>,
    /// Local address to send from (port 0 = any)
    #[arg(long, value_name = "IP:PORT", default_value = "127.0.0.1:0")]
    bind: SocketAddrV4,
    /// Frames to stream
    #[arg(long, value_name = "N", default_value = "10000", value_parser = num::<u64>(1, u64::MAX))]
    frames: u64,
    #[command(flatten)]
    shape: Shape,
    #[command(flatten)]
    faults: FaultArgs,
    /// Local ACK timeout code: 4.096 us x 2^code (14 = 67 ms, surf's default); 0 = never time out (infinite, as in IB): lost last packets are then never resent and the stream waits forever
    #[arg(long, value_name = "0..31", default_value = "14", value_parser = num::<u8>(0, 31))]
    timeout_code: u8,
    /// Messages un-ACKed at most (surf's engine: 4; deeper engines more)
    #[arg(long, value_name = "MESSAGES", default_value = "4", value_parser = num::<usize>(1, 1024))]
    window: usize,
    /// Retries after a timeout before a frame fails (IB 3-bit count)
    #[arg(long, value_name = "0..7", default_value = "7", value_parser = num::<u32>(0, 7))]
    retry_cnt: u32,
    /// Retries after an RNR NAK (IB 3-bit count; 7 = forever)
    #[arg(long, value_name = "0..7", default_value = "7", value_parser = num::<u32>(0, 7))]
    rnr_retry: u32,
    /// Start over at the first PSN every N frames (once all are ACKed), as an FPGA re-programmed after a reload does; the frames' sequence numbers go on
    #[arg(long, value_name = "N", value_parser = num::<u64>(1, u64::MAX))]
    restart_after: Option<u64>,
    /// The first frame's sequence number (the pattern's first 8 bytes), so a run can go on where another stopped (`recv --verify` checks the numbers)
    #[arg(long, value_name = "N", default_value = "0", value_parser = num::<u64>(0, u64::MAX / 2))]
    first_seq: u64,
    /// Frames per second at most, released every 20 us as a NIC's interrupt coalescing would (default: as fast as the window allows)
    #[arg(long, value_name = "F/S", value_parser = num::<u64>(1, 100_000_000))]
    rate: Option<u64>,
    /// Send each burst of equal packets as one UDP GSO datagram (UDP_SEGMENT; the kernel or NIC cuts it, segment k with IP ID k), as a NIC's GRO would hand them to the host
    #[arg(long)]
    gso: bool,
    /// With the window full, busy-poll the socket for the ACK instead of sleeping in poll(), as the engine waits in hardware: no wake-up per round trip (a core kept busy while streaming), one packet per datagram as through a NIC (not with --gso)
    #[arg(long, conflicts_with = "gso")]
    busy_wait: bool,
    /// The frame counter in immediate bits [31:8] wraps to 0 at N (surf's AddrWrapCount register); `recv --counter-wrap N` checks it
    #[arg(long, value_name = "N", default_value = "16777216", value_parser = num::<u32>(1, 1 << 24))]
    counter_wrap: u32,
}

pub fn fpga_sim(a: FpgaSimArgs) -> Outcome {
    out::check_bind(a.bind, "--bind")?;
    let mut cfg = EmulatorConfig::new(a.bind, a.host, a.host_qpn, a.psn);
    if let Some(q) = a.qpn {
        cfg.qpn = q;
    }
    cfg.pmtu = args::mtu(a.shape.pmtu);
    cfg.faults = a.faults.faults();
    cfg.timeout_code = a.timeout_code;
    cfg.window = a.window;
    cfg.retry_cnt = a.retry_cnt;
    cfg.rnr_retry = a.rnr_retry;
    cfg.restart_after = a.restart_after;
    cfg.first_seq = a.first_seq;
    cfg.gso = a.gso;
    cfg.busy_wait = a.busy_wait;
    cfg.rate = a.rate.map(|r| r as f64);
    cfg.counter_wrap = a.counter_wrap;
    let e = lib_err(FLAGS);
    let mut emu = FpgaEmulator::new(cfg).map_err(&e)?;
    errln!(
        "rocev2 fpga-sim: {} QP {:#x} -> {} QP {:#x} from PSN {:#x}{}",
        emu.local_addr(),
        emu.qpn(),
        a.host,
        a.host_qpn,
        a.psn,
        a.faults.suffix("; ")
    );
    let t0 = Instant::now();
    let res = out::stream_with_progress(&mut emu, a.frames, &a.shape, None, |_, _| ());
    res.map_err(out::lib_err(FLAGS))?;
    let r = Rate::of(a.frames, a.frames * a.shape.size as u64, t0.elapsed());
    let s = emu.stats();
    print_json(json!({
        "frames": a.frames, "gbit_per_s": round3(r.gbit), "retransmits": s.requester.retransmits,
        "rnr_naks": s.requester.rnr_naks, "seq_naks": s.requester.seq_naks,
        "timeouts": s.requester.timeouts, "restarts": s.restarts,
        "skipped_numbers": s.skipped, "sent_twice": s.sent_twice,
    }))?;
    if a.faults.faults.skip > 0.0 {
        errln!(
            "rocev2 fpga-sim: skipped {} frame number(s) (--faults skip): a server checking the \
             counter (recv --counter-wrap {}) finds them missing",
            s.skipped,
            a.counter_wrap
        );
    }
    Ok(Exit::Ok)
}

/// `--fill`: what verbs-fpga writes into its send buffers.
#[cfg(feature = "verbs")]
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fill {
    Pattern,
    None,
}

/// An RC requester on an RDMA device playing the FPGA (rdma_rxe, a spare NIC)
///
/// Prints its QPN and GID as one JSON line, waits for a line on stdin (the
/// host has completed its connection), then streams frames and prints one
/// JSON summary line.
#[cfg(feature = "verbs")]
#[derive(Args, Debug)]
#[command(after_help = crate::after_help(), allow_negative_numbers = true)]
pub struct VerbsFpgaArgs {
    /// RDMA device (`rocev2 info` lists them)
    #[arg(long, value_name = "NAME", required = true)]
    device: String,
    /// Device port
    #[arg(long, value_name = "N", default_value = "1", value_parser = num::<u8>(1, 255))]
    ib_port: u8,
    /// GID table index of this side's RoCE v2 IPv4 address
    #[arg(long, value_name = "N", default_value = "0", value_parser = num::<u8>(0, 255))]
    gid_index: u8,
    /// The server's QP number (qpn)
    #[arg(long, value_name = "N", required = true, value_parser = num::<u32>(0, MAX_24BIT))]
    host_qpn: u32,
    /// The server's GID (gid)
    #[arg(long, value_name = "GID", required = true, value_parser = args::gid)]
    host_gid: rocev2::Gid,
    /// The first PSN to send: the host SQ PSN (sq_psn)
    #[arg(long, value_name = "N", required = true, value_parser = num::<u32>(0, MAX_24BIT))]
    psn: u32,
    /// Frames to stream
    #[arg(long, value_name = "N", default_value = "1000", value_parser = num::<u64>(1, u64::MAX))]
    frames: u64,
    #[command(flatten)]
    shape: Shape,
    /// Sends in flight
    #[arg(long, value_name = "N", default_value = "16", value_parser = num::<u32>(1, 4096))]
    inflight: u32,
    /// What the send buffers hold: the emulator's pattern (verifiable by `recv --verify`), or none (sent as they are, like ib_send_bw, for benchmarks)
    #[arg(long, value_name = "WHAT", default_value = "pattern")]
    fill: Fill,
    /// Play an FPGA reload after N frames: the QP is reset and re-programmed with the same host params (its PSN back to the first), then the remaining frames follow. A verbs host drops them as old duplicates and reports a peer restart; a soft host re-synchronises
    #[arg(long, value_name = "N", value_parser = num::<u64>(1, u64::MAX))]
    restart_after: Option<u64>,
}

#[cfg(feature = "verbs")]
pub fn verbs_fpga(a: VerbsFpgaArgs) -> Outcome {
    use rocev2::{emulator::verbs::VerbsRequester, verbs::VerbsDevice};
    use std::sync::Arc;
    use std::time::Duration;
    let e = lib_err(&[("gid_index", "--gid-index"), ("ib_port", "--ib-port")]);
    let dev = VerbsDevice::open(&a.device, a.ib_port, a.gid_index)
        .map_err(&e)
        .map_err(crate::out::device_hint(&a.device))?;
    let mut req = VerbsRequester::create(Arc::new(dev), a.inflight as usize, a.shape.size as usize)
        .map_err(&e)?;
    let gid = req.gid().map_err(&e)?;
    print_json(json!({"qpn": req.qpn(), "gid": gid.to_string()}))?;
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|err| crate::Fail::runtime(format!("reading stdin failed: {err}")))?;
    req.connect(a.host_qpn, a.host_gid, a.psn, args::mtu(a.shape.pmtu))
        .map_err(&e)?;
    let fill = a.fill == Fill::Pattern;
    let first = a.restart_after.map_or(a.frames, |n| n.min(a.frames));
    let stream = |req: &mut VerbsRequester, n: u64| {
        req.stream_with(
            n,
            a.shape.size as usize,
            &a.shape.channels.0,
            Duration::from_secs(600),
            fill,
        )
        .map_err(&e)
    };
    let mut st = stream(&mut req, first)?;
    let mut restarts = 0;
    if first < a.frames {
        req.restart().map_err(&e)?;
        restarts = 1;
        let rest = stream(&mut req, a.frames - first)?;
        st.frames += rest.frames;
        st.bytes += rest.bytes;
        st.seconds += rest.seconds;
    }
    print_json(json!({
        "frames": st.frames, "gbit_per_s": round3(st.bytes as f64 * 8.0 / st.seconds / 1e9),
        "frames_per_s": (st.frames as f64 / st.seconds).round(), "restarts": restarts,
    }))?;
    Ok(Exit::Ok)
}
