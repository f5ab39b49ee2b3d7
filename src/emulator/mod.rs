//! The FPGA emulator: an RC requester on a UDP socket that streams frames to a
//! rocev2 server the way SLAC surf's RoCEv2 engine does (see
//! [`requester`]), with seeded fault injection (drop, duplicate,
//! reorder) on the packets it sends and on the ACKs it receives.
//!
//! ```no_run
//! # use rocev2::emulator::*;
//! # use std::net::{Ipv4Addr, SocketAddrV4};
//! # fn main() -> rocev2::Result<()> {
//! let mut fpga = FpgaEmulator::new(EmulatorConfig::new(
//!     SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 0),  // where the emulator binds
//!     SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791),        // the server
//!     0x123456,                                             // host QPN
//!     0xabcdef,                                             // host SQ PSN
//! ))?;
//! fpga.submit(rocev2::emulator::pattern::make(0, 4096), 3);
//! fpga.run_until_idle(std::time::Duration::from_secs(5))?;
//! # Ok(()) }
//! ```

pub mod pattern;
pub mod requester;
mod stream;
mod tx;
#[cfg(feature = "verbs")]
pub mod verbs;

use std::net::SocketAddrV4;
use std::time::{Duration, Instant};

use crate::config::Mtu;
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::net::UdpIo;
use crate::sys::{poll_readable, random_u32};
use crate::wire::icrc::{IcrcCache, Ipv4Udp};
use crate::wire::MASK_24;
use crate::wire::{self, Bth, Opcode, Packet};
use pattern::Rng;
use requester::{Requester, RequesterConfig, RequesterStats};
use tx::{Template, Tx};

pub use stream::{copies_of, StreamPlan};

/// Seeded fault injection, applied to packets sent and ACKs received.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Faults {
    /// RNG seed.
    pub seed: u64,
    /// Probability of dropping a packet.
    pub drop: f64,
    /// Probability of duplicating a packet.
    pub duplicate: f64,
    /// Probability of delaying a packet behind the next one.
    pub reorder: f64,
    /// Probability of flipping one bit of a sent packet after its ICRC was
    /// computed (a corrupting link): only a receiver that checks ICRCs (raw
    /// capture) can tell; on an unchecked one the frame arrives damaged.
    pub corrupt: f64,
    /// Probability of skipping a frame number: the frame gets the next
    /// number but one (immediate bits \[31:8\]), as an FPGA that dropped a
    /// frame before sending it would; never a skip onto 0 at the wrap,
    /// which would read as a reset. Counted in `EmulatorStats::skipped`.
    pub skip: f64,
    /// surf's "sticky half bandwidth" latch: after the first RNR NAK, every
    /// packet is sent twice (its copy right behind it; surf's frames are one
    /// packet each, so every message twice): the host re-ACKs and drops
    /// each copy as a duplicate, and the link runs at half rate until the
    /// FPGA's TxEn is toggled. Counted in `EmulatorStats::sent_twice`.
    pub sticky_half: bool,
}

impl Faults {
    /// True when any fault is enabled.
    pub fn any(&self) -> bool {
        self.drop > 0.0
            || self.duplicate > 0.0
            || self.reorder > 0.0
            || self.corrupt > 0.0
            || self.skip > 0.0
            || self.sticky_half
    }
}

/// The FPGA's default counter wrap (`AddrWrapCount`): the whole 24 bits.
pub const DEFAULT_COUNTER_WRAP: u32 = 1 << 24;

