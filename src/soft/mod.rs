//! The `soft` backend: a userspace RoCEv2 RC responder on a UDP socket. Runs
//! on any Linux host with no RDMA NIC, no kernel module and no privileges,
//! behind the same server core and C API as the verbs backend. Open it with
//! device name `"soft"` and a bind address / port in the device config.
//!
//! Receive path: before each recvmmsg batch the backend guesses where the
//! next packets belong (in sequence, shaped like the last message: the
//! current message's remaining packets, then one message per posted slot)
//! and scatters each datagram as headers -> staging, payload -> its slab
//! slot, pad/ICRC -> staging. So the payload takes one copy, the kernel's,
//! from the socket into the slot (counted `payload_direct`). Each packet is
//! then parsed, filtered (the configured FPGA address and our QPN; everything
//! else is a counted drop) and run through the [`responder::Responder`]; when
//! its real place differs from the guess (loss, duplicates, reordering, a new
//! frame size, no posted slot) the rest of the batch is gathered and copied
//! (counted `payload_copied`): a wrong guess costs a copy, never data. After
//! each batch the coalesced ACK (and any NAKs) go out with sendmmsg; their
//! ICRC is computed for IP ID 0 / DF (what Linux sends from this socket).
//! Received ICRCs cannot be checked from a UDP socket (no IP header): such
//! packets are counted as `icrc_unchecked`.

#[cfg(test)]
mod backend_tests;
pub mod bench;
pub mod emulator;
pub mod net;
pub mod pattern;
pub mod requester;
pub mod responder;
#[cfg(test)]
mod sim_tests;
pub mod wire;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::config::{ConnectParams, DeviceConfig, IcrcCheck, MAX_24BIT};
use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::server::{Backend, BackendInfo, Completion, CompletionKind, Counters, POLL_BATCH};
use crate::sys::{poll_readable, random_u32, Slab};
use net::{Landing, UdpIo};
use responder::{DropReason, Responder, ResponderConfig, Verdict};
use wire::icrc::{Ipv4Udp, HEADROOM};
use wire::{Aeth, Bth, Headers, Opcode, Packet};

/// True when this process may open the raw capture socket that checks
/// received ICRCs (CAP_NET_RAW in its network namespace).
pub fn raw_capture_allowed() -> bool {
    UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1)
        .and_then(|mut io| io.enable_raw_capture())
        .is_ok()
}

/// The soft "device": where to bind.
#[derive(Debug, Clone)]
pub struct SoftDevice {
    bind: SocketAddrV4,
    peer_udp_port: u16,
    icrc_check: IcrcCheck,
}

impl SoftDevice {
    /// Checks the bind address (a specific IPv4 address: it is the host GID
    /// and the source address the ACK ICRCs cover).
    pub fn open(cfg: &DeviceConfig) -> Result<SoftDevice> {
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
            "soft RoCEv2 backend: bind {ip}:{} (ACKs to FPGA port {})",
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
        })
    }
    /// Display name.
    pub fn name(&self) -> &str {
        "soft"
    }
}

struct Peer {
    ip: Ipv4Addr,
    qpn: u32,
}

/// The shape of the last complete message: how the next ones are guessed to
/// arrive, so their payloads can be received straight into their slots.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Packets per message.
    pkts: u32,
    /// Header bytes of its first packet (16: SEND_ONLY_WITH_IMMEDIATE, 12: SEND_FIRST).
    first_head: u32,
    /// Header bytes of its last packet.
    last_head: u32,
}

impl Default for Shape {
    /// One SEND_ONLY_WITH_IMMEDIATE per frame: what surf's engine sends up to the pmtu.
    fn default() -> Shape {
        Shape {
            pkts: 1,
            first_head: 16,
            last_head: 16,
        }
    }
}

pub(crate) struct SoftBackend {
    io: UdpIo,
    local: SocketAddrV4,
    peer_udp_port: u16,
    slab: Arc<Slab>,
    counters: Arc<Counters>,
    qpn: u32,
    rkey: u32,
    posted_before_connect: Vec<u32>,
    resp: Option<Responder>,
    peer: Option<Peer>,
    tx: Vec<(SocketAddrV4, Vec<u8>)>,
    // Zero-copy receive: the landing guess for the next batch, the last
    // message's shape and the current message's (packets so far, first head).
    plan: Vec<Landing>,
    shape: Shape,
    msg: (u32, u32),
    // Idle polls since the kernel's drop count was last read.
    idle_polls: u32,
}

