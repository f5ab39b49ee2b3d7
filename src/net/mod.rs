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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::error::{Error, Result};
use crate::sys::Slab;
use crate::wire::icrc::{parse_ipv4_udp, Ipv4Udp};

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

/// A bound, non-blocking UDP socket with receive buffers for a batch.
pub struct UdpIo {
    sock: UdpSocket,
    // Raw capture mode: packets are read here, IP header included (their
    // ICRC is checked), and the UDP socket only sends.
    raw: Option<OwnedFd>,
    // Per datagram of the last batch: its prefix (28 from the capture
    // socket, 0 from the UDP socket).
    pre: Vec<usize>,
    // Raw mode: datagrams that still came through the UDP socket (they
    // entered through another interface than the captured one).
    via_udp: u64,
    // Where datagram i's UDP payload starts in bufs[i] and the bytes received.
    base: Vec<usize>,
    got_len: Vec<usize>,
    ctx: Vec<Option<Ipv4Udp>>,
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
            raw: None,
            pre: vec![0; batch],
            via_udp: 0,
            base: vec![0; batch],
            got_len: vec![0; batch],
            ctx: vec![None; batch],
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

    /// Switches receiving to raw capture: an AF_PACKET socket on the
    /// interface holding the bound address, with a kernel filter that passes
    /// only unfragmented IPv4/UDP packets to our address and port arriving at
    /// this host, so each packet comes with its IP header and its ICRC can be
    /// checked. The UDP socket keeps the port (no ICMP port-unreachable) and
    /// sends; a filter keeps what the capture reads out of its queue, so only
    /// packets entering through another interface (multi-homed hosts) still
    /// arrive there, counted unchecked instead of lost. Needs
    /// CAP_NET_RAW: without it the error (kind `Unsupported`) says so.
    /// Returns the interface name.
    pub(crate) fn enable_raw_capture(&mut self) -> Result<String> {
        let local = self.local_addr()?;
        let (ifindex, ifname) = interface_of(*local.ip())?;
        // Protocol 0: the socket receives nothing until bind() names one,
        // after its filter is attached, so no unfiltered packet (another
        // link's data, ACKs) is ever queued on it.
        // SAFETY: plain syscall; the result is checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::new(
                if e.kind() == std::io::ErrorKind::PermissionDenied {
                    crate::ErrorKind::Unsupported
                } else {
                    crate::ErrorKind::Io
                },
                format!(
                    "raw capture on {ifname} (to check received ICRCs): socket(AF_PACKET): {e} — \
                     it needs CAP_NET_RAW: run as root or `setcap cap_net_raw+ep` the program, \
                     or set the device's icrc_check to off"
                ),
            ));
        }
        // SAFETY: fd is a fresh socket we own from here on.
        let raw = unsafe { OwnedFd::from_raw_fd(fd) };
        let prog = capture_filter(*local.ip(), local.port());
        attach_filter(raw.as_raw_fd(), &prog, "the raw capture filter")?;
        // SAFETY: plain-data struct; zeroed is a valid initial value.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_IP as u16).to_be();
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: binds our socket to a valid sockaddr_ll of the right size.
        let rc = unsafe {
            libc::bind(
                raw.as_raw_fd(),
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc != 0 {
            return Err(Error::io(
                &format!("binding the raw capture socket to {ifname}"),
                std::io::Error::last_os_error(),
            ));
        }
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20, "SO_RCVBUF");
        // The UDP socket stops queueing what the capture socket reads: all
        // that enters through the captured interface. What enters elsewhere
        // (a multi-homed host) still arrives there, unchecked but not lost.
        let not_captured = [
            bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, SKF_AD_IFINDEX),
            bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, ifindex),
            bpf(BPF_RET | BPF_K, 0, 0, 0),
            bpf(BPF_RET | BPF_K, 0, 0, 0x0004_0000),
        ];
        attach_filter(
            self.sock.as_raw_fd(),
            &not_captured,
            "the UDP socket's filter",
        )?;
        self.raw = Some(raw);
        // Whatever the UDP socket queued before is read by nobody: drop it.
        let mut scratch = [0u8; 1];
        while self.sock.recv_from(&mut scratch).is_ok() {}
        Ok(ifname)
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
        let n = self.bufs.len();
        let prefix = if raw { RAW_PREFIX } else { 0 };
        for i in 0..n {
            self.pre[i] = prefix;
            let buf = self.bufs[i].as_mut_ptr();
            let landing = match (slab, plan.get(i)) {
                (Some(slab), Some(l)) if prefix + (l.head as usize) < MAX_DATAGRAM => slab
                    .receive_region(l.slot, l.offset, l.len)
                    .map(|p| (*l, p)),
                _ => None,
            };
            let iov = &mut self.iovs[i];
            let used = match landing {
                Some((l, body)) => {
                    iov[0] = libc::iovec {
                        iov_base: buf as *mut libc::c_void,
                        iov_len: prefix + l.head as usize,
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
            if raw {
                // The sender's address is read from the IP header.
                m.msg_name = std::ptr::null_mut();
                m.msg_namelen = 0;
            } else {
                m.msg_name = &mut self.names[i] as *mut _ as *mut libc::c_void;
                m.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            }
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
        for i in 0..got {
            let len = self.msgs[i].msg_len as usize;
            self.got_len[i] = len;
            // Scattered datagrams have room beyond MAX_DATAGRAM: cap them alike.
            self.truncated[i] =
                self.msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len > MAX_DATAGRAM;
            if !raw {
                self.lens[i] = len;
                self.base[i] = 0;
                self.ctx[i] = None;
                self.addrs[i] = to_v4(&self.names[i]);
                continue;
            }
            // Raw capture: an IP header with options shifts the layout of a
            // scattered packet: gather it, then read the headers.
            if self.landing[i].is_some() && self.bufs[i][0] != 0x45 {
                if let Some(slab) = slab {
                    self.gather(i, slab)?;
                }
            }
            self.read_ip_udp(i);
        }
        Ok(got)
    }

    /// Raw capture: datagram i's IP/UDP header -> sender, payload place and
    /// length, ICRC context; an unusable header marks it truncated.
    fn read_ip_udp(&mut self, i: usize) {
        let len = self.got_len[i].min(MAX_DATAGRAM);
        let seen = match self.landing[i] {
            Some(l) => len.min(self.pre[i] + l.head as usize),
            None => len,
        };
        match parse_ipv4_udp(&self.bufs[i][..seen], len) {
            Some((ctx, at, n)) if self.landing[i].is_none() || at == self.pre[i] => {
                self.base[i] = at;
                self.lens[i] = n;
                self.addrs[i] = SocketAddrV4::new(ctx.src, ctx.src_port);
                self.ctx[i] = Some(ctx);
            }
            _ => {
                self.base[i] = 0;
                self.lens[i] = 0;
                self.addrs[i] = SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0);
                self.ctx[i] = None;
                self.truncated[i] = true;
            }
        }
    }

    /// Raw capture: whether datagram `i`'s ICRC is right (`None` when not
    /// in raw mode). Reads a scattered payload where it landed in the slab.
    pub(crate) fn icrc_ok(&self, i: usize, slab: &Slab) -> Option<bool> {
        // Set only for datagrams read from the capture socket.
        let ctx = self.ctx[i]?;
        let b = self.base[i];
        let n = self.lens[i];
        Some(match self.landing[i] {
            None => ctx.verify_parts(&[&self.bufs[i][b..b + n]]),
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
                ctx.verify_parts(&[
                    &self.bufs[i][b..b + head],
                    part,
                    &self.bufs[i][MAX_DATAGRAM..MAX_DATAGRAM + spill],
                ])
            }
        })
    }

    /// Datagram `i` of the last batch: its bytes, sender, and whether it was
    /// truncated (larger than [`MAX_DATAGRAM`]). For a scattered datagram
    /// that is not gathered, only its head bytes.
    pub fn datagram(&self, i: usize) -> (&[u8], SocketAddrV4, bool) {
        let b = self.base[i];
        let len = match self.landing[i] {
            Some(l) => self.lens[i].min(l.head as usize),
            None => self.lens[i].min(MAX_DATAGRAM - b),
        };
        (&self.bufs[i][b..b + len], self.addrs[i], self.truncated[i])
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

    /// Copies scattered datagram `i` back together in its staging buffer
    /// (the slow path when a landing guess was wrong); afterwards
    /// [`datagram`](Self::datagram) returns it whole. Fails if its slab range
    /// is no longer receiver-owned.
    pub(crate) fn gather(&mut self, i: usize, slab: &Slab) -> Result<()> {
        let Some(l) = self.landing[i] else {
            return Ok(());
        };
        let len = self.got_len[i].min(MAX_DATAGRAM);
        let head = self.pre[i] + l.head as usize;
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
        if self.pre[i] > 0 {
            self.read_ip_udp(i);
        }
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

const BPF_LD: u16 = 0x00;
const BPF_LDX: u16 = 0x01;
const BPF_ALU: u16 = 0x04;
const BPF_JMP: u16 = 0x05;
const BPF_RET: u16 = 0x06;
const BPF_W: u16 = 0x00;
const BPF_H: u16 = 0x08;
const BPF_B: u16 = 0x10;
const BPF_ABS: u16 = 0x20;
const BPF_IND: u16 = 0x40;
const BPF_MSH: u16 = 0xa0;
const BPF_AND: u16 = 0x50;
const BPF_JEQ: u16 = 0x10;
const BPF_JSET: u16 = 0x40;
const BPF_K: u16 = 0x00;
const SKF_AD_PKTTYPE: u32 = (-0x1000i32 + 4) as u32;
const SKF_AD_IFINDEX: u32 = (-0x1000i32 + 8) as u32;

fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Classic BPF for a SOCK_DGRAM packet socket (offsets from the IP header):
/// accept unfragmented IPv4/UDP to `ip`:`port` that is not our own outgoing
/// copy (loopback shows each packet twice).
fn capture_filter(ip: Ipv4Addr, port: u16) -> Vec<libc::sock_filter> {
    vec![
        /* 0 */ bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, 0),
        /* 1 */ bpf(BPF_ALU | BPF_AND | BPF_K, 0, 0, 0xf0),
        /* 2 */ bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 12, 0x40),
        /* 3 */ bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, 9),
        /* 4 */ bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 10, 17),
        /* 5 */ bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, 16),
        /* 6 */ bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 8, u32::from(ip)),
        /* 7 */ bpf(BPF_LD | BPF_H | BPF_ABS, 0, 0, 6),
        /* 8 */ bpf(BPF_JMP | BPF_JSET | BPF_K, 6, 0, 0x3fff),
        /* 9 */ bpf(BPF_LDX | BPF_B | BPF_MSH, 0, 0, 0),
        /* 10 */ bpf(BPF_LD | BPF_H | BPF_IND, 0, 0, 2),
        /* 11 */ bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 3, port as u32),
        /* 12 */ bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, SKF_AD_PKTTYPE),
        /* 13 */
        bpf(
            BPF_JMP | BPF_JEQ | BPF_K,
            1,
            0,
            libc::PACKET_OUTGOING as u32,
        ),
        /* 14 */ bpf(BPF_RET | BPF_K, 0, 0, 0x0004_0000),
        /* 15 */ bpf(BPF_RET | BPF_K, 0, 0, 0),
    ]
}

