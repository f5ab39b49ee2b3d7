//! UDP socket I/O for the soft backend and the FPGA emulator: batched receive
//! and send (recvmmsg / sendmmsg), non-blocking, with `IP_PMTUDISC_DO` so that
//! Linux sends our datagrams from the unconnected socket with DF set and IP ID
//! 0, which makes the ICRC of what we send computable without seeing the IP
//! header.
//!
//! ICRC of *received* packets: a UDP socket does not expose the sender's IP
//! header (the IP ID is covered by the ICRC), so packets read here are counted
//! as `icrc_unchecked`. The kernel still verifies the UDP checksum when the
//! sender set one.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use crate::error::{Error, Result};
use crate::sys::Slab;

/// Largest datagram handled: 4096-byte payload + BTH + ImmDt + pad + ICRC, rounded up.
pub const MAX_DATAGRAM: usize = 4096 + 64;

/// Where one datagram of a batch should land (the soft backend's zero-copy
/// receive): its first `head` bytes (the RoCE headers) in the datagram's
/// staging buffer, the next `len` bytes straight into the slab at `offset` of
/// `slot`, anything beyond that (pad, ICRC) back in the staging buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landing {
    /// Header bytes kept in the staging buffer.
    pub head: u32,
    /// Receiver-owned slab slot.
    pub slot: u32,
    /// Byte offset in the slot.
    pub offset: u32,
    /// Bytes that go to the slot.
    pub len: u32,
}

/// A bound, non-blocking UDP socket with receive buffers for a batch.
pub struct UdpIo {
    sock: UdpSocket,
    // Per datagram: a staging buffer of 2 * MAX_DATAGRAM bytes; a scattered
    // datagram's spill (what follows its slab part) lands at MAX_DATAGRAM.
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    addrs: Vec<SocketAddrV4>,
    truncated: Vec<bool>,
    landing: Vec<Option<Landing>>,
    // recvmmsg scratch, kept so the receive path (polled in a spin loop) does
    // not allocate; the pointers inside are rewritten before every call.
    names: Vec<libc::sockaddr_in>,
    iovs: Vec<[libc::iovec; 3]>,
    msgs: Vec<libc::mmsghdr>,
}

// SAFETY: the raw pointers in the recvmmsg scratch only ever point into this
// struct's own heap buffers and are rewritten before each use; nothing is
// shared between threads.
unsafe impl Send for UdpIo {}

fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32, what: &str) -> Result<()> {
    // SAFETY: passes a valid i32 and its size to setsockopt on our own socket.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Error::io(what, std::io::Error::last_os_error()));
    }
    Ok(())
}

fn to_v4(sa: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    )
}

