//! The `soft` backend: a userspace RoCEv2 RC responder on a UDP socket. Runs
//! on any Linux host with no RDMA NIC, no kernel module and no privileges,
//! behind the same server core and C API as the verbs backend. Open it with
//! device name `"soft"` and a bind address / port in the device config.
//!
//! Pure parts and a thin driver (the shape of quinn: protocol state machines
//! with no I/O, driven by a short loop):
//! - [`responder`]: the RC responder state machine (rxe_resp.c's stages),
//!   the only owner of the protocol counters;
//! - `landing`: the landing planner, which guesses where the next packets'
//!   payloads belong so the kernel writes them straight into their slots;
//! - this module, the driver: `Backend::poll` runs one receive batch
//!   through the pipeline: plan landings -> recvmmsg (`crate::net`) -> per
//!   datagram: filter and parse -> ICRC check -> responder -> place (direct,
//!   or copied when the guess missed) -> completions; then the coalesced
//!   ACK/NAKs go out with sendmmsg (their ICRC computed for IP ID 0 / DF,
//!   what Linux sends from this socket) and the counters are published.
//!
//! Received ICRCs are checked when the process may open a raw capture
//! (CAP_NET_RAW; `icrc_check` auto or require); otherwise packets are counted
//! `icrc_unchecked`. A wrong landing guess costs a copy (`payload_copied`),
//! never data.

#[cfg(test)]
mod backend_tests;
mod landing;
#[cfg(fuzzing)]
pub(crate) use landing::fuzz as landing_fuzz;
pub mod responder;
#[cfg(test)]
mod sim_tests;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::{ConnectParams, IcrcCheck, SoftConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::net::{self, Landing, UdpIo};
use crate::server::latency::{self, Histogram};
use crate::server::Slab;
use crate::server::{
    Backend, BackendCounters, BackendInfo, Completion, CompletionKind, SoftCounters, POLL_BATCH,
};
use crate::sys::{poll_readable, random_u32};
use crate::wire::icrc::{IcrcCache, Ipv4Udp};
use crate::wire::{Aeth, Bth, Headers, Opcode, Packet, MASK_24};
use landing::{Planner, Targets};
use responder::{DropReason, Responder, ResponderConfig, ResponderStats, Restart, Verdict};

/// AckReq packets (message ends) the responder ACKs at least every: surf's
/// engine keeps at most 4 messages un-ACKed, so the host ACKs every 4
/// messages and at the end of every receive batch.
pub(crate) const ACK_EVERY: u32 = 4;

/// How often a blocking receive thread reads the kernel's drop count.
const DROPS_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// True when this process may open the raw capture socket that checks
/// received ICRCs (CAP_NET_RAW in its network namespace).
pub fn raw_capture_allowed() -> bool {
    UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1)
        .and_then(|mut io| io.enable_raw_capture())
        .is_ok()
}

/// Checks that a soft server could bind `addr` now (shared, as servers do:
/// the port may already serve other FPGAs); the error names who holds the
/// port when it cannot be shared, and what to do.
pub fn check_bind(addr: SocketAddrV4) -> Result<()> {
    UdpIo::bind_shared(addr, 1).map(drop)
}

/// The soft "device": where to bind.
#[derive(Debug, Clone)]
pub struct SoftDevice {
    bind: SocketAddrV4,
    peer_udp_port: u16,
    icrc_check: IcrcCheck,
    busy_poll_us: u32,
}

impl SoftDevice {
    /// Checks the bind address (a specific IPv4 address: it is the host GID
    /// and the source address the ACK ICRCs cover).
    pub fn open(cfg: &SoftConfig) -> Result<SoftDevice> {
        let ip: Ipv4Addr = cfg.bind_addr.parse().map_err(|_| {
            Error::invalid(format!(
                "soft backend bind address {:?} is not an IPv4 address",
                cfg.bind_addr
            ))
        })?;
        if ip.is_unspecified() {
            return Err(Error::invalid(
                "soft backend needs a specific bind address (it is the host GID and the \
                 source address of the ACKs), not 0.0.0.0",
            ));
        }
        log::info!(
            "Opened RoCEv2 device 'soft' (userspace backend): bind {ip}:{} (ACKs to FPGA port {})",
            cfg.udp_port,
            match cfg.peer_udp_port {
                0 => "= each packet's source port".to_string(),
                p => p.to_string(),
            }
        );
        Ok(SoftDevice {
            bind: SocketAddrV4::new(ip, cfg.udp_port),
            peer_udp_port: cfg.peer_udp_port,
            icrc_check: cfg.icrc_check,
            busy_poll_us: cfg.busy_poll_us,
        })
    }
    /// Display name.
    pub fn name(&self) -> &str {
        "soft"
    }
}