fn attach_filter(fd: RawFd, prog: &[libc::sock_filter], what: &str) -> Result<()> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: fprog points to `prog`, valid for the call; the kernel copies it.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>() as u32,
        )
    };
    if rc != 0 {
        return Err(Error::io(
            &format!("attaching {what}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

/// The index and name of the interface that holds `ip`.
fn interface_of(ip: Ipv4Addr) -> Result<(u32, String)> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(Error::io("getifaddrs", std::io::Error::last_os_error()));
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list getifaddrs returned, alive until
        // freeifaddrs; ifa_addr, when set, points to a sockaddr of its family.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: as above.
        if unsafe { (*ifa.ifa_addr).sa_family } as i32 != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET address is a sockaddr_in.
        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
        if Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)) == ip {
            // SAFETY: ifa_name is a NUL-terminated string owned by the list.
            let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
            // SAFETY: as above.
            let index = unsafe { libc::if_nametoindex(ifa.ifa_name) };
            found = Some((index, name.to_string_lossy().into_owned()));
            break;
        }
    }
    // SAFETY: list came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    match found {
        Some((idx, name)) if idx != 0 => Ok((idx, name)),
        _ => Err(Error::invalid(format!(
            "no network interface holds {ip}: raw capture needs the bind address on an \
             interface of this host"
        ))),
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