impl SoftBackend {
    pub(crate) fn create(
        dev: &SoftDevice,
        slab: &Arc<Slab>,
        counters: &Arc<Counters>,
    ) -> Result<SoftBackend> {
        let mut io = UdpIo::bind(dev.bind, POLL_BATCH)?;
        let local = io.local_addr()?;
        match dev.icrc_check {
            IcrcCheck::Off => log::info!(
                "soft backend {local}: ICRC check off: received ICRCs are counted unchecked"
            ),
            IcrcCheck::Auto | IcrcCheck::Require => match io.enable_raw_capture() {
                Ok(ifname) => log::info!(
                    "soft backend {local}: raw capture on {ifname}: every received ICRC is checked"
                ),
                Err(e) if dev.icrc_check == IcrcCheck::Require => return Err(e),
                Err(e) => log::info!(
                    "soft backend {local}: received ICRCs are not checked (counted icrc_unchecked): {}",
                    e.message()
                ),
            },
        }
        Ok(SoftBackend {
            io,
            local,
            peer_udp_port: dev.peer_udp_port,
            slab: Arc::clone(slab),
            counters: Arc::clone(counters),
            qpn: 2 + random_u32() % (MAX_24BIT - 1),
            rkey: random_u32(),
            posted_before_connect: Vec::new(),
            resp: None,
            peer: None,
            tx: Vec::new(),
            plan: Vec::with_capacity(POLL_BATCH),
            shape: Shape::default(),
            msg: (0, 0),
            idle_polls: 0,
        })
    }
}

impl SoftBackend {
    fn read_kernel_drops(&mut self) {
        self.idle_polls = 0;
        let drops = self.io.kernel_drops();
        let before = self.counters.socket_drops.swap(drops, Ordering::Relaxed);
        if drops > before {
            log::debug!(
                "{} packets dropped by the kernel (socket buffer full): the receive thread fell behind",
                drops - before
            );
        }
    }
}