/// The connected state: the responder and the FPGA it answers.
struct Link {
    resp: Responder,
    peer_ip: Ipv4Addr,
    peer_qpn: u32,
    /// With `peer_udp_port` 0: the FPGA's source port, learned from the
    /// last packet the responder took as this QP's stream (see
    /// [`steers_replies`]); replies go nowhere else, so packets it rejects
    /// or has seen (another QP's, stale, out of sequence, duplicates)
    /// cannot steer the ACKs.
    reply_port: Option<u16>,
    /// The port replies leave from (`UdpIo::tx_port`: the ICRC covers it).
    tx_port: u16,
    /// This server's entry among the process's servers on its address.
    _peer: PeerEntry,
}

/// True when the packet may set where ACKs go (`peer_udp_port` 0): the
/// responder took it as this QP's stream at its head: placed (it advanced
/// the stream), or in sequence and refused (an RNR or invalid-request NAK,
/// at the expected PSN). Not: another QP's, stale, ahead of the expected
/// PSN, or a duplicate (behind it: anyone who saw the stream can send one;
/// its re-ACK goes where the stream's ACKs go). The real FPGA's next
/// packet in sequence teaches the port again.
fn steers_replies(v: &Verdict) -> bool {
    !matches!(
        v,
        Verdict::Drop(
            DropReason::WrongQp
                | DropReason::Stale
                | DropReason::OutOfSequence
                | DropReason::Duplicate
        )
    )
}

/// The FPGA addresses the servers of this process receive from, per local
/// address: the kernel steers a shared port's packets by their source
/// (`UdpIo::connect_peer`), so two servers whose FPGA addresses overlap
/// (one address, and the same port or either port 0) could not tell their
/// packets apart: the second is refused.
static PEERS: std::sync::Mutex<Vec<(SocketAddrV4, SocketAddrV4, u64)>> =
    std::sync::Mutex::new(Vec::new());

/// One server's claim on its FPGA's address; released on drop.
struct PeerEntry(u64);

impl PeerEntry {
    fn claim(local: SocketAddrV4, peer: SocketAddrV4) -> Result<PeerEntry> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let mut all = PEERS.lock().unwrap_or_else(|e| e.into_inner());
        let overlaps = |p: &SocketAddrV4| {
            p.ip() == peer.ip() && (p.port() == 0 || peer.port() == 0 || p.port() == peer.port())
        };
        if let Some((_, other, _)) = all.iter().find(|(l, p, _)| *l == local && overlaps(p)) {
            let port = |p: &SocketAddrV4| match p.port() {
                0 => "any port".to_string(),
                n => format!("port {n}"),
            };
            return Err(Error::invalid(format!(
                "another server of this process on {local} already receives from FPGA {} ({}); \
                 this one would receive from {} ({}): the servers of one address and port are \
                 told apart by their FPGA's source address and port. Give each FPGA its own IP \
                 address, or give them fixed, different source ports (peer_udp_port, not 0)",
                other.ip(),
                port(other),
                peer.ip(),
                port(&peer)
            )));
        }
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        all.push((local, peer, id));
        Ok(PeerEntry(id))
    }
}

impl Drop for PeerEntry {
    fn drop(&mut self) {
        let mut all = PEERS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|e| e.2 != self.0);
    }
}

/// The driver's own counts (the responder keeps the protocol ones); both
/// are published to the shared [`SoftCounters`] after each batch.
#[derive(Debug, Default)]
struct DriverCounts {
    packets_rx: u64,
    packets_tx: u64,
    foreign: u64,
    malformed: u64,
    icrc_errors: u64,
    icrc_unchecked: u64,
    icrc_checked: u64,
    payload_direct: u64,
    payload_copied: u64,
}

