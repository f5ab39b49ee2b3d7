//! The send side of [`UdpIo`]: batched sendmmsg, and UDP GSO
//! (`UDP_SEGMENT`) runs of equal-size packets, each packet gathered from
//! its [`Pieces`] (headers, payload where it lies, trailer), from the reply
//! socket once a peer is connected.

use std::net::SocketAddrV4;

use super::{from_v4, iovec, UdpIo, MAX_SEGS};
use crate::error::{Error, Result};

/// A `UDP_SEGMENT` control message: cmsghdr (16 bytes) + the u16 segment
/// size, padded (CMSG_SPACE(2) = 24).
pub(super) type GsoCmsg = [u64; 3];

fn gso_cmsg(seg: u16) -> GsoCmsg {
    let mut c = [0u64; 3];
    // cmsg_len = CMSG_LEN(2) = 18; level SOL_UDP, type UDP_SEGMENT; data.
    c[0] = 18;
    c[1] = (libc::SOL_UDP as u32 as u64) | ((libc::UDP_SEGMENT as u32 as u64) << 32);
    c[2] = seg as u64;
    c
}

/// Groups packets of lengths `lens` (in order) into UDP GSO runs `(first,
/// count)`: equal lengths, the last may be shorter, at most [`MAX_SEGS`]
/// packets and 64 KiB each.
pub fn gso_runs(lens: impl Iterator<Item = usize>, runs: &mut Vec<(usize, usize)>) {
    runs.clear();
    let (mut seg, mut total, mut closed) = (0usize, 0usize, true);
    for (i, len) in lens.enumerate() {
        let joins = match runs.last() {
            Some(&(_, count)) => {
                !closed && len <= seg && count < MAX_SEGS && total + len <= 65507 - 8
            }
            None => false,
        };
        if joins {
            runs.last_mut().expect("a run").1 += 1;
            total += len;
            // A run ends after a shorter packet.
            closed = len < seg;
        } else {
            runs.push((i, 1));
            (seg, total, closed) = (len, len, false);
        }
    }
}

/// A packet to send, in up to three pieces the socket gathers (headers,
/// payload where it lies, trailer); empty pieces are skipped.
pub trait Pieces {
    /// The pieces, in order.
    fn pieces(&self) -> [&[u8]; 3];
}

impl Pieces for Vec<u8> {
    fn pieces(&self) -> [&[u8]; 3] {
        [self, &[], &[]]
    }
}

impl Pieces for [&[u8]; 3] {
    fn pieces(&self) -> [&[u8]; 3] {
        *self
    }
}

impl UdpIo {
    #[cfg(test)]
    /// Sends datagrams (`(destination, bytes)`), as [`send_to`](Self::send_to).
    pub fn send_batch(&mut self, pkts: &[(SocketAddrV4, &[u8])]) -> Result<usize> {
        self.send_iter(pkts.iter().copied())
    }

    /// Sends `bufs`, one datagram each, to `dst` with as few sendmmsg calls
    /// as possible; returns how many the kernel took (a full send buffer or
    /// an ICMP error drops the rest, as the network may).
    pub fn send_to(&mut self, dst: SocketAddrV4, bufs: &[Vec<u8>]) -> Result<usize> {
        self.send_iter(bufs.iter().map(|b| (dst, &b[..])))
    }

    /// Sends `pkts` (each gathered from its [`Pieces`]) to `dst` with UDP
    /// GSO: each run `(first,
    /// count)` (from [`gso_runs`]) as one datagram the kernel segments into
    /// `count` packets of the first one's length (`UDP_SEGMENT`), so a batch
    /// of packets costs one pass through the stack. Segment `k` of a run
    /// leaves with IP ID `k` (Linux numbers the segments of a DF datagram
    /// from an unconnected socket 0, 1, 2, ...): seal its ICRC for that.
    /// Returns how many packets the kernel took; an error of kind
    /// `Unsupported` when the route cannot segment (no checksum offload, a
    /// segment above its MTU): send one packet per datagram instead.
    pub fn send_segmented<P: Pieces>(
        &mut self,
        dst: SocketAddrV4,
        pkts: &[P],
        runs: &[(usize, usize)],
    ) -> Result<usize> {
        let n = runs.len();
        if n == 0 {
            return Ok(0);
        }
        self.tx_names.clear();
        self.tx_iovs.clear();
        self.tx_ctrl.clear();
        let iovs_of = |first: usize, count: usize| -> usize {
            pkts[first..first + count]
                .iter()
                .map(|p| p.pieces().iter().filter(|p| !p.is_empty()).count())
                .sum()
        };
        for &(first, count) in runs {
            self.tx_names.push(from_v4(&dst));
            let seg: usize = pkts[first].pieces().iter().map(|p| p.len()).sum();
            self.tx_ctrl.push(gso_cmsg(seg as u16));
            for p in &pkts[first..first + count] {
                for piece in p.pieces().iter().filter(|p| !p.is_empty()) {
                    self.tx_iovs
                        .push(iovec(piece.as_ptr() as *mut u8, piece.len()));
                }
            }
        }
        // SAFETY: plain-data struct; zeroed is a valid initial value.
        self.tx_msgs
            .resize_with(n, || unsafe { std::mem::zeroed() });
        let mut at = 0;
        for (i, &(first, count)) in runs.iter().enumerate() {
            let iovs = iovs_of(first, count);
            let m = &mut self.tx_msgs[i].msg_hdr;
            m.msg_name = &mut self.tx_names[i] as *mut _ as *mut libc::c_void;
            m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            m.msg_iov = self.tx_iovs[at..].as_mut_ptr();
            m.msg_iovlen = iovs;
            // One packet needs no segmentation.
            if count > 1 {
                m.msg_control = self.tx_ctrl[i].as_mut_ptr() as *mut libc::c_void;
                m.msg_controllen = std::mem::size_of::<GsoCmsg>();
            } else {
                m.msg_control = std::ptr::null_mut();
                m.msg_controllen = 0;
            }
            m.msg_flags = 0;
            at += iovs;
        }
        let gso = runs.iter().any(|r| r.1 > 1).then_some(dst);
        let sent = self.send_prepared(n, gso)?;
        Ok(runs[..sent].iter().map(|r| r.1).sum())
    }