/// Emulator settings.
#[derive(Debug, Clone, Copy)]
pub struct EmulatorConfig {
    /// Local address to bind (port 0 = any).
    pub bind: SocketAddrV4,
    /// The server's address (host IP, its UDP port).
    pub host: SocketAddrV4,
    /// The server's QPN.
    pub host_qpn: u32,
    /// First PSN: the host SQ PSN (surf's convention).
    pub start_psn: u32,
    /// Our QPN (what the host passes as fpga_qpn).
    pub qpn: u32,
    /// Path MTU.
    pub pmtu: Mtu,
    /// Messages started and not acknowledged at most (surf fc56630: 4; a
    /// deeper engine: more).
    pub window: usize,
    /// Retransmit timeout, IB code (14 = 67 ms).
    pub timeout_code: u8,
    /// Timeout retries, then the frame fails (7; pyrogue programs the engine
    /// with 3, which a loaded host can exhaust with the emulator's short
    /// timeouts: tests/firmware/README.md).
    pub retry_cnt: u32,
    /// RNR retries (7 = forever).
    pub rnr_retry: u32,
    /// Faults injected.
    pub faults: Faults,
    /// Start over every this many frames, as an FPGA re-programmed after a
    /// reload does (see [`FpgaEmulator::restart`]); None = never.
    pub restart_after: Option<u64>,
    /// The first frame's sequence number in the pattern (a later run of a
    /// long test goes on where the last one stopped).
    pub first_seq: u64,
    /// Frames per second at most (None: as fast as the window allows),
    /// released every 20 us (a NIC's interrupt coalescing): frame i is
    /// submitted no earlier than about i / rate after the stream starts.
    pub rate: Option<f64>,
    /// Send each burst of equal-size packets as one UDP GSO datagram
    /// (`UDP_SEGMENT`; the kernel or the NIC cuts it into the packets, with
    /// IP IDs 0, 1, 2, ... that their ICRCs cover): what a NIC's GRO hands a
    /// host from a fast link, and the way to reach rates one packet per
    /// syscall cannot. Off by default: a window of 4 messages sent as one
    /// datagram arrives at once and is ACKed at once, so a producer and a
    /// consumer that both work per frame no longer overlap (the demo: 115k
    /// against 175k frames/s). Falls back to one packet per datagram,
    /// logged, where the route cannot segment.
    pub gso: bool,
    /// Wait for ACKs as the engine does: with its window full it never
    /// sleeps but busy-polls its (non-blocking) socket, yielding its CPU now
    /// and then, until an ACK comes or the retransmit timer is due. Off, it
    /// blocks in poll() and each round trip pays a wake-up the FPGA never
    /// has. Sends one packet per datagram, as through a NIC (`gso` must be
    /// off).
    pub busy_wait: bool,
    /// The frame counter in immediate bits \[31:8\] wraps to 0 here (surf's
    /// `AddrWrapCount`; 1..=2^24, default [`DEFAULT_COUNTER_WRAP`]).
    pub counter_wrap: u32,
}

impl EmulatorConfig {
    /// An emulator on the server's host (same IPv4 address, any free port)
    /// aimed at the soft server described by `host` (its GID's IPv4 address and
    /// UDP port), starting at its SQ PSN; surf's defaults otherwise.
    pub fn for_server(host: &crate::config::HostParams) -> Result<Self> {
        let ip = host.gid.ipv4().ok_or_else(|| {
            Error::invalid(format!("the server's GID {} is not IPv4-mapped", host.gid))
        })?;
        Ok(Self::new(
            SocketAddrV4::new(ip, 0),
            SocketAddrV4::new(ip, host.udp_port),
            host.qpn,
            host.sq_psn,
        ))
    }

    /// Raises `retry_cnt` so that ACK timeouts in a row without progress
    /// last at least `stall` at `timeout_code` (0: never times out, left
    /// as is). An emulator on the host's own machine shares the machine's
    /// stalls: on a loaded 2-CPU host a thread asleep for 1 ms woke up to
    /// 600 ms late (issue 38), so surf's 7 short timeouts blame the host for
    /// the machine; a host that truly stops answering is still found, after
    /// `stall`.
    pub fn retries_for_stall(&mut self, stall: Duration) {
        let timeout = RequesterConfig::timeout_from_code(self.timeout_code);
        if self.timeout_code != 0 {
            let n = (stall.as_nanos() as u64).div_ceil(timeout);
            self.retry_cnt = self.retry_cnt.max(n.min(u32::MAX as u64) as u32);
        }
    }

    /// The engine as pyrogue programs it: pmtu 4096, a window of 4 messages,
    /// timeout 14, rnr_retry 7; retry 7 (pyrogue: 3).
    pub fn new(bind: SocketAddrV4, host: SocketAddrV4, host_qpn: u32, start_psn: u32) -> Self {
        EmulatorConfig {
            bind,
            host,
            host_qpn,
            start_psn,
            qpn: 2 + random_u32() % (MASK_24 - 1),
            pmtu: Mtu::Mtu4096,
            window: 4,
            timeout_code: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            faults: Faults::default(),
            restart_after: None,
            first_seq: 0,
            rate: None,
            gso: false,
            busy_wait: false,
            counter_wrap: DEFAULT_COUNTER_WRAP,
        }
    }
}