/// One receive batch in progress.
struct Batch {
    /// Datagrams received.
    n: usize,
    /// Set at the first packet that did not land where it belongs: from
    /// there on the batch is gathered and copied (the slow path).
    missed: bool,
}

/// A parsed request packet and where its payload was scattered, if it was.
struct Request {
    bth: Bth,
    imm: Option<u32>,
    payload_len: usize,
    landed: Option<Landing>,
}

pub(crate) struct SoftBackend {
    io: UdpIo,
    local: SocketAddrV4,
    peer_udp_port: u16,
    slab: Arc<Slab>,
    counters: Arc<SoftCounters>,
    own: DriverCounts,
    qpn: u32,
    rkey: u32,
    posted_before_connect: Vec<u32>,
    /// The FPGA address the socket receives from (`expect_peer`, `connect`)
    /// and this server's claim on it among the process's servers.
    peer: Option<(SocketAddrV4, PeerEntry)>,
    link: Option<Link>,
    /// Reply packets (kept across batches).
    tx: Vec<Vec<u8>>,
    /// The replies' ICRC pseudo-header state (one peer, one ACK length: kept).
    icrc: IcrcCache,
    plan: Vec<Landing>,
    planner: Planner,
    /// Something the plan depends on changed (packets placed, slots
    /// posted): plan anew before the next receive, else keep the last plan.
    replan: bool,
    /// Idle polls since the kernel's drop count was last read, and when it
    /// was read (and packets received by then).
    idle_polls: u32,
    drops_read_at: (std::time::Instant, u64),
    /// Latency measured (`ServerConfig::measure_latency`): where the ACK
    /// turnaround goes, and the receive stamps of the packets that asked
    /// for an ACK not sent yet.
    turnaround: Option<Arc<Histogram>>,
    ack_due: Vec<u64>,
    /// Messages refused for being larger than a slot (max_payload): the
    /// first is a warning, the rest debug lines.
    too_large: u64,
}

impl SoftBackend {
    pub(crate) fn create(dev: &SoftDevice, slab: &Arc<Slab>) -> Result<SoftBackend> {
        let mut io = UdpIo::bind_shared(dev.bind, POLL_BATCH)?;
        let local = io.local_addr()?;
        let mut captured_lo = false;
        let captured = match dev.icrc_check {
            IcrcCheck::Off => {
                log::info!(
                    "soft backend {local}: ICRC check off: received ICRCs are counted unchecked"
                );
                false
            }
            IcrcCheck::Auto | IcrcCheck::Require => match io.enable_raw_capture() {
                Ok(ifname) => {
                    captured_lo = crate::net::capture::is_loopback(&ifname);
                    log::info!(
                        "soft backend {local}: raw capture on {ifname}: every received ICRC is \
                         checked (GSO super-packets split into their segments)"
                    );
                    true
                }
                Err(e) if dev.icrc_check == IcrcCheck::Require => return Err(e),
                Err(e) => {
                    log::info!(
                        "soft backend {local}: received ICRCs are not checked (counted \
                         icrc_unchecked): {}",
                        e.message()
                    );
                    false
                }
            },
        };
        // Merged datagrams from the UDP socket. Not with raw capture on a
        // NIC: its GRO would merge before the capture sees packets, so each
        // merged packet's own IP header (its ICRC covers the IP ID) would be
        // gone. On loopback nothing merges before the capture, and GRO only
        // spares the kernel segmenting a local sender's GSO datagram for a
        // UDP socket whose filter drops it (fewer skbs on the sender's CPU).
        if (!captured || captured_lo) && !io.enable_gro() {
            log::info!("soft backend {local}: UDP GRO unavailable: one packet per datagram");
        }
        if dev.busy_poll_us > 0 {
            set_busy_poll(&mut io, local, dev.busy_poll_us);
        }
        Ok(SoftBackend {
            io,
            local,
            peer_udp_port: dev.peer_udp_port,
            slab: Arc::clone(slab),
            counters: Arc::default(),
            own: DriverCounts::default(),
            qpn: 2 + random_u32() % (MASK_24 - 1),
            rkey: random_u32(),
            posted_before_connect: Vec::new(),
            peer: None,
            link: None,
            tx: Vec::new(),
            icrc: IcrcCache::default(),
            plan: Vec::with_capacity(net::MAX_SEGS.max(POLL_BATCH)),
            planner: Planner::default(),
            replan: true,
            idle_polls: 0,
            drops_read_at: (std::time::Instant::now(), 0),
            turnaround: None,
            ack_due: Vec::new(),
            too_large: 0,
        })
    }

