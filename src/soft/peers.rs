//! The FPGA addresses this process's soft servers receive from: one claim
//! ([`PeerEntry`]) per server, refused when it overlaps another server's on
//! the same local address (a shared port's packets are told apart by their
//! source only).

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// The FPGA addresses the servers of this process receive from, per local
/// address: the kernel steers a shared port's packets by their source
/// (`UdpIo::connect_peer`), so two servers whose FPGA addresses overlap
/// (one address, and the same port or either port 0) could not tell their
/// packets apart: the second is refused.
static PEERS: std::sync::Mutex<Vec<(SocketAddrV4, SocketAddrV4, u64)>> =
    std::sync::Mutex::new(Vec::new());

/// One server's claim on its FPGA's address; released on drop.
pub(super) struct PeerEntry(u64);

impl PeerEntry {
    pub(super) fn claim(local: SocketAddrV4, peer: SocketAddrV4) -> Result<PeerEntry> {
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
