//! One received packet as a value: [`Datagram`] is everything the receive
//! side knows of one packet (segment) of the last batch — sender, kernel
//! receive stamp, where its bytes are (whole, landed in a slab slot, or in
//! pieces), its ICRC context — read out of [`UdpIo`] in one call, so a
//! consumer takes the packet as it is instead of reaching back by index
//! (the shape of quinn, whose driver hands its connection each datagram).

use std::net::SocketAddrV4;

use super::{Landing, UdpIo};
use crate::server::Slab;
use crate::wire::icrc::{IcrcCache, Ipv4Udp};

/// Where a received packet's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body<'a> {
    /// Whole, in its staging buffer (received unplanned, or gathered).
    Whole(&'a [u8]),
    /// Landed as planned: its headers in `head` (a short packet: all of
    /// it), its payload in the slab where `landing` says, the bytes after
    /// it (pad, ICRC) in `tail`.
    Landed {
        /// Its first bytes: the RoCE headers.
        head: &'a [u8],
        /// Where its payload went.
        landing: Landing,
        /// What followed its slot part.
        tail: &'a [u8],
    },
    /// In pieces, not where the plan put a packet: unreadable until its
    /// datagram is gathered ([`UdpIo::gather_rest`]).
    Scattered,
}

/// One received packet (a segment of a datagram) of the last batch, as
/// [`UdpIo::datagram`] reads it. Borrows the receive buffers until the
/// next receive or gather.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    /// Its sender (raw capture: from its IP header).
    pub from: SocketAddrV4,
    /// Unusable: longer than the largest packet, or (raw capture) an IP/UDP
    /// header that does not add up.
    pub truncated: bool,
    /// The kernel's receive stamp, CLOCK_REALTIME ns (its datagram's:
    /// merged segments share it); 0 when not asked for.
    pub rx_ns: u64,
    /// Its length on the wire (UDP payload).
    pub len: usize,
    /// Where its bytes are.
    pub body: Body<'a>,
    /// It is the first segment of a merged datagram: where it falls in a
    /// message tells where merged datagrams begin
    /// ([`UdpIo::note_merge_start`]).
    pub starts_merge: bool,
    /// Raw capture: its ICRC context (its segment's IP ID); None when its
    /// ICRC cannot be checked.
    pub(super) icrc: Option<Ipv4Udp>,
}

impl<'a> Datagram<'a> {
    /// Its bytes as far as they lie in one piece: the whole packet, a
    /// landed packet's headers, or nothing (in pieces).
    pub fn bytes(&self) -> &'a [u8] {
        match self.body {
            Body::Whole(b) => b,
            Body::Landed { head, .. } => head,
            Body::Scattered => &[],
        }
    }

    /// Raw capture: whether its ICRC is right (`None` when it cannot be
    /// checked: not captured). Reads a landed payload where it is in the
    /// slab; a packet in pieces is wrong (gather it first).
    pub(crate) fn icrc_ok(&self, cache: &mut IcrcCache, slab: &Slab) -> Option<bool> {
        let ctx = self.icrc?;
        Some(match self.body {
            Body::Whole(b) => cache.verify_parts(&ctx, &[b]),
            Body::Landed {
                head,
                landing,
                tail,
            } => {
                let body = self.len - head.len() - tail.len();
                let Some(at) = slab.receive_region(landing.slot, landing.offset, body as u32)
                else {
                    return Some(false);
                };
                // SAFETY: receive_region vouched for `body` receiver-owned
                // bytes that the last recvmmsg wrote; nothing writes them
                // while this slice lives (it ends with this call).
                let part = unsafe { std::slice::from_raw_parts(at.as_ptr(), body) };
                cache.verify_parts(&ctx, &[head, part, tail])
            }
            Body::Scattered => false,
        })
    }
}