    /// Receives from the FPGA at `ip` (its port: `peer_udp_port`, 0 = any)
    /// from now on: claims the address among this process's servers and
    /// connects the socket to it (`UdpIo::connect_peer`). Again for another
    /// address: the claim and the socket move to it.
    fn receive_from(&mut self, ip: Ipv4Addr) -> Result<()> {
        if ip == *self.local.ip() && self.peer_udp_port == self.local.port() {
            // The FPGA's configured address is this very socket (e.g. the
            // defaults, port 4791 both ways, with an emulator on this host):
            // nothing else can listen there, so ACK each packet's source port.
            log::info!(
                "soft backend {}: the FPGA's address {ip}:{} is this socket: ACKs go to each \
                 packet's source port (peer_udp_port 0)",
                self.local,
                self.peer_udp_port
            );
            self.peer_udp_port = 0;
        }
        let peer = SocketAddrV4::new(ip, self.peer_udp_port);
        if self.peer.as_ref().is_some_and(|(p, _)| *p == peer) {
            return Ok(());
        }
        // The old claim (another address) goes first: it may overlap.
        self.peer = None;
        let entry = PeerEntry::claim(self.local, peer)?;
        // Connected to the FPGA's address, any source port: peer_udp_port is
        // where ACKs go, not where requests come from (a RoCE NIC such as
        // rxe sends from a per-QP source port to 4791 and takes ACKs on 4791).
        self.io.connect_peer(SocketAddrV4::new(ip, 0))?;
        self.peer = Some((peer, entry));
        Ok(())
    }

    fn read_kernel_drops(&mut self) {
        self.idle_polls = 0;
        self.drops_read_at = (std::time::Instant::now(), self.own.packets_rx);
        let drops = self.io.kernel_drops();
        let before = self.counters.socket_drops.swap(drops, Ordering::Relaxed);
        if drops > before {
            log::debug!(
                "{} packets dropped by the kernel (socket buffer full): the receive thread fell behind",
                drops - before
            );
        }
    }

    /// One receive batch: plan, receive, each datagram through the
    /// pipeline, then replies and counters.
    fn poll_link(&mut self, link: &mut Link, out: &mut Vec<Completion>) -> Result<()> {
        let plan = if std::mem::take(&mut self.replan) {
            let r = &link.resp;
            let targets = Targets {
                partial: r.partial(),
                free: r.free_slots(),
                pmtu: r.pmtu(),
                slot_size: self.slab.slot_size(),
            };
            let max = self.io.plan_capacity();
            self.planner.plan(&mut self.plan, max, targets);
            Some(&self.plan[..])
        } else {
            None
        };
        let n = self.io.recv_batch_into(Some(&self.slab), plan)?;
        if n == 0 {
            // Idle: now and then, read what the kernel dropped meanwhile.
            self.idle_polls += 1;
            if self.idle_polls >= 64 {
                self.read_kernel_drops();
            }
            return Ok(());
        }
        self.replan = true;
        let mut batch = Batch { n, missed: false };
        for i in 0..n {
            self.receive(link, &mut batch, i, out)?;
        }
        // The input batch is done: owe no ACK across it.
        link.resp.flush();
        self.send_replies(link)?;
        self.publish(link.resp.stats());
        Ok(())
    }