/// Guesses where the next batch's packets belong, assuming they arrive in
/// sequence and shaped like the last message: the current partial message's
/// remaining packets, then one message per posted slot. A wrong guess costs a
/// copy, never data: the receive path checks each packet's real place.
fn plan_landings(
    plan: &mut Vec<Landing>,
    resp: &Responder,
    shape: Shape,
    pkts_so_far: u32,
    slot_size: u32,
) {
    plan.clear();
    let pmtu = resp.pmtu();
    let mut free = resp.free_slots();
    let mut cur = resp.partial().map(|(slot, off)| (slot, off, pkts_so_far));
    while plan.len() < POLL_BATCH {
        let (slot, offset, idx) = match cur.or_else(|| free.next().map(|s| (s, 0, 0))) {
            Some(c) => c,
            None => break,
        };
        let last = idx + 1 >= shape.pkts;
        let head = if idx == 0 {
            shape.first_head
        } else if last {
            shape.last_head
        } else {
            wire::BTH_LEN as u32
        };
        let len = pmtu.min(slot_size.saturating_sub(offset));
        if len == 0 {
            break;
        }
        plan.push(Landing {
            head,
            slot,
            offset,
            len,
        });
        cur = (!last).then_some((slot, offset + pmtu, idx + 1));
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
        match &mut self.resp {
            Some(r) => slots.iter().for_each(|&s| r.post(s)),
            None => self.posted_before_connect.extend_from_slice(slots),
        }
        Ok(())
    }

    fn connect(&mut self, p: &ConnectParams, fpga_gid: Gid, _sq_psn: u32) -> Result<()> {
        let ip = fpga_gid.ipv4().ok_or_else(|| {
            Error::invalid(format!(
                "the soft backend needs an IPv4-mapped FPGA GID (::ffff:a.b.c.d); got {fpga_gid}"
            ))
        })?;
        let mut r = Responder::new(
            ResponderConfig {
                qpn: self.qpn,
                pmtu: p.pmtu.bytes(),
                slot_size: self.slab.slot_size(),
                min_rnr_timer: p.min_rnr_timer.code() as u8,
                ack_every: 8,
            },
            p.fpga_rq_psn,
        );
        for s in self.posted_before_connect.drain(..) {
            r.post(s);
        }
        if ip == *self.local.ip() && self.peer_udp_port == self.local.port() {
            // The FPGA's configured address is this very socket (e.g. the
            // defaults, port 4791 both ways, with an emulator on this host):
            // nothing else can listen there, so ACK each packet's source port.
            log::info!(
                "soft backend {}: the FPGA's address {ip}:{} is this socket: ACKs go to each                  packet's source port (peer_udp_port 0)",
                self.local,
                self.peer_udp_port
            );
            self.peer_udp_port = 0;
        }
        self.resp = Some(r);
        self.peer = Some(Peer {
            ip,
            qpn: p.fpga_qpn,
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
        let (Some(resp), Some(peer)) = (self.resp.as_mut(), self.peer.as_ref()) else {
            return Ok(());
        };
        plan_landings(
            &mut self.plan,
            resp,
            self.shape,
            self.msg.0,
            self.slab.slot_size(),
        );
        let n = self.io.recv_batch_into(Some(&self.slab), &self.plan)?;
        if n == 0 {
            // Idle: now and then, read what the kernel dropped meanwhile.
            self.idle_polls += 1;
            if self.idle_polls >= 64 {
                self.read_kernel_drops();
            }
            return Ok(());
        }
        let c = &*self.counters;
        let mut reply_port = None;
        // Set at the first packet that did not land where it belongs: from
        // there on the batch is gathered and copied (the slow path).
        let mut missed = false;
        for i in 0..n {
            c.packets_rx.fetch_add(1, Ordering::Relaxed);
            let (_, from, truncated) = self.io.datagram(i);
            if truncated {
                // Longer than MAX_DATAGRAM, or (raw capture) an IP/UDP header
                // that does not add up.
                c.malformed.fetch_add(1, Ordering::Relaxed);
                log::debug!(
                    "datagram from {from} truncated (> {} bytes) or with a bad IP/UDP header",
                    net::MAX_DATAGRAM
                );
                continue;
            }
            if *from.ip() != peer.ip {
                c.foreign_packets.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            // Fast path: the payload is already in its slot.
            let direct = match (self.io.landing(i), missed) {
                (Some(l), false) => {
                    let h = Headers::parse(self.io.datagram(i).0, self.io.len(i))
                        .ok()
                        .filter(|h| {
                            h.bth.opcode.is_send()
                                && h.len == l.head as usize
                                && h.payload_len <= l.len as usize
                        });
                    h.map(|h| (h, l))
                }
                _ => None,
            };
            let (bth, imm, payload_len, placed) = match direct {
                Some((h, l)) => {
                    if h.bth.opcode == Opcode::Acknowledge {
                        c.foreign_packets.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    (h.bth, h.imm, h.payload_len, Some(l))
                }
                None => {
                    if !missed && self.io.landing(i).is_some() {
                        // The guess was wrong (headers or size differ): read
                        // this and the rest of the batch the slow way, before
                        // any copy can overwrite where they landed.
                        missed = true;
                        for j in i..n {
                            self.io.gather(j, &self.slab)?;
                        }
                    }
                    let pkt = match Packet::parse(self.io.datagram(i).0) {
                        Ok(p) => p,
                        Err(e) => {
                            c.malformed.fetch_add(1, Ordering::Relaxed);
                            log::debug!("malformed packet from {from}: {e}");
                            continue;
                        }
                    };
                    if pkt.bth.opcode == Opcode::Acknowledge {
                        // We only respond; an Acknowledge is not for us.
                        c.foreign_packets.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    (pkt.bth, pkt.imm, pkt.payload.len(), None)
                }
            };
            match self.io.icrc_ok(i, &self.slab) {
                None => c.icrc_unchecked.fetch_add(1, Ordering::Relaxed),
                Some(true) => c.icrc_checked.fetch_add(1, Ordering::Relaxed),
                Some(false) => {
                    // Corrupted on the way: drop it; the requester resends
                    // (after our sequence NAK for the next one, or its timeout).
                    c.icrc_errors.fetch_add(1, Ordering::Relaxed);
                    log::debug!("bad ICRC on PSN {:#08x} from {from}: dropped", bth.psn);
                    continue;
                }
            };
            reply_port = Some(from.port());
            match resp.on_packet(&bth, imm, payload_len) {
                Verdict::Place { slot, offset, done } => {
                    let head = bth.opcode.header_len() as u32;
                    let in_place =
                        matches!(placed, Some(l) if l.slot == slot && l.offset == offset);
                    if in_place {
                        c.payload_direct.fetch_add(1, Ordering::Relaxed);
                    } else {
                        if !missed {
                            missed = true;
                            for j in i..n {
                                self.io.gather(j, &self.slab)?;
                            }
                        }
                        let pkt = Packet::parse(self.io.datagram(i).0).map_err(|e| {
                            Error::new(
                                crate::ErrorKind::Internal,
                                format!("gathered packet no longer parses: {e}"),
                            )
                        })?;
                        let payload = pkt.payload;
                        let at = offset as usize;
                        self.slab
                            .write_slot(slot, |b| {
                                b[at..at + payload.len()].copy_from_slice(payload)
                            })
                            .ok_or_else(|| {
                                Error::new(
                                    crate::ErrorKind::Internal,
                                    format!("responder placed into slot {slot}, which is on loan"),
                                )
                            })?;
                        c.payload_copied.fetch_add(1, Ordering::Relaxed);
                    }
                    // Learn the message shape for the next landing guesses.
                    self.msg = if offset == 0 {
                        (1, head)
                    } else {
                        (self.msg.0 + 1, self.msg.1)
                    };
                    if let Some(d) = done {
                        self.shape = Shape {
                            pkts: self.msg.0,
                            first_head: self.msg.1,
                            last_head: head,
                        };
                        self.msg = (0, 0);
                        let kind = match d.imm {
                            Some(imm) => CompletionKind::Recv { len: d.len, imm },
                            None => CompletionKind::Unexpected {
                                opcode: 0,
                                flags: 0,
                            },
                        };
                        out.push(Completion { slot: d.slot, kind });
                    }
                }
                Verdict::Drop(why) => {
                    if matches!(why, DropReason::InvalidOpcode | DropReason::BadLength) {
                        // A partial message was discarded with it.
                        self.msg = (0, 0);
                    }
                    let counter = match why {
                        DropReason::WrongQp => &c.foreign_packets,
                        DropReason::Duplicate => &c.duplicates,
                        DropReason::OutOfSequence => &c.out_of_sequence,
                        // Counted by the NAK they produce (rnr/invalid_naks_tx).
                        DropReason::NoSlot | DropReason::InvalidOpcode | DropReason::BadLength => {
                            continue
                        }
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // The input batch is done: owe no ACK across it.
        resp.flush();
        let port = match (self.peer_udp_port, reply_port) {
            (0, Some(p)) => p,
            (0, None) => return Ok(()),
            (p, _) => p,
        };
        let dst = SocketAddrV4::new(peer.ip, port);
        let ctx = Ipv4Udp {
            src: *self.local.ip(),
            dst: peer.ip,
            ip_id: 0,
            dont_fragment: true,
            src_port: self.local.port(),
            dst_port: port,
        };
        let mut used = 0;
        for r in resp.take_replies() {
            if used == self.tx.len() {
                self.tx.push((
                    dst,
                    vec![0u8; HEADROOM + Packet::wire_len(Opcode::Acknowledge, 0)],
                ));
            }
            let (to, buf) = &mut self.tx[used];
            *to = dst;
            let bth = Bth::new(Opcode::Acknowledge, peer.qpn, r.psn);
            let aeth = Aeth {
                syndrome: r.syndrome,
                msn: r.msn,
            };
            // Built behind HEADROOM bytes: the ICRC is one CRC pass.
            wire::emit(&bth, None, Some(aeth), &[], &mut buf[HEADROOM..]);
            ctx.seal_in_headroom(buf);
            let counter = match r.syndrome {
                wire::Syndrome::Ack(_) => &c.acks_tx,
                wire::Syndrome::RnrNak(_) => &c.rnr_naks_tx,
                wire::Syndrome::PsnSeqErr => &c.seq_naks_tx,
                _ => &c.invalid_naks_tx,
            };
            counter.fetch_add(1, Ordering::Relaxed);
            used += 1;
        }
        if used > 0 {
            let pkts: Vec<(SocketAddrV4, &[u8])> = self.tx[..used]
                .iter()
                .map(|(a, b)| (*a, &b[HEADROOM..]))
                .collect();
            let sent = self.io.send_batch(&pkts)?;
            c.packets_tx.fetch_add(sent as u64, Ordering::Relaxed);
            if sent < used {
                log::debug!(
                    "{} of {used} replies not sent (socket buffer full)",
                    used - sent
                );
            }
        }
        Ok(())
    }

    fn arm(&mut self) -> Result<()> {
        Ok(())
    }

    fn block(&mut self, wake_fd: RawFd) -> Result<()> {
        self.read_kernel_drops();
        // In raw capture mode the UDP socket still gets what enters through
        // another interface: wait on both.
        poll_readable(&[self.io.rx_fd(), self.io.fd(), wake_fd], -1).map(|_| ())
    }
}
