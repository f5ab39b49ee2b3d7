//! Sending the responder's replies: after each batch, the coalesced
//! ACK/NAKs sealed (their ICRC for IP ID 0 / DF, what Linux sends from the
//! reply socket) and sent with one sendmmsg to the FPGA's ACK port, and the
//! ACK turnaround measured from the receive stamps of what asked for them.

use std::net::SocketAddrV4;

use super::{Link, SoftBackend};
use crate::error::Result;
use crate::server::latency;
use crate::wire::icrc::Ipv4Udp;
use crate::wire::{Aeth, Bth, Opcode};

impl SoftBackend {
    /// Sends the responder's replies (to the configured FPGA port, or the
    /// port the FPGA's stream comes from).
    pub(super) fn send_replies(&mut self, link: &mut Link) -> Result<()> {
        let port = match (self.peer_udp_port, link.reply_port) {
            (0, Some(p)) => p,
            (0, None) => {
                // Nothing from the FPGA's stream yet: nowhere to reply.
                self.rx.ack_due.clear();
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
        self.rx.own.packets_tx += sent as u64;
        if let (Some(h), false) = (&self.rx.turnaround, self.rx.ack_due.is_empty()) {
            let now = latency::now_ns();
            for &rx_ns in &self.rx.ack_due {
                h.since(rx_ns, now);
            }
            self.rx.ack_due.clear();
        }
        if sent < used {
            log::debug!(
                "{} of {used} replies not sent (socket buffer full)",
                used - sent
            );
        }
        Ok(())
    }
}