    /// One datagram: filter and parse -> ICRC -> responder -> place.
    fn receive(
        &mut self,
        link: &mut Link,
        batch: &mut Batch,
        i: usize,
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        self.own.packets_rx += 1;
        let Some(req) = self.parse(link.peer_ip, batch, i)? else {
            return Ok(());
        };
        if !self.icrc_ok(i, req.bth.psn) {
            return Ok(());
        }
        // A payload that landed at the start of a posted slot stays there.
        let landed = req.landed.filter(|l| l.offset == 0).map(|l| l.slot);
        let verdict = link
            .resp
            .on_packet_in(&req.bth, req.imm, req.payload_len, landed);
        if steers_replies(&verdict) {
            link.reply_port = Some(self.io.datagram(i).1.port());
        }
        if let Some(r) = link.resp.take_restart() {
            // The open message (if any) was discarded with the old stream.
            self.planner.discard_message();
            log_restart(r, link.resp.stats().peer_restarts);
        }
        match verdict {
            Verdict::Place { slot, offset, done } => {
                if req.bth.ack_req && self.turnaround.is_some() {
                    self.ack_due.push(self.io.rx_stamp(i));
                }
                self.place(batch, i, req.landed, slot, offset)?;
                self.io.note_placed(i, offset > 0);
                let head = req.bth.opcode.header_len() as u32;
                let len = req.payload_len as u32;
                self.planner.learn(offset, head, len, done.is_some());
                if let Some(d) = done {
                    let kind = CompletionKind::Recv {
                        len: d.len,
                        imm: d.imm,
                    };
                    let rx_ns = self.io.rx_stamp(i);
                    out.push(Completion {
                        slot: d.slot,
                        kind,
                        rx_ns,
                    });
                }
            }
            Verdict::Drop(DropReason::TooLarge { bytes }) => {
                self.planner.discard_message();
                self.log_too_large(bytes, req.bth.psn);
            }
            // A partial message was discarded with it.
            Verdict::Drop(DropReason::InvalidOpcode | DropReason::BadLength) => {
                self.planner.discard_message()
            }
            // Counted by the responder.
            Verdict::Drop(_) => {}
        }
        Ok(())
    }

    /// A message larger than max_payload (the slot size) was refused with an
    /// invalid-request NAK, which ends an IBA requester's QP: the user must
    /// hear it where they look, with both sizes and what to do.
    fn log_too_large(&mut self, bytes: u32, psn: u32) {
        self.too_large += 1;
        let max = self.slab.slot_size();
        if self.too_large == 1 {
            log::warn!(
                "soft backend {}: a frame of at least {bytes} bytes (PSN {psn:#08x}) is larger \
                 than max_payload {max}: refused with an invalid-request NAK (counted in \
                 invalid_naks_tx), which is fatal to the FPGA's QP (it stops sending). Create \
                 the server with max_payload at least the FPGA's largest frame (rocev2 recv \
                 --max-payload), or have the FPGA send smaller frames",
                self.local
            );
        } else {
            log::debug!(
                "soft backend {}: another frame of at least {bytes} bytes > max_payload {max} \
                 refused (#{})",
                self.local,
                self.too_large
            );
        }
    }

    /// Filters datagram `i` (from the FPGA's address, parseable, a request)
    /// and reads its headers: in place when it landed as planned, else from
    /// the gathered datagram.
    fn parse(&mut self, peer_ip: Ipv4Addr, batch: &mut Batch, i: usize) -> Result<Option<Request>> {
        let (_, from, truncated) = self.io.datagram(i);
        if truncated {
            // Longer than MAX_DATAGRAM, or (raw capture) an IP/UDP header
            // that does not add up.
            self.own.malformed += 1;
            log::debug!(
                "datagram from {from} truncated (> {} bytes) or with a bad IP/UDP header",
                net::MAX_DATAGRAM
            );
            return Ok(None);
        }
        if *from.ip() != peer_ip {
            self.own.foreign += 1;
            return Ok(None);
        }
        if let (Some(l), false) = (self.io.landing(i), batch.missed) {
            let fits = Headers::parse(self.io.datagram(i).0, self.io.len(i))
                .ok()
                .filter(|h| {
                    h.bth.opcode.is_send()
                        && h.len == l.head as usize
                        && h.payload_len <= l.len as usize
                });
            if let Some(h) = fits {
                return Ok(Some(Request {
                    bth: h.bth,
                    imm: h.imm,
                    payload_len: h.payload_len,
                    landed: Some(l),
                }));
            }
        }
        if !batch.missed && self.io.scattered(i) {
            // The guess was wrong (place, headers or size differ).
            self.miss(batch, i)?;
        }
        match Packet::parse(self.io.datagram(i).0) {
            Err(e) => {
                self.own.malformed += 1;
                log::debug!("malformed packet from {from}: {e}");
                Ok(None)
            }
            // We only respond; an Acknowledge is not for us.
            Ok(p) if p.bth.opcode == Opcode::Acknowledge => {
                self.own.foreign += 1;
                Ok(None)
            }
            Ok(p) => Ok(Some(Request {
                bth: p.bth,
                imm: p.imm,
                payload_len: p.payload.len(),
                landed: None,
            })),
        }
    }

