//! UDP socket I/O for the soft backend and the FPGA emulator: batched receive
//! and send (recvmmsg / sendmmsg), non-blocking, with `IP_PMTUDISC_DO` so that
//! Linux sends our datagrams from the unconnected socket with DF set and IP ID
//! 0, which makes the ICRC of what we send computable without seeing the IP
//! header.
//!
//! Received ICRCs: a UDP socket does not show the sender's IP header (the IP
//! ID is covered by the ICRC), so datagrams read from it are ICRC-unchecked;
//! [`UdpIo::enable_raw_capture`] (`capture.rs`) reads them with their IP
//! header instead, where the process may (CAP_NET_RAW).

mod capture;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::error::{Error, ErrorKind, Result};
use crate::server::Slab;
use crate::wire::icrc::{parse_ipv4_udp, IcrcCache, Ipv4Udp};

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

/// Bytes in front of the UDP payload in a raw capture: IPv4 (no options) + UDP.
const RAW_PREFIX: usize = 28;

/// One datagram of a receive batch: its staging buffer, where the last
/// recvmmsg put it, and what was read from it.
struct RxSlot {
    /// 2 * MAX_DATAGRAM bytes; a scattered datagram's spill (what follows
    /// its slab part) lands at MAX_DATAGRAM.
    buf: Vec<u8>,
    /// Bytes in front of the UDP payload: RAW_PREFIX from the capture
    /// socket, 0 from the UDP socket.
    pre: usize,
    /// Where the UDP payload starts in `buf`, and its length.
    base: usize,
    len: usize,
    /// Bytes recvmmsg reported.
    got_len: usize,
    from: SocketAddrV4,
    truncated: bool,
    /// Where it was scattered (None: whole in `buf`).
    landing: Option<Landing>,
    /// Raw capture: the ICRC context read from its IP/UDP header.
    ctx: Option<Ipv4Udp>,
    /// recvmmsg scratch, rewritten before every call.
    name: libc::sockaddr_in,
    iov: [libc::iovec; 3],
}

impl RxSlot {
    fn new() -> RxSlot {
        RxSlot {
            buf: vec![0u8; 2 * MAX_DATAGRAM],
            pre: 0,
            base: 0,
            len: 0,
            got_len: 0,
            from: SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
            truncated: false,
            landing: None,
            ctx: None,
            // SAFETY: plain-data struct; zeroed is a valid initial value.
            name: unsafe { std::mem::zeroed() },
            iov: [libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            }; 3],
        }
    }

    /// Points iov at the staging buffer (whole) or at headers -> buf, body
    /// -> `body` (a receiver-owned slab range), spill -> buf[MAX_DATAGRAM..];
    /// returns the iovec count.
    fn aim(&mut self, prefix: usize, scatter: Option<(Landing, NonNull<u8>)>) -> usize {
        self.pre = prefix;
        let buf = self.buf.as_mut_ptr();
        self.landing = scatter.map(|(l, _)| l);
        match scatter {
            Some((l, body)) => {
                self.iov[0] = iovec(buf, prefix + l.head as usize);
                self.iov[1] = iovec(body.as_ptr(), l.len as usize);
                // SAFETY: buf is 2 * MAX_DATAGRAM long.
                self.iov[2] = iovec(unsafe { buf.add(MAX_DATAGRAM) }, MAX_DATAGRAM);
                3
            }
            None => {
                self.iov[0] = iovec(buf, MAX_DATAGRAM);
                1
            }
        }
    }
}

fn iovec(at: *mut u8, len: usize) -> libc::iovec {
    libc::iovec {
        iov_base: at as *mut libc::c_void,
        iov_len: len,
    }
}