fn from_v4(a: &SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

impl UdpIo {
    /// Binds `addr` (port 0 picks a free port), with room for `batch` datagrams.
    pub fn bind(addr: SocketAddrV4, batch: usize) -> Result<UdpIo> {
        let sock = UdpSocket::bind(addr).map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::AddrInUse {
                " — another process (a rocev2 server, rdma_rxe) holds it: pick another udp_port \
                 (0 = any free port) or bind another address"
            } else if e.kind() == std::io::ErrorKind::AddrNotAvailable {
                " — the address is not configured on this host"
            } else {
                ""
            };
            Error::io(&format!("binding UDP {addr}{hint}"), e)
        })?;
        sock.set_nonblocking(true)
            .map_err(|e| Error::io("setting the socket non-blocking", e))?;
        let fd = sock.as_raw_fd();
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
            "setsockopt(IP_MTU_DISCOVER)",
        )?;
        // Large buffers absorb a 16-deep window of 4 KiB packets and bursts;
        // the kernel caps them at net.core.{r,w}mem_max (best effort).
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20, "SO_RCVBUF");
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20, "SO_SNDBUF");
        let batch = batch.max(1);
        Ok(UdpIo {
            sock,
            bufs: (0..batch).map(|_| vec![0u8; 2 * MAX_DATAGRAM]).collect(),
            lens: vec![0; batch],
            addrs: vec![SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0); batch],
            truncated: vec![false; batch],
            landing: vec![None; batch],
            // SAFETY: plain-data structs; zeroed is a valid initial value.
            names: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
            iovs: (0..batch)
                .map(|_| {
                    [libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    }; 3]
                })
                .collect(),
            // SAFETY: as above.
            msgs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Result<SocketAddrV4> {
        match self.sock.local_addr() {
            Ok(std::net::SocketAddr::V4(a)) => Ok(a),
            Ok(other) => Err(Error::invalid(format!("socket bound to non-IPv4 {other}"))),
            Err(e) => Err(Error::io("getsockname", e)),
        }
    }

    /// The socket fd (for poll).
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Receives up to the batch size of datagrams without blocking; returns
    /// how many (0 when none is waiting). Each lands whole in its staging buffer.
    pub fn recv_batch(&mut self) -> Result<usize> {
        self.recv_batch_into(None, &[])
    }

    /// Like [`recv_batch`](Self::recv_batch), but datagram `i < plan.len()`
    /// is scattered as `plan[i]` says: its payload goes straight from the
    /// socket into the slab, no second copy. A landing whose slab range is
    /// not receiver-owned (loaned, or outside its slot) is ignored and that
    /// datagram lands whole. Use [`head`](Self::head) / [`gather`](Self::gather)
    /// to read scattered datagrams.
    pub(crate) fn recv_batch_into(
        &mut self,
        slab: Option<&Slab>,
        plan: &[Landing],
    ) -> Result<usize> {
        let n = self.bufs.len();
        for i in 0..n {
            let buf = self.bufs[i].as_mut_ptr();
            let landing = match (slab, plan.get(i)) {
                (Some(slab), Some(l)) if (l.head as usize) < MAX_DATAGRAM => slab
                    .receive_region(l.slot, l.offset, l.len)
                    .map(|p| (*l, p)),
                _ => None,
            };
            let iov = &mut self.iovs[i];
            let used = match landing {
                Some((l, body)) => {
                    iov[0] = libc::iovec {
                        iov_base: buf as *mut libc::c_void,
                        iov_len: l.head as usize,
                    };
                    iov[1] = libc::iovec {
                        iov_base: body.as_ptr() as *mut libc::c_void,
                        iov_len: l.len as usize,
                    };
                    iov[2] = libc::iovec {
                        // SAFETY: bufs[i] is 2 * MAX_DATAGRAM long.
                        iov_base: unsafe { buf.add(MAX_DATAGRAM) } as *mut libc::c_void,
                        iov_len: MAX_DATAGRAM,
                    };
                    self.landing[i] = Some(l);
                    3
                }
                None => {
                    iov[0] = libc::iovec {
                        iov_base: buf as *mut libc::c_void,
                        iov_len: MAX_DATAGRAM,
                    };
                    self.landing[i] = None;
                    1
                }
            };
            let m = &mut self.msgs[i].msg_hdr;
            m.msg_name = &mut self.names[i] as *mut _ as *mut libc::c_void;
            m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            m.msg_iov = iov.as_mut_ptr();
            m.msg_iovlen = used;
            m.msg_flags = 0;
        }
        // SAFETY: msgs/iovs/names are valid for n entries and outlive the call;
        // each iovec points into a buffer we own or into a slab range that
        // `receive_region` vouched is receiver-owned (the receive thread, our
        // only caller, does not loan it before it has read this batch).
        let got = unsafe {
            libc::recvmmsg(
                self.sock.as_raw_fd(),
                self.msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if got < 0 {
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(0),
                // A previous send to a closed port reports ECONNREFUSED here.
                std::io::ErrorKind::ConnectionRefused => Ok(0),
                _ => Err(Error::io("recvmmsg", e)),
            };
        }
        let got = got as usize;
        for i in 0..got {
            let len = self.msgs[i].msg_len as usize;
            self.lens[i] = len;
            // Scattered datagrams have room beyond MAX_DATAGRAM: cap them alike.
            self.truncated[i] =
                self.msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > MAX_DATAGRAM;
            self.addrs[i] = to_v4(&self.names[i]);
        }
        Ok(got)
    }

    /// Datagram `i` of the last batch: its bytes, sender, and whether it was
    /// truncated (larger than [`MAX_DATAGRAM`]). For a scattered datagram
    /// that is not gathered, only its head bytes.
    pub fn datagram(&self, i: usize) -> (&[u8], SocketAddrV4, bool) {
        let len = match self.landing[i] {
            Some(l) => self.lens[i].min(l.head as usize),
            None => self.lens[i].min(MAX_DATAGRAM),
        };
        (&self.bufs[i][..len], self.addrs[i], self.truncated[i])
    }

    /// Where datagram `i` of the last batch was scattered to (`None`: whole,
    /// in its staging buffer, or gathered there).
    pub fn landing(&self, i: usize) -> Option<Landing> {
        self.landing[i]
    }

    /// Datagram `i`'s length on the wire.
    pub fn len(&self, i: usize) -> usize {
        self.lens[i]
    }

    /// The bytes of scattered datagram `i` that followed its slab part (pad
    /// and ICRC), `&[]` for a whole one.
    pub fn spill(&self, i: usize) -> &[u8] {
        match self.landing[i] {
            Some(l) => {
                let n = self.lens[i]
                    .saturating_sub((l.head + l.len) as usize)
                    .min(MAX_DATAGRAM);
                &self.bufs[i][MAX_DATAGRAM..MAX_DATAGRAM + n]
            }
            None => &[],
        }
    }

    /// Copies scattered datagram `i` back together in its staging buffer
    /// (the slow path when a landing guess was wrong); afterwards
    /// [`datagram`](Self::datagram) returns it whole. Fails if its slab range
    /// is no longer receiver-owned.
    pub(crate) fn gather(&mut self, i: usize, slab: &Slab) -> Result<()> {
        let Some(l) = self.landing[i] else {
            return Ok(());
        };
        let len = self.lens[i].min(MAX_DATAGRAM);
        let head = l.head as usize;
        let body = len.saturating_sub(head).min(l.len as usize);
        let spill = len.saturating_sub(head + body);
        let buf = &mut self.bufs[i];
        // Spill first: it moves down from MAX_DATAGRAM to head + body
        // (len <= MAX_DATAGRAM keeps it in bounds; copy_within handles overlap).
        buf.copy_within(MAX_DATAGRAM..MAX_DATAGRAM + spill, head + body);
        let src = slab
            .receive_region(l.slot, l.offset, body as u32)
            .ok_or_else(|| {
                Error::new(
                    crate::ErrorKind::Internal,
                    format!(
                        "slot {} was loaned before its scattered datagram was read",
                        l.slot
                    ),
                )
            })?;
        // SAFETY: receive_region vouched for `body` bytes of a receiver-owned
        // range (the kernel wrote them in the last recvmmsg; nobody writes
        // them now); the destination is our own staging buffer, disjoint.
        let part = unsafe { std::slice::from_raw_parts(src.as_ptr(), body) };
        buf[head..head + body].copy_from_slice(part);
        self.landing[i] = None;
        Ok(())
    }

    /// Sends datagrams (`(destination, bytes)`) with as few sendmmsg calls as
    /// possible; returns how many the kernel took (a full send buffer or an
    /// ICMP error drops the rest, as the network may).
    pub fn send_batch(&self, pkts: &[(SocketAddrV4, &[u8])]) -> Result<usize> {
        if pkts.is_empty() {
            return Ok(0);
        }
        let mut names: Vec<libc::sockaddr_in> = pkts.iter().map(|(a, _)| from_v4(a)).collect();
        let mut iovs: Vec<libc::iovec> = pkts
            .iter()
            .map(|(_, b)| libc::iovec {
                iov_base: b.as_ptr() as *mut libc::c_void,
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: plain-data structs; zeroed is a valid initial value.
        let mut msgs: Vec<libc::mmsghdr> = (0..pkts.len())
            .map(|_| unsafe { std::mem::zeroed() })
            .collect();
        for i in 0..pkts.len() {
            msgs[i].msg_hdr.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
            msgs[i].msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        let mut sent = 0;
        while sent < pkts.len() {
            // SAFETY: the arrays are valid from `sent` for the remaining entries;
            // iovecs point into the caller's byte slices, only read.
            let n = unsafe {
                libc::sendmmsg(
                    self.fd(),
                    msgs.as_mut_ptr().add(sent),
                    (pkts.len() - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::ConnectionRefused => {
                        return Ok(sent)
                    }
                    _ => return Err(Error::io("sendmmsg", e)),
                }
            }
            sent += n as usize;
        }
        Ok(sent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_loopback_round_trip() {
        let lo = Ipv4Addr::LOCALHOST;
        let mut a = UdpIo::bind(SocketAddrV4::new(lo, 0), 8).unwrap();
        let b = UdpIo::bind(SocketAddrV4::new(lo, 0), 8).unwrap();
        let to = a.local_addr().unwrap();
        let payloads: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 100 + i as usize]).collect();
        let pkts: Vec<(SocketAddrV4, &[u8])> = payloads.iter().map(|p| (to, &p[..])).collect();
        assert_eq!(b.send_batch(&pkts).unwrap(), 5);
        let mut got = Vec::new();
        for _ in 0..1000 {
            let n = a.recv_batch().unwrap();
            for i in 0..n {
                let (d, from, trunc) = a.datagram(i);
                assert_eq!(from, b.local_addr().unwrap());
                assert!(!trunc);
                got.push(d.to_vec());
            }
            if got.len() == 5 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(got, payloads);
        assert_eq!(a.recv_batch().unwrap(), 0);
    }

    #[test]
    fn bind_conflict_explains_itself() {
        let a = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1).unwrap();
        let e = UdpIo::bind(a.local_addr().unwrap(), 1).err().unwrap();
        assert!(e.message().contains("pick another udp_port"), "{e}");
    }
}