    /// A landing guess missed at datagram `i`: read it and the rest of the
    /// batch the slow way, before any copy can overwrite where they landed.
    fn miss(&mut self, batch: &mut Batch, i: usize) -> Result<()> {
        if batch.missed {
            return Ok(());
        }
        batch.missed = true;
        self.io.gather_rest(i, batch.n, &self.slab)
    }

    /// Raw capture: drops a packet whose ICRC is wrong (the requester
    /// resends it after our sequence NAK for the next one, or its timeout).
    fn icrc_ok(&mut self, i: usize, psn: u32) -> bool {
        match self.io.icrc_ok(i, &self.slab) {
            None => self.own.icrc_unchecked += 1,
            Some(true) => self.own.icrc_checked += 1,
            Some(false) => {
                self.own.icrc_errors += 1;
                let from = self.io.datagram(i).1;
                log::debug!("bad ICRC on PSN {psn:#08x} from {from}: dropped");
                return false;
            }
        }
        true
    }

    /// Puts datagram `i`'s payload at `offset` of `slot`, where the
    /// responder placed it: already there when it landed there, else copied.
    fn place(
        &mut self,
        batch: &mut Batch,
        i: usize,
        landed: Option<Landing>,
        slot: u32,
        offset: u32,
    ) -> Result<()> {
        if matches!(landed, Some(l) if l.slot == slot && l.offset == offset) {
            self.own.payload_direct += 1;
            return Ok(());
        }
        self.miss(batch, i)?;
        let internal = |what: String| Error::new(ErrorKind::Internal, what);
        let pkt = Packet::parse(self.io.datagram(i).0)
            .map_err(|e| internal(format!("gathered packet no longer parses: {e}")))?;
        let (at, payload) = (offset as usize, pkt.payload);
        self.slab
            .write_slot(slot, |b| b[at..at + payload.len()].copy_from_slice(payload))
            .ok_or_else(|| {
                internal(format!(
                    "responder placed into slot {slot}, which is on loan"
                ))
            })?;
        self.own.payload_copied += 1;
        Ok(())
    }

    /// Sends the responder's replies (to the configured FPGA port, or the
    /// port the FPGA's stream comes from).
    fn send_replies(&mut self, link: &mut Link) -> Result<()> {
        let port = match (self.peer_udp_port, link.reply_port) {
            (0, Some(p)) => p,
            (0, None) => {
                // Nothing from the FPGA's stream yet: nowhere to reply.
                self.ack_due.clear();
                let dropped = link.resp.take_replies().count();
                if dropped > 0 {
                    log::debug!("{dropped} replies dropped: no packet of the stream seen yet");
                }
                return Ok(());
            }
            (p, _) => p,
        };
        let ctx = Ipv4Udp {
            src: *self.local.ip(),
            dst: link.peer_ip,
            ip_id: 0,
            dont_fragment: true,
            src_port: link.tx_port,
            dst_port: port,
        };
        let mut used = 0;
        for r in link.resp.take_replies() {
            if used == self.tx.len() {
                self.tx.push(Vec::new());
            }
            let bth = Bth::new(Opcode::Acknowledge, link.peer_qpn, r.psn);
            let aeth = Aeth {
                syndrome: r.syndrome,
                msn: r.msn,
            };
            self.icrc
                .emit_sealed(&ctx, &bth, None, Some(aeth), &[], &mut self.tx[used]);
            used += 1;
        }
        let dst = SocketAddrV4::new(link.peer_ip, port);
        let sent = self.io.send_to(dst, &self.tx[..used])?;
        self.own.packets_tx += sent as u64;
        if let (Some(h), false) = (&self.turnaround, self.ack_due.is_empty()) {
            let now = latency::now_ns();
            for &rx_ns in &self.ack_due {
                h.since(rx_ns, now);
            }
            self.ack_due.clear();
        }
        if sent < used {
            log::debug!(
                "{} of {used} replies not sent (socket buffer full)",
                used - sent
            );
        }
        Ok(())
    }