/// A bound, non-blocking UDP socket with receive buffers for a batch.
pub struct UdpIo {
    sock: UdpSocket,
    // Raw capture mode: packets are read here, IP header included (their
    // ICRC is checked), and the UDP socket only sends.
    raw: Option<OwnedFd>,
    // Raw mode: datagrams that still came through the UDP socket (they
    // entered through another interface than the captured one).
    via_udp: u64,
    rx: Vec<RxSlot>,
    // recvmmsg headers (one contiguous array, as the call wants), pointing
    // into `rx`; rewritten before every call.
    msgs: Vec<libc::mmsghdr>,
    // sendmmsg scratch, kept so sending does not allocate.
    tx_names: Vec<libc::sockaddr_in>,
    tx_iovs: Vec<libc::iovec>,
    tx_msgs: Vec<libc::mmsghdr>,
    // Raw mode: the received ICRCs' pseudo-header CRC state, kept.
    icrc: IcrcCache,
}

// SAFETY: the raw pointers in the recvmmsg/sendmmsg scratch only ever point
// into this struct's own heap buffers (or, during one call, the caller's) and
// are rewritten before each use; nothing is shared between threads.
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
            raw: None,
            via_udp: 0,
            rx: (0..batch).map(|_| RxSlot::new()).collect(),
            // SAFETY: plain-data structs; zeroed is a valid initial value.
            msgs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
            tx_names: Vec::new(),
            tx_iovs: Vec::new(),
            tx_msgs: Vec::new(),
            icrc: IcrcCache::default(),
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

    /// The UDP socket's fd (sends go out here).
    pub fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The fd packets are received on (for poll): the raw capture socket in
    /// raw mode, else the UDP socket.
    pub fn rx_fd(&self) -> RawFd {
        match &self.raw {
            Some(r) => r.as_raw_fd(),
            None => self.sock.as_raw_fd(),
        }
    }

    #[cfg(test)]
    /// True in raw capture mode (received ICRCs are verifiable).
    pub fn raw_capture(&self) -> bool {
        self.raw.is_some()
    }

    /// Packets the kernel dropped at the receiving socket so far (its buffer
    /// was full: the receive thread fell behind), from SO_MEMINFO. In raw
    /// capture mode the capture socket's (the UDP socket's count there is
    /// its filter at work).
    pub fn kernel_drops(&self) -> u64 {
        const SK_MEMINFO_DROPS: usize = 8;
        let mut info = [0u32; 16];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `info`, ours.
        let rc = unsafe {
            libc::getsockopt(
                self.rx_fd(),
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        if rc != 0 || (len as usize) < (SK_MEMINFO_DROPS + 1) * 4 {
            return 0;
        }
        info[SK_MEMINFO_DROPS] as u64
    }

    #[cfg(test)]
    /// Raw capture mode: datagrams that arrived through the UDP socket
    /// instead (another ingress interface), ICRC unchecked.
    pub fn via_udp(&self) -> u64 {
        self.via_udp
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
        let Some(raw) = self.raw.as_ref().map(|r| r.as_raw_fd()) else {
            return self.recv_on(self.sock.as_raw_fd(), false, slab, plan);
        };
        let got = self.recv_on(raw, true, slab, plan)?;
        if got > 0 {
            return Ok(got);
        }
        // The capture is idle: anything that came in elsewhere?
        let got = self.recv_on(self.sock.as_raw_fd(), false, None, &[])?;
        if got > 0 {
            if self.via_udp == 0 {
                log::warn!(
                    "packets for {} arrive through another interface than the captured one: \
                     their ICRC is not checked (counted icrc_unchecked)",
                    self.local_addr().map(|a| a.to_string()).unwrap_or_default()
                );
            }
            self.via_udp += got as u64;
        }
        Ok(got)
    }

    fn recv_on(
        &mut self,
        fd: RawFd,
        raw: bool,
        slab: Option<&Slab>,
        plan: &[Landing],
    ) -> Result<usize> {
        let n = self.rx.len();
        let prefix = if raw { RAW_PREFIX } else { 0 };
        for (i, (rx, m)) in self.rx.iter_mut().zip(self.msgs.iter_mut()).enumerate() {
            let scatter = match (slab, plan.get(i)) {
                (Some(slab), Some(l)) if prefix + (l.head as usize) < MAX_DATAGRAM => slab
                    .receive_region(l.slot, l.offset, l.len)
                    .map(|p| (*l, p)),
                _ => None,
            };
            let iovs = rx.aim(prefix, scatter);
            let m = &mut m.msg_hdr;
            if raw {
                // The sender's address is read from the IP header.
                m.msg_name = std::ptr::null_mut();
                m.msg_namelen = 0;
            } else {
                m.msg_name = &mut rx.name as *mut _ as *mut libc::c_void;
                m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            }
            m.msg_iov = rx.iov.as_mut_ptr();
            m.msg_iovlen = iovs;
            m.msg_flags = 0;
        }
        // SAFETY: msgs has n entries pointing into `rx`, which outlives the
        // call; each iovec points into a buffer we own or into a slab range
        // that `receive_region` vouched is receiver-owned (the receive
        // thread, our only caller, does not loan it before it has read this
        // batch).
        let got = unsafe {
            libc::recvmmsg(
                fd,
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
        self.read_batch(got, raw, slab)?;
        Ok(got)
    }

    /// After recvmmsg: each datagram's length, sender and payload place.
    fn read_batch(&mut self, got: usize, raw: bool, slab: Option<&Slab>) -> Result<()> {
        for i in 0..got {
            let (len, flags) = (
                self.msgs[i].msg_len as usize,
                self.msgs[i].msg_hdr.msg_flags,
            );
            let rx = &mut self.rx[i];
            rx.got_len = len;
            // Scattered datagrams have room beyond MAX_DATAGRAM: cap them alike.
            rx.truncated = flags & libc::MSG_TRUNC != 0 || len > MAX_DATAGRAM;
            if !raw {
                rx.len = len;
                rx.base = 0;
                rx.ctx = None;
                rx.from = to_v4(&rx.name);
                continue;
            }
            // Raw capture: an IP header with options shifts the layout of a
            // scattered packet: gather it, then read the headers.
            if rx.landing.is_some() && rx.buf[0] != 0x45 {
                if let Some(slab) = slab {
                    self.gather(i, slab)?;
                }
            }
            self.rx[i].read_ip_udp();
        }
        Ok(())
    }

    /// Raw capture: whether datagram `i`'s ICRC is right (`None` when not
    /// in raw mode). Reads a scattered payload where it landed in the slab.
    pub(crate) fn icrc_ok(&mut self, i: usize, slab: &Slab) -> Option<bool> {
        let rx = &self.rx[i];
        let cache = &mut self.icrc;
        // Set only for datagrams read from the capture socket.
        let ctx = rx.ctx?;
        let (b, n) = (rx.base, rx.len);
        Some(match rx.landing {
            None => cache.verify_parts(&ctx, &[&rx.buf[b..b + n]]),
            Some(l) => {
                let head = n.min(l.head as usize);
                let body = (n - head).min(l.len as usize);
                let spill = n - head - body;
                let Some(at) = slab.receive_region(l.slot, l.offset, body as u32) else {
                    return Some(false);
                };
                // SAFETY: receive_region vouched for `body` receiver-owned
                // bytes that the last recvmmsg wrote; nothing writes them
                // while this slice lives (it ends with this call).
                let part = unsafe { std::slice::from_raw_parts(at.as_ptr(), body) };
                cache.verify_parts(
                    &ctx,
                    &[
                        &rx.buf[b..b + head],
                        part,
                        &rx.buf[MAX_DATAGRAM..MAX_DATAGRAM + spill],
                    ],
                )
            }
        })
    }

    /// Datagram `i` of the last batch: its bytes, sender, and whether it was
    /// truncated (larger than [`MAX_DATAGRAM`]). For a scattered datagram
    /// that is not gathered, only its head bytes.
    pub fn datagram(&self, i: usize) -> (&[u8], SocketAddrV4, bool) {
        let rx = &self.rx[i];
        let len = match rx.landing {
            Some(l) => rx.len.min(l.head as usize),
            None => rx.len.min(MAX_DATAGRAM - rx.base),
        };
        (&rx.buf[rx.base..rx.base + len], rx.from, rx.truncated)
    }

    /// Where datagram `i` of the last batch was scattered to (`None`: whole,
    /// in its staging buffer, or gathered there).
    pub fn landing(&self, i: usize) -> Option<Landing> {
        self.rx[i].landing
    }

    /// Datagram `i`'s length on the wire.
    pub fn len(&self, i: usize) -> usize {
        self.rx[i].len
    }

    /// Copies scattered datagram `i` back together in its staging buffer
    /// (the slow path when a landing guess was wrong); afterwards
    /// [`datagram`](Self::datagram) returns it whole. Fails if its slab range
    /// is no longer receiver-owned.
    pub(crate) fn gather(&mut self, i: usize, slab: &Slab) -> Result<()> {
        let rx = &mut self.rx[i];
        let Some(l) = rx.landing else {
            return Ok(());
        };
        let len = rx.got_len.min(MAX_DATAGRAM);
        let head = rx.pre + l.head as usize;
        let body = len.saturating_sub(head).min(l.len as usize);
        let spill = len.saturating_sub(head + body);
        // Spill first: it moves down from MAX_DATAGRAM to head + body
        // (len <= MAX_DATAGRAM keeps it in bounds; copy_within handles overlap).
        rx.buf
            .copy_within(MAX_DATAGRAM..MAX_DATAGRAM + spill, head + body);
        let src = slab
            .receive_region(l.slot, l.offset, body as u32)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Internal,
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
        rx.buf[head..head + body].copy_from_slice(part);
        rx.landing = None;
        if rx.pre > 0 {
            rx.read_ip_udp();
        }
        Ok(())
    }

    /// Gathers datagrams `from..n` of the last batch (a landing guess
    /// missed at `from`: the rest is read the slow way before any copy into
    /// the slab can overwrite where they landed).
    pub(crate) fn gather_rest(&mut self, from: usize, n: usize, slab: &Slab) -> Result<()> {
        (from..n).try_for_each(|j| self.gather(j, slab))
    }

    /// Sends datagrams (`(destination, bytes)`) with as few sendmmsg calls as
    /// possible; returns how many the kernel took (a full send buffer or an
    /// ICMP error drops the rest, as the network may).
    pub fn send_batch(&mut self, pkts: &[(SocketAddrV4, &[u8])]) -> Result<usize> {
        self.send_iter(pkts.iter().copied())
    }

    /// [`send_batch`](Self::send_batch) of `bufs`, all to `dst`.
    pub fn send_to(&mut self, dst: SocketAddrV4, bufs: &[Vec<u8>]) -> Result<usize> {
        self.send_iter(bufs.iter().map(|b| (dst, &b[..])))
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
        let mut sent = 0;
        while sent < n {
            // SAFETY: the arrays hold n entries, valid from `sent`; the
            // iovecs point into the caller's byte slices, only read, which
            // outlive this call.
            let k = unsafe {
                libc::sendmmsg(
                    self.sock.as_raw_fd(),
                    self.tx_msgs.as_mut_ptr().add(sent),
                    (n - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if k < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::Interrupted => continue,
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::ConnectionRefused => {
                        return Ok(sent)
                    }
                    _ => return Err(Error::io("sendmmsg", e)),
                }
            }
            sent += k as usize;
        }
        Ok(sent)
    }
}

impl RxSlot {
    /// Raw capture: the IP/UDP header -> sender, payload place and length,
    /// ICRC context; an unusable header marks the datagram truncated.
    fn read_ip_udp(&mut self) {
        let len = self.got_len.min(MAX_DATAGRAM);
        let seen = match self.landing {
            Some(l) => len.min(self.pre + l.head as usize),
            None => len,
        };
        match parse_ipv4_udp(&self.buf[..seen], len) {
            Some((ctx, at, n)) if self.landing.is_none() || at == self.pre => {
                self.base = at;
                self.len = n;
                self.from = SocketAddrV4::new(ctx.src, ctx.src_port);
                self.ctx = Some(ctx);
            }
            _ => {
                self.base = 0;
                self.len = 0;
                self.from = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
                self.ctx = None;
                self.truncated = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_loopback_round_trip() {
        let lo = Ipv4Addr::LOCALHOST;
        let mut a = UdpIo::bind(SocketAddrV4::new(lo, 0), 8).unwrap();
        let mut b = UdpIo::bind(SocketAddrV4::new(lo, 0), 8).unwrap();
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