/// Emulator counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmulatorStats {
    /// The requester's counters.
    pub requester: RequesterStats,
    /// Packets put on the wire (after fault injection).
    pub packets_tx: u64,
    /// Packets received.
    pub packets_rx: u64,
    /// Received packets that were not valid ACKs for us.
    pub rx_ignored: u64,
    /// Faults injected: dropped, duplicated, reordered.
    pub dropped: u64,
    /// Duplicated.
    pub duplicated: u64,
    /// Reordered.
    pub reordered: u64,
    /// Corrupted (one bit flipped behind the ICRC).
    pub corrupted: u64,
    /// Restarts at the first PSN (see [`FpgaEmulator::restart`]).
    pub restarts: u64,
    /// Frame numbers skipped (`Faults::skip`): frames the host's counter
    /// check should find missing.
    pub skipped: u64,
    /// Packets sent twice by the sticky-half latch (`Faults::sticky_half`).
    pub sent_twice: u64,
}

/// ACKs read per recvmmsg.
const RX_BATCH: usize = 64;

/// Busy polls between two yields of the CPU.
const POLLS_PER_YIELD: u32 = 64;

/// One empty poll of a busy-polling loop: a spin hint, and every
/// [`POLLS_PER_YIELD`] polls the CPU yielded to whatever else is runnable
/// on it (`polls` counts them).
pub(crate) fn relax(polls: &mut u32) {
    *polls = polls.wrapping_add(1);
    if *polls % POLLS_PER_YIELD == 0 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// The emulator.
pub struct FpgaEmulator {
    cfg: EmulatorConfig,
    io: UdpIo,
    local: SocketAddrV4,
    req: Requester,
    /// The counters of the requesters before the last restart.
    before_restart: RequesterStats,
    start: Instant,
    ring: u32,
    rng: Rng,
    tx_held: Option<Tx>,
    rx_held: Option<(u32, wire::Aeth)>,
    /// Packets to send, built unsealed.
    out: Vec<Tx>,
    runs: Vec<(usize, usize)>,
    gso: bool,
    spare: Vec<Vec<u8>>,
    /// The ICRC's pseudo-header state (one sender, one host: kept).
    icrc: IcrcCache,
    /// The payload of every message while [`FpgaEmulator::stream_template`] runs.
    template: Option<Template>,
    stats: EmulatorStats,
}

impl FpgaEmulator {
    /// Binds the socket; the requester starts at `cfg.start_psn`.
    pub fn new(cfg: EmulatorConfig) -> Result<FpgaEmulator> {
        if cfg.counter_wrap == 0 || cfg.counter_wrap > DEFAULT_COUNTER_WRAP {
            return Err(Error::invalid(format!(
                "counter_wrap must be in the range 1..{DEFAULT_COUNTER_WRAP} (the frame counter \
                 is immediate bits [31:8]); got {}",
                cfg.counter_wrap
            )));
        }
        if cfg.busy_wait && cfg.gso {
            return Err(Error::invalid(
                "busy_wait sends one packet per datagram, as through a NIC: turn gso off",
            ));
        }
        let io = UdpIo::bind(cfg.bind, RX_BATCH)?;
        let local = io.local_addr()?;
        Ok(FpgaEmulator {
            rng: Rng::new(cfg.faults.seed),
            req: Self::requester(&cfg),
            before_restart: RequesterStats::default(),
            cfg,
            io,
            local,
            start: Instant::now(),
            ring: 0,
            tx_held: None,
            rx_held: None,
            out: Vec::new(),
            runs: Vec::new(),
            gso: cfg.gso,
            spare: Vec::new(),
            icrc: IcrcCache::default(),
            template: None,
            stats: EmulatorStats::default(),
        })
    }

    /// A fresh requester for `cfg` (at its first PSN).
    fn requester(cfg: &EmulatorConfig) -> Requester {
        Requester::new(RequesterConfig {
            dest_qpn: cfg.host_qpn,
            start_psn: cfg.start_psn,
            pmtu: cfg.pmtu.bytes(),
            window: cfg.window.max(1),
            timeout_ns: RequesterConfig::timeout_from_code(cfg.timeout_code),
            retry_cnt: cfg.retry_cnt,
            rnr_retry: cfg.rnr_retry,
        })
    }

    /// Starts over as an FPGA re-programmed after a reload does (pyrogue
    /// programs it with the same host params): a new requester at the
    /// first PSN (the host SQ PSN), MSN 0, ring position 0. Frames not yet
    /// acknowledged are lost with the old state, as on a reload; restart
    /// when idle to lose none. Counters carry on (`stats().restarts` counts).
    pub fn restart(&mut self) {
        self.before_restart = self.before_restart + self.req.stats();
        self.req = Self::requester(&self.cfg);
        if let Some(t) = &mut self.template {
            t.restart(self.req.next_msg());
        }
        self.ring = 0;
        self.tx_held = None;
        self.rx_held = None;
        self.stats.restarts += 1;
    }

    /// Our QPN.
    pub fn qpn(&self) -> u32 {
        self.cfg.qpn
    }
    /// Our GID (IPv4-mapped bind address).
    pub fn gid(&self) -> Gid {
        Gid::from_ipv4(*self.local.ip())
    }
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }
    /// Counters.
    pub fn stats(&self) -> EmulatorStats {
        EmulatorStats {
            requester: self.before_restart + self.req.stats(),
            ..self.stats
        }
    }
    /// Frames submitted and not yet acknowledged.
    pub fn outstanding(&self) -> usize {
        self.req.outstanding()
    }

    /// Queues one frame on `channel`; the immediate is `counter << 8 |
    /// channel` with the counter +1 per frame, wrapping to 0 at
    /// `counter_wrap`, like surf's `addrCount` (`Faults::skip` skips one now
    /// and then).
    pub fn submit(&mut self, data: Vec<u8>, channel: u8) {
        let wrap = self.cfg.counter_wrap;
        if self.ring + 1 < wrap && self.rng.chance(self.cfg.faults.skip) {
            self.ring += 1;
            self.stats.skipped += 1;
        }
        let imm = (self.ring << 8) | channel as u32;
        self.ring = (self.ring + 1) % wrap;
        self.req.submit(data, imm);
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn fail_if_fatal(&self) -> Result<()> {
        match self.req.fatal() {
            // Retries that ran out are a timeout (the host stopped answering);
            // a fatal NAK is the host refusing.
            Some(f) => Err(Error::new(
                if f.gave_up {
                    ErrorKind::Timeout
                } else {
                    ErrorKind::Io
                },
                format!(
                    "FPGA emulator gave up: {} ({} frames lost)",
                    f.reason, f.lost_messages
                ),
            )),
            None => Ok(()),
        }
    }

    fn transmit(&mut self, now: u64) -> Result<usize> {
        let f = self.cfg.faults;
        // surf's sticky-half latch: set by the first RNR NAK, for good.
        let twice = f.sticky_half && self.stats().requester.rnr_naks > 0;
        let mut n = 0;
        while let Some(p) = self.req.poll_transmit(now) {
            let mut bth = Bth::new(p.opcode, self.cfg.host_qpn, p.psn);
            bth.ack_req = p.ack_req;
            n += 1;
            // A bit of the payload (or, without one, of the BTH's PSN),
            // flipped after the ICRC is computed.
            let corrupt = self.rng.chance(f.corrupt);
            self.stats.corrupted += corrupt as u64;
            if self.rng.chance(f.drop) {
                self.stats.dropped += 1;
                continue;
            }
            let duplicate = twice || self.rng.chance(f.duplicate);
            let hold = self.tx_held.is_none() && self.rng.chance(f.reorder);
            // Built here, sealed when it is known which segment of which
            // datagram it will be (its IP ID).
            let tx = if corrupt || duplicate || hold {
                let buf = self.spare.pop().unwrap_or_default();
                Tx::whole(&bth, p.imm, p.payload, buf, corrupt)
            } else {
                Tx::parts(&bth, p.imm, p.span, p.payload.len())
            };
            if twice {
                self.stats.sent_twice += 1;
                self.out.push(tx.clone());
            } else if duplicate {
                self.stats.duplicated += 1;
                self.out.push(tx.clone());
            }
            if hold {
                self.stats.reordered += 1;
                self.tx_held = Some(tx);
                continue;
            }
            self.out.push(tx);
            if let Some(h) = self.tx_held.take() {
                self.out.push(h);
            }
        }
        if n == 0 {
            // Nothing new: let a held packet go so it is never stuck.
            if let Some(h) = self.tx_held.take() {
                self.out.push(h);
            }
        }
        if !self.out.is_empty() {
            let sent = self.seal_and_send()?;
            self.stats.packets_tx += sent as u64;
            // What the socket did not take is lost, as on a wire; the requester recovers.
            let spare = &mut self.spare;
            spare.extend(self.out.drain(..).filter_map(Tx::into_buffer));
        }
        Ok(n)
    }

    /// Seals every queued packet (segment k of a GSO run: IP ID k) and
    /// sends them; returns how many the socket took.
    fn seal_and_send(&mut self) -> Result<usize> {
        let mut ctx = Ipv4Udp {
            src: *self.local.ip(),
            dst: *self.cfg.host.ip(),
            ip_id: 0,
            dont_fragment: true,
            src_port: self.local.port(),
            dst_port: self.cfg.host.port(),
        };
        if self.gso {
            crate::net::gso_runs(self.out.iter().map(Tx::len), &mut self.runs);
        } else {
            self.runs.clear();
            self.runs.extend((0..self.out.len()).map(|i| (i, 1)));
        }
        for &(first, count) in &self.runs {
            for k in 0..count {
                ctx.ip_id = k as u16;
                let template = self.template.as_mut();
                self.out[first + k].seal(&mut self.icrc, &ctx, &self.req, template);
            }
        }
        let pieces: Vec<[&[u8]; 3]> = self.out.iter().map(|t| t.pieces(&self.req)).collect();
        match self.io.send_segmented(self.cfg.host, &pieces, &self.runs) {
            Err(e) if e.kind() == ErrorKind::Unsupported => {
                log::warn!(
                    "FPGA emulator: {}; sending one packet per datagram from now on \
                     (these are lost and resent)",
                    e.message()
                );
                self.gso = false;
                Ok(0)
            }
            r => r,
        }
    }

    fn receive(&mut self, now: u64) -> Result<usize> {
        let mut handled = 0;
        loop {
            let n = self.io.recv_batch()?;
            if n == 0 {
                break;
            }
            for i in 0..n {
                let d = self.io.datagram(i);
                self.stats.packets_rx += 1;
                let ack = match Packet::parse(d.bytes()) {
                    Ok(p)
                        if *d.from.ip() == *self.cfg.host.ip()
                            && p.bth.opcode == Opcode::Acknowledge
                            && p.bth.dest_qp == self.cfg.qpn =>
                    {
                        (p.bth.psn, p.aeth.expect("Acknowledge has an AETH"))
                    }
                    _ => {
                        self.stats.rx_ignored += 1;
                        continue;
                    }
                };
                let f = self.cfg.faults;
                if self.rng.chance(f.drop) {
                    self.stats.dropped += 1;
                    continue;
                }
                let copies = if self.rng.chance(f.duplicate) {
                    self.stats.duplicated += 1;
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    if self.rx_held.is_none() && self.rng.chance(f.reorder) {
                        self.stats.reordered += 1;
                        self.rx_held = Some(ack);
                        continue;
                    }
                    self.req.on_ack(ack.0, ack.1, now);
                    if let Some((p, a)) = self.rx_held.take() {
                        self.req.on_ack(p, a, now);
                    }
                }
                handled += 1;
            }
            // A batch that was not full emptied the socket (a later ACK is
            // read by the next round): no extra syscall to learn that.
            if n < RX_BATCH {
                break;
            }
        }
        Ok(handled)
    }

    /// One round: transmit what the window allows, take in ACKs, fire timers;
    /// waits up to `max_wait` for an ACK when nothing could be done.
    pub fn pump(&mut self, max_wait: Duration) -> Result<()> {
        let now = self.now();
        let sent = self.transmit(now)?;
        let got = self.receive(now)?;
        self.req.on_timer(self.now());
        self.fail_if_fatal()?;
        if sent == 0 && got == 0 && !self.req.is_idle() {
            let mut wait = max_wait;
            if let Some(d) = self.req.next_deadline() {
                wait = wait.min(Duration::from_nanos(d.saturating_sub(self.now())));
            }
            if self.rx_held.is_some() {
                if let Some((p, a)) = self.rx_held.take() {
                    self.req.on_ack(p, a, self.now());
                }
                return Ok(());
            }
            if self.cfg.busy_wait {
                self.busy_poll(wait)?;
            } else {
                let ms = wait.as_millis().min(i32::MAX as u128) as i32;
                poll_readable([self.io.fd()], ms)?;
            }
        }
        Ok(())
    }

    /// Polls the socket without sleeping for up to `wait` (the caller has
    /// bounded it by the next timer), until an ACK is taken in.
    fn busy_poll(&mut self, wait: Duration) -> Result<()> {
        let end = Instant::now() + wait;
        let mut polls = 0;
        while self.receive(self.now())? == 0 && Instant::now() < end {
            relax(&mut polls);
        }
        Ok(())
    }

    /// Pumps until every submitted frame is acknowledged (or `timeout`).
    pub fn run_until_idle(&mut self, timeout: Duration) -> Result<()> {
        let end = Instant::now() + timeout;
        while !self.req.is_idle() {
            if Instant::now() >= end {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "FPGA emulator: {} frames still unacknowledged after {timeout:?}",
                        self.req.outstanding()
                    ),
                ));
            }
            self.pump(Duration::from_millis(10))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_retry_budget_spans_the_stall_at_the_timeout_and_never_shrinks() {
        let host = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 4791);
        let mut c = super::EmulatorConfig::new(host, host, 2, 0);
        c.timeout_code = 12; // 4.096 us << 12 = 16.777 ms
        c.retries_for_stall(std::time::Duration::from_secs(10));
        assert_eq!(c.retry_cnt, 597, "10 s / 16.777 ms, rounded up");
        c.retries_for_stall(std::time::Duration::from_millis(1));
        assert_eq!(c.retry_cnt, 597, "a shorter budget keeps the larger count");
        let mut never = super::EmulatorConfig::new(host, host, 2, 0);
        never.timeout_code = 0; // never times out: nothing to budget
        never.retries_for_stall(std::time::Duration::from_secs(10));
        assert_eq!(never.retry_cnt, 7);
    }

    use super::*;
    use std::net::{Ipv4Addr, UdpSocket};

    /// Busy-waiting, the window's packets leave one per datagram, and a host
    /// that never ACKs is polled for until the retransmit timer fires (not
    /// forever): then the window goes out again, one packet per datagram.
    #[test]
    fn busy_wait_sends_one_packet_per_datagram_and_polls_until_the_timer() {
        let host = UdpSocket::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(to) = host.local_addr().unwrap() else {
            unreachable!("bound to IPv4")
        };
        let mut cfg = EmulatorConfig::new(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), to, 1, 0);
        cfg.busy_wait = true;
        cfg.timeout_code = 8; // 1 ms
        let mut emu = FpgaEmulator::new(cfg).unwrap();
        for i in 0..6 {
            emu.submit(pattern::make(i, 4096), 0);
        }
        while emu.stats().requester.timeouts == 0 {
            emu.pump(Duration::from_millis(10)).unwrap();
        }
        emu.pump(Duration::ZERO).unwrap();
        let r = emu.stats().requester;
        assert_eq!((r.packets, r.retransmits), (4, 4), "the window of 4, twice");
        host.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut buf = [0u8; 65536];
        for i in 0..8u32 {
            let n = host.recv(&mut buf).unwrap();
            assert_eq!(
                n,
                Packet::wire_len(Opcode::SendOnlyImm, 4096),
                "datagram {i}"
            );
            let p = Packet::parse(&buf[..n]).unwrap();
            assert_eq!((p.bth.opcode, p.bth.psn), (Opcode::SendOnlyImm, i % 4));
        }
    }
}