    /// Publishes the driver's and the responder's counts.
    fn publish(&self, r: ResponderStats) {
        let (c, o) = (&*self.counters, &self.own);
        let all: [(&AtomicU64, u64); 17] = [
            (&c.packets_rx, o.packets_rx),
            (&c.packets_tx, o.packets_tx),
            (&c.acks_tx, r.acks),
            (&c.rnr_naks_tx, r.rnr_naks),
            (&c.seq_naks_tx, r.seq_naks),
            (&c.invalid_naks_tx, r.invalid_naks),
            (&c.duplicates, r.duplicates),
            (&c.out_of_sequence, r.out_of_sequence),
            (&c.foreign_packets, o.foreign + r.wrong_qp),
            (&c.malformed, o.malformed),
            (&c.icrc_errors, o.icrc_errors),
            (&c.icrc_unchecked, o.icrc_unchecked),
            (&c.icrc_checked, o.icrc_checked),
            (&c.payload_direct, o.payload_direct),
            (&c.payload_copied, o.payload_copied),
            (&c.stale_packets, r.stale),
            (&c.peer_restarts, r.peer_restarts),
        ];
        for (counter, value) in all {
            counter.store(value, Ordering::Relaxed);
        }
    }
}

/// Sets busy polling on the backend's socket; logs what the kernel refused,
/// once, with what it means.
fn set_busy_poll(io: &mut UdpIo, local: SocketAddrV4, us: u32) {
    let refused = io.set_busy_poll(us);
    if refused.is_empty() {
        log::info!("soft backend {local}: busy polling the NIC's queue up to {us} us (SO_BUSY_POLL, SO_PREFER_BUSY_POLL)");
        return;
    }
    for e in refused {
        log::warn!(
            "soft backend {local}: busy_poll_us {us}: the kernel refused {} (SO_BUSY_POLL \
             needs Linux >= 6.4 or CAP_NET_ADMIN; SO_PREFER_BUSY_POLL needs CAP_NET_ADMIN): \
             the socket is read without it",
            e.message()
        );
    }
}

/// A peer restart is rare and an operator must hear of it: one warning each.
fn log_restart(r: Restart, count: u64) {
    if r.resynced {
        log::warn!(
            "peer restart #{count}: the FPGA sent a new message at PSN {:#08x} (the \
             connection's first) where {:#08x} was expected ({} stale packets before it): it \
             was re-programmed or reset and started over with the same host params. \
             Re-synchronised to its new stream (MSN 0); frames it had sent before and not had \
             ACKed are gone with its old state. To start from a clean state instead, stop and \
             re-create the server and program the FPGA with the new host params",
            r.psn,
            r.expected_psn,
            r.stale_before
        );
    } else {
        log::warn!(
            "peer restart #{count} suspected: {} packets in a row far from the expected PSN \
             {:#08x} (the last at {:#08x}): the FPGA restarted at another PSN or was \
             programmed with a wrong one. Nothing is ACKed or delivered until it sends from \
             the connection's first PSN (the host SQ PSN): re-program it with the host params, \
             or stop and re-create the server",
            r.stale_before,
            r.expected_psn,
            r.psn
        );
    }
}

impl Backend for SoftBackend {
    fn info(&self) -> BackendInfo {
        BackendInfo {
            qpn: self.qpn,
            gid: Gid::from_ipv4(*self.local.ip()),
            rkey: self.rkey,
            udp_port: self.local.port(),
        }
    }

    fn post_recv(&mut self, slots: &[u32]) -> Result<()> {
        self.replan = true;
        match &mut self.link {
            Some(l) => slots.iter().for_each(|&s| l.resp.post(s)),
            None => self.posted_before_connect.extend_from_slice(slots),
        }
        Ok(())
    }