    fn send_iter<'a>(
        &mut self,
        pkts: impl ExactSizeIterator<Item = (SocketAddrV4, &'a [u8])>,
    ) -> Result<usize> {
        let n = pkts.len();
        if n == 0 {
            return Ok(0);
        }
        self.tx_names.clear();
        self.tx_iovs.clear();
        for (a, b) in pkts {
            self.tx_names.push(from_v4(&a));
            self.tx_iovs.push(iovec(b.as_ptr() as *mut u8, b.len()));
        }
        // SAFETY: plain-data struct; zeroed is a valid initial value.
        self.tx_msgs
            .resize_with(n, || unsafe { std::mem::zeroed() });
        for ((m, name), iov) in self
            .tx_msgs
            .iter_mut()
            .zip(self.tx_names.iter_mut())
            .zip(self.tx_iovs.iter_mut())
        {
            m.msg_hdr.msg_name = name as *mut _ as *mut libc::c_void;
            m.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        self.send_prepared(n, None)
    }

    /// Sends the first `n` messages prepared in `tx_msgs` with as few
    /// sendmmsg calls as possible; returns how many the kernel took (a full
    /// send buffer or an ICMP error drops the rest, as the network may).
    /// With `gso` (their destination), a refusal to segment is an error of
    /// kind `Unsupported`.
    fn send_prepared(&mut self, n: usize, gso: Option<SocketAddrV4>) -> Result<usize> {
        let mut sent = 0;
        while sent < n {
            // SAFETY: the arrays hold n entries, valid from `sent`; their
            // iovecs point into the caller's byte slices, only read, which
            // outlive this call; names and control buffers are ours.
            let k = unsafe {
                libc::sendmmsg(
                    self.tx_fd(),
                    self.tx_msgs.as_mut_ptr().add(sent),
                    (n - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if k < 0 {
                let e = std::io::Error::last_os_error();
                match (e.kind(), e.raw_os_error(), gso) {
                    (std::io::ErrorKind::Interrupted, ..) => continue,
                    (
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::ConnectionRefused,
                        ..,
                    ) => break,
                    (
                        _,
                        Some(libc::EINVAL | libc::EIO | libc::ENOPROTOOPT | libc::EMSGSIZE),
                        Some(dst),
                    ) => {
                        return Err(Error::new(
                            crate::error::ErrorKind::Unsupported,
                            format!("UDP GSO send to {dst} refused ({e})"),
                        ))
                    }
                    _ => return Err(Error::io("sendmmsg", e)),
                }
            }
            sent += k as usize;
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn gso_runs_group_equal_lengths_and_end_after_a_shorter_one() {
        let mut runs = Vec::new();
        gso_runs(
            [100, 100, 100, 60, 100, 100, 120, 120].into_iter(),
            &mut runs,
        );
        assert_eq!(runs, vec![(0, 4), (4, 2), (6, 2)]);
        gso_runs(std::iter::repeat_n(1000, 70), &mut runs);
        assert_eq!(runs, vec![(0, MAX_SEGS), (MAX_SEGS, 6)]);
        gso_runs([100, 50, 50].into_iter(), &mut runs);
        assert_eq!(runs, vec![(0, 2), (2, 1)]);
        gso_runs(std::iter::repeat_n(4116, 20), &mut runs);
        assert_eq!(runs, vec![(0, 15), (15, 5)], "64 KiB at most");
        gso_runs(std::iter::empty(), &mut runs);
        assert!(runs.is_empty());
    }

    #[test]
    fn segmented_sends_arrive_as_their_packets() {
        let lo = Ipv4Addr::LOCALHOST;
        let mut a = UdpIo::bind(SocketAddrV4::new(lo, 0), 8).unwrap();
        let mut b = UdpIo::bind(SocketAddrV4::new(lo, 0), 8).unwrap();
        let to = a.local_addr().unwrap();
        let bufs: Vec<Vec<u8>> = (0..7u8)
            .map(|i| vec![i; if i == 4 { 50 } else { 300 }])
            .collect();
        let mut runs = Vec::new();
        gso_runs(bufs.iter().map(|b| b.len()), &mut runs);
        assert_eq!(runs, vec![(0, 5), (5, 2)]);
        assert_eq!(b.send_segmented(to, &bufs, &runs).unwrap(), 7);
        let mut got = Vec::new();
        for _ in 0..1000 {
            let n = a.recv_batch().unwrap();
            (0..n).for_each(|i| got.push(a.datagram(i).bytes().to_vec()));
            if got.len() == 7 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            got, bufs,
            "without UDP_GRO the kernel hands each segment over"
        );
    }
}
