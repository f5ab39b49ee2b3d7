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
//!   packet, `receive`: one `net::Datagram` read once -> filter and parse ->
//!   ICRC check -> responder -> place (direct, or copied when the guess
//!   missed) -> completions; then `replies`: the coalesced ACK/NAKs go out
//!   with sendmmsg (their ICRC computed for IP ID 0 / DF, what Linux sends
//!   from this socket), and `counts`: the counters are published;
//! - `peers`: the FPGA addresses this process's servers claim.
//!
//! Received ICRCs are checked when the process may open a raw capture
//! (CAP_NET_RAW; `icrc_check` auto or require); otherwise packets are counted
//! `icrc_unchecked`. A wrong landing guess costs a copy (`payload_copied`),
//! never data.

#[cfg(test)]
mod backend_tests;
mod counts;
mod landing;
#[cfg(fuzzing)]
pub(crate) use landing::fuzz as landing_fuzz;
mod peers;
mod receive;
mod replies;
pub mod responder;
#[cfg(test)]
mod sim_tests;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::config::{ConnectParams, IcrcCheck, SoftConfig};
use crate::error::{Error, ErrorKind, Result};
use crate::gid::Gid;
use crate::net::{self, Landing, UdpIo};
use crate::server::latency::Histogram;
use crate::server::Slab;
use crate::server::{Backend, BackendCounters, BackendInfo, Completion, SoftCounters, POLL_BATCH};
use crate::sys::{poll_readable, random_u32};
use crate::wire::icrc::IcrcCache;
use crate::wire::MASK_24;
use landing::Targets;
use peers::PeerEntry;
use receive::{Batch, Pipeline};
use responder::{Responder, ResponderConfig};

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
    /// `receive::steers_replies`); replies go nowhere else, so packets it rejects
    /// or has seen (another QP's, stale, out of sequence, duplicates)
    /// cannot steer the ACKs.
    reply_port: Option<u16>,
    /// The port replies leave from (`UdpIo::tx_port`: the ICRC covers it).
    tx_port: u16,
    /// This server's entry among the process's servers on its address.
    _peer: PeerEntry,
}

pub(crate) struct SoftBackend {
    io: UdpIo,
    local: SocketAddrV4,
    peer_udp_port: u16,
    counters: Arc<SoftCounters>,
    /// The per-packet pipeline's state.
    rx: Pipeline,
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
    /// Something the plan depends on changed (packets placed, slots
    /// posted): plan anew before the next receive, else keep the last plan.
    replan: bool,
    /// Idle polls since the kernel's drop count was last read, and when it
    /// was read (and packets received by then).
    idle_polls: u32,
    drops_read_at: (std::time::Instant, u64),
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
            counters: Arc::default(),
            rx: Pipeline::new(slab, local),
            qpn: 2 + random_u32() % (MASK_24 - 1),
            rkey: random_u32(),
            posted_before_connect: Vec::new(),
            peer: None,
            link: None,
            tx: Vec::new(),
            icrc: IcrcCache::default(),
            plan: Vec::with_capacity(net::MAX_SEGS.max(POLL_BATCH)),
            replan: true,
            idle_polls: 0,
            drops_read_at: (std::time::Instant::now(), 0),
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

    /// One receive batch: plan, receive, each datagram through the
    /// pipeline, then replies and counters.
    fn poll_link(&mut self, link: &mut Link, out: &mut Vec<Completion>) -> Result<()> {
        let plan = if std::mem::take(&mut self.replan) {
            let r = &link.resp;
            let targets = Targets {
                partial: r.partial(),
                free: r.free_slots(),
                pmtu: r.pmtu(),
                slot_size: self.rx.slab.slot_size(),
            };
            let max = self.io.plan_capacity();
            self.rx.planner.plan(&mut self.plan, max, targets);
            Some(&self.plan[..])
        } else {
            None
        };
        let n = self.io.recv_batch_into(Some(&self.rx.slab), plan)?;
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
        if let Some(mid) = self.rx.merge_start.take() {
            self.io.note_merge_start(mid);
        }
        // The input batch is done: owe no ACK across it.
        link.resp.flush();
        self.send_replies(link)?;
        self.rx.own.publish(&self.counters, link.resp.stats());
        Ok(())
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
                slot_size: self.rx.slab.slot_size(),
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
        let owed = self.rx.own.packets_rx != self.drops_read_at.1;
        if owed && now.duration_since(self.drops_read_at.0) >= DROPS_EVERY {
            self.read_kernel_drops();
        }
        let owed = self.rx.own.packets_rx != self.drops_read_at.1;
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
        self.rx.own.packets_rx
    }

    fn stamp_receives(&mut self) -> Result<bool> {
        self.io.enable_rx_timestamps()?;
        Ok(true)
    }

    fn measure_latency(&mut self, turnaround: Arc<Histogram>) -> Result<()> {
        self.io.enable_rx_timestamps()?;
        self.rx.ack_due.reserve(POLL_BATCH * 2);
        self.rx.turnaround = Some(turnaround);
        log::info!(
            "soft backend {}: measuring latency (kernel receive stamps, SO_TIMESTAMPNS): ACK \
             turnaround and frame delivery",
            self.local
        );
        Ok(())
    }
}