    fn expect_peer(&mut self, fpga_gid: Gid) -> Result<()> {
        // Not IPv4-mapped: `connect` says so.
        match fpga_gid.ipv4() {
            Some(ip) => self.receive_from(ip),
            None => Ok(()),
        }
    }

    fn connect(&mut self, p: &ConnectParams, fpga_gid: Gid, _sq_psn: u32) -> Result<()> {
        let ip = fpga_gid.ipv4().ok_or_else(|| {
            Error::invalid(format!(
                "the soft backend needs an IPv4-mapped FPGA GID (::ffff:a.b.c.d); got {fpga_gid}"
            ))
        })?;
        let mut resp = Responder::new(
            ResponderConfig {
                qpn: self.qpn,
                pmtu: p.pmtu.bytes(),
                slot_size: self.slab.slot_size(),
                min_rnr_timer: p.min_rnr_timer.code() as u8,
                ack_every: ACK_EVERY,
            },
            p.fpga_rq_psn,
        );
        for s in self.posted_before_connect.drain(..) {
            resp.post(s);
        }
        self.receive_from(ip)?;
        let Some((_, entry)) = self.peer.take() else {
            return Err(Error::new(
                ErrorKind::Internal,
                "no FPGA address after receive_from",
            ));
        };
        self.link = Some(Link {
            resp,
            peer_ip: ip,
            peer_qpn: p.fpga_qpn,
            reply_port: None,
            tx_port: self.io.tx_port()?,
            _peer: entry,
        });
        log::info!(
            "soft QP {:#08x} on {} -> RTS: accepting FPGA {ip} QP {:#08x} from PSN {:#08x}",
            self.qpn,
            self.local,
            p.fpga_qpn,
            p.fpga_rq_psn
        );
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
        // The link is taken out for the batch so its stages can borrow the
        // driver's other parts; it goes back whatever the result.
        let Some(mut link) = self.link.take() else {
            return Ok(());
        };
        let r = self.poll_link(&mut link, out);
        self.link = Some(link);
        r
    }

    fn arm(&mut self) -> Result<bool> {
        // block() polls the sockets: what is waiting wakes it at once.
        Ok(false)
    }

    fn block(&mut self, wake_fd: RawFd) -> Result<bool> {
        // The kernel's drop count: read at most every DROPS_EVERY of blocking
        // (a syscall a wake-up need not pay); a count owed from packets since
        // the last read is read when the link stays idle that long.
        let now = std::time::Instant::now();
        let owed = self.own.packets_rx != self.drops_read_at.1;
        if owed && now.duration_since(self.drops_read_at.0) >= DROPS_EVERY {
            self.read_kernel_drops();
        }
        let owed = self.own.packets_rx != self.drops_read_at.1;
        let timeout = if owed {
            DROPS_EVERY.as_millis() as i32
        } else {
            -1
        };
        // In raw capture mode the UDP socket still gets what enters through
        // another interface: wait on both.
        Ok(poll_readable([self.io.rx_fd(), self.io.fd(), wake_fd], timeout)?[2])
    }

    fn drained(&self) -> bool {
        self.io.drained()
    }

    fn queue_bytes(&self) -> Option<u64> {
        self.io.rx_buffer_bytes()
    }

    fn counters(&self) -> BackendCounters {
        BackendCounters::Soft(Arc::clone(&self.counters))
    }

    fn packets_seen(&self) -> u64 {
        self.own.packets_rx
    }

    fn stamp_receives(&mut self) -> Result<bool> {
        self.io.enable_rx_timestamps()?;
        Ok(true)
    }

    fn measure_latency(&mut self, turnaround: Arc<Histogram>) -> Result<()> {
        self.io.enable_rx_timestamps()?;
        self.ack_due.reserve(POLL_BATCH * 2);
        self.turnaround = Some(turnaround);
        log::info!(
            "soft backend {}: measuring latency (kernel receive stamps, SO_TIMESTAMPNS): ACK \
             turnaround and frame delivery",
            self.local
        );
        Ok(())
    }
}