impl UdpIo {
    /// Packet `i` of the last batch, read once.
    pub fn datagram(&self, i: usize) -> Datagram<'_> {
        let s = self.segs[i];
        self.rx[s.msg as usize].datagram(s)
    }

    /// The receiver placed a packet that began a merged datagram as a
    /// message start (`mid` false) or further in a message: entries are
    /// planned to begin there from the next receive on (the batch's last
    /// such packet decides).
    pub(crate) fn note_merge_start(&mut self, mid: bool) {
        self.split_mid = mid;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    /// Receives what `b` sent to `a`, with `plan` (bounded wait).
    fn receive(a: &mut UdpIo, slab: &Slab, plan: &[Landing]) -> usize {
        for _ in 0..10_000 {
            let n = a.recv_batch_into(Some(slab), Some(plan)).unwrap();
            if n > 0 {
                return n;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("the datagram never came");
    }

    #[test]
    fn one_read_gives_a_packets_sender_stamp_and_bytes_landed_copied_or_scattered() {
        let lo = Ipv4Addr::LOCALHOST;
        let mut a = UdpIo::bind(SocketAddrV4::new(lo, 0), 4).unwrap();
        let mut b = UdpIo::bind(SocketAddrV4::new(lo, 0), 4).unwrap();
        a.enable_rx_timestamps().unwrap();
        let (to, sender) = (a.local_addr().unwrap(), b.local_addr().unwrap());
        let slab = Slab::new(4096, 4).unwrap();
        // 12 header bytes, 100 payload bytes, a 4-byte "ICRC".
        let pkt: Vec<u8> = (0..116u32).map(|i| (i * 7 + 1) as u8).collect();
        let l = Landing {
            head: 12,
            slot: 1,
            offset: 64,
            len: 256,
            expect: 100,
        };
        let before = crate::server::latency::now_ns();

        // Landed as planned: headers in staging, the rest in the slot.
        b.send_to(to, std::slice::from_ref(&pkt)).unwrap();
        assert_eq!(receive(&mut a, &slab, &[l]), 1);
        let d = a.datagram(0);
        assert_eq!((d.from, d.truncated, d.len), (sender, false, 116));
        assert!(before <= d.rx_ns && d.rx_ns <= crate::server::latency::now_ns());
        assert!(!d.starts_merge);
        assert_eq!(d.icrc, None, "not captured: unchecked");
        let want = Body::Landed {
            head: &pkt[..12],
            // The entry's last landing takes up to its slot room: the
            // "ICRC" lands in the slot too, nothing is left for the tail.
            landing: l,
            tail: &[],
        };
        assert_eq!(d.body, want);
        assert_eq!(d.bytes(), &pkt[..12]);
        let in_slot = slab.write_slot(1, |s| s[64..64 + 104].to_vec()).unwrap();
        assert_eq!(in_slot, &pkt[12..]);
        let stamp = d.rx_ns;
        // Gathered: whole, the same packet and stamp.
        a.gather_rest(0, 1, &slab).unwrap();
        let g = a.datagram(0);
        assert_eq!(g.body, Body::Whole(&pkt));
        assert_eq!((g.from, g.len, g.rx_ns), (sender, 116, stamp));

        // Shorter than its planned headers: in pieces until gathered.
        b.send_to(to, &[pkt[..8].to_vec()]).unwrap();
        assert_eq!(receive(&mut a, &slab, &[l]), 1);
        let d = a.datagram(0);
        assert_eq!((d.body, d.bytes(), d.len), (Body::Scattered, &[][..], 8));
        a.gather_rest(0, 1, &slab).unwrap();
        assert_eq!(a.datagram(0).body, Body::Whole(&pkt[..8]));

        // Unplanned: whole in staging.
        b.send_to(to, std::slice::from_ref(&pkt)).unwrap();
        assert_eq!(receive(&mut a, &slab, &[]), 1);
        let d = a.datagram(0);
        assert_eq!((d.body, d.from, d.len), (Body::Whole(&pkt), sender, 116));
        assert!(d.rx_ns >= stamp);
    }
}
