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

pub(crate) mod capture;
mod datagram;
mod fit;
mod holder;
mod rx;
mod tx;

pub use datagram::{Body, Datagram};
pub(crate) use rx::MAX_SEGS;
use rx::{RxMsg, Seg};
pub use tx::gso_runs;
use tx::GsoCmsg;

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;

use crate::error::{Error, Result};

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
    /// Bytes that may go to the slot (its room, up to the pmtu).
    pub len: u32,
    /// Bytes the packet should carry (what the last message's packet at
    /// this place did; <= `len`): where a merged datagram's next segment
    /// starts.
    pub expect: u32,
}

/// SO_MEMINFO's figures used here (`SK_MEMINFO_*` in linux/sock_diag.h).
const SK_MEMINFO_RCVBUF: usize = 1;
const SK_MEMINFO_DROPS: usize = 8;

/// A socket's memory figures (SO_MEMINFO, `SK_MEMINFO_*` order), None when
/// the kernel will not say.
fn meminfo(fd: RawFd) -> Option<[u32; 16]> {
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, ours.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    };
    (rc == 0 && len as usize >= (SK_MEMINFO_DROPS + 1) * 4).then_some(info)
}

/// A socket's drop count, from SO_MEMINFO (0 when the kernel will not say).
fn drops_of(fd: RawFd) -> u64 {
    meminfo(fd).map_or(0, |i| i[SK_MEMINFO_DROPS] as u64)
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
    // After `connect_peer`: the socket replies leave from (unconnected, so
    // its DF packets carry IP ID 0, which their ICRC covers; the connected
    // `sock` would number them itself). None: `sock` sends.
    tx: Option<UdpSocket>,
    // Raw capture mode: packets are read here, IP header included (their
    // ICRC is checked), and the UDP socket only sends.
    raw: Option<OwnedFd>,
    // Raw mode: datagrams that still came through the UDP socket (they
    // entered through another interface than the captured one).
    via_udp: u64,
    rx: Vec<RxMsg>,
    // recvmmsg headers (one contiguous array, as the call wants), pointing
    // into `rx`; rewritten when the plan or the socket changes.
    msgs: Vec<libc::mmsghdr>,
    // The last batch's segments (packets), in order.
    segs: Vec<Seg>,
    // The receive plan, kept across polls, and which fd the entries are
    // aimed at for it (None: aim again).
    kept: Vec<Landing>,
    aimed: Option<RawFd>,
    // Scratch for one entry's slab ranges.
    ranges: Vec<(Landing, NonNull<u8>)>,
    // Entries the next recvmmsg fills; entries to aim next (`fit_entries`).
    vlen: usize,
    want: usize,
    // The last receive got fewer datagrams than it asked for: the socket
    // was empty then.
    drained: bool,
    // UDP GRO on; merged datagrams arrived lately (plan one entry of up
    // to MAX_SEGS segments).
    gro: bool,
    merging: bool,
    // Segments per datagram lately (x16, averaged), the last batch's largest
    // merge, batches since a merged one.
    merge_avg16: usize,
    merge_last: usize,
    unmerged_batches: u32,
    // Merged datagrams lately began with a packet that continues a message.
    split_mid: bool,
    // Raw mode: idle polls, to look at the UDP socket now and then.
    fallback_ticks: u32,
    // sendmmsg scratch, kept so sending does not allocate.
    tx_names: Vec<libc::sockaddr_in>,
    tx_ctrl: Vec<GsoCmsg>,
    tx_iovs: Vec<libc::iovec>,
    tx_msgs: Vec<libc::mmsghdr>,
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

/// Sets `sock` (`what` names it) non-blocking, with `IP_PMTUDISC_DO`: an
/// unconnected socket then sends DF and IP ID 0. Returns its fd.
fn sending(sock: &UdpSocket, what: &str) -> Result<RawFd> {
    sock.set_nonblocking(true)
        .map_err(|e| Error::io(&format!("setting {what} non-blocking"), e))?;
    let fd = sock.as_raw_fd();
    setsockopt_int(
        fd,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_DO,
        &format!("setsockopt(IP_MTU_DISCOVER) on {what}"),
    )?;
    Ok(fd)
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

/// `connect(AF_UNSPEC)`: a connected UDP socket unconnected again.
fn disconnect(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: a zeroed sockaddr with family AF_UNSPEC, of its own size; the
    // kernel reads only the family for a UDP disconnect.
    let rc = unsafe {
        let mut sa: libc::sockaddr = std::mem::zeroed();
        sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        libc::connect(
            fd,
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

impl UdpIo {
    /// Binds `addr` (port 0 picks a free port), with room for `batch` datagrams.
    pub fn bind(addr: SocketAddrV4, batch: usize) -> Result<UdpIo> {
        let sock = UdpSocket::bind(addr).map_err(|e| holder::bind_error(addr, e, false))?;
        Self::with_socket(sock, batch)
    }

    /// Binds `addr` shared (`SO_REUSEPORT`): any number of sockets of this
    /// user, in this process or others, may bind the same address and port;
    /// [`connect_peer`](Self::connect_peer) then makes the kernel hand this
    /// one its peer's packets only. The bind error names who holds the port
    /// when it is not shareable.
    ///
    /// Until then the socket is connected to its own address and port, a
    /// source nothing sends from: it receives nothing, and it is never an
    /// unconnected member of the group. (The kernel hands a packet that
    /// matches no connected socket's peer to an unconnected member; with
    /// Linux 6.13+, a member that binds after another connected to a peer
    /// with port 0 takes that peer's packets too, until it connects itself:
    /// so no member is ever left unconnected.)
    pub fn bind_shared(addr: SocketAddrV4, batch: usize) -> Result<UdpIo> {
        let sock = holder::shared_socket(addr).map_err(|e| holder::bind_error(addr, e, true))?;
        let bound = match sock.local_addr() {
            Ok(std::net::SocketAddr::V4(a)) => a,
            Ok(other) => return Err(Error::invalid(format!("socket bound to non-IPv4 {other}"))),
            Err(e) => return Err(Error::io("getsockname", e)),
        };
        sock.connect(bound)
            .map_err(|e| Error::io(&format!("connecting the socket {bound} to itself"), e))?;
        Self::with_socket(sock, batch)
    }

    fn with_socket(sock: UdpSocket, batch: usize) -> Result<UdpIo> {
        let fd = sending(&sock, "the socket")?;
        // Large buffers absorb a 16-deep window of 4 KiB packets and bursts;
        // the kernel caps them at net.core.{r,w}mem_max (best effort).
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20, "SO_RCVBUF");
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20, "SO_SNDBUF");
        let batch = batch.max(1);
        Ok(UdpIo {
            sock,
            tx: None,
            raw: None,
            via_udp: 0,
            rx: (0..batch).map(|_| RxMsg::new()).collect(),
            // SAFETY: plain-data structs; zeroed is a valid initial value.
            msgs: (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect(),
            segs: Vec::with_capacity(batch * 2),
            kept: Vec::new(),
            aimed: None,
            ranges: Vec::with_capacity(MAX_SEGS),
            vlen: batch,
            want: batch,
            drained: false,
            gro: false,
            merging: false,
            merge_avg16: 16,
            merge_last: 0,
            unmerged_batches: 0,
            split_mid: false,
            fallback_ticks: 0,
            tx_names: Vec::new(),
            tx_ctrl: Vec::new(),
            tx_iovs: Vec::new(),
            tx_msgs: Vec::new(),
        })
    }

    /// Asks the kernel for a receive stamp on every datagram
    /// (`SO_TIMESTAMPNS`, CLOCK_REALTIME) on the sockets packets are read
    /// from: each [`Datagram`]'s `rx_ns`.
    pub fn enable_rx_timestamps(&mut self) -> Result<()> {
        let what = "setsockopt(SO_TIMESTAMPNS)";
        setsockopt_int(self.fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1, what)?;
        if let Some(raw) = &self.raw {
            setsockopt_int(
                raw.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                1,
                what,
            )?;
        }
        Ok(())
    }

    /// Busy-polls the NIC's queue for up to `us` microseconds on an empty
    /// socket (`SO_BUSY_POLL`), and asks for busy polling to be preferred
    /// over interrupts (`SO_PREFER_BUSY_POLL`). Returns the options the
    /// kernel refused, with why (an empty list: all set).
    pub fn set_busy_poll(&mut self, us: u32) -> Vec<Error> {
        let v = us.min(i32::MAX as u32) as i32;
        let fd = self.fd();
        let opts = [
            (libc::SO_BUSY_POLL, v, "setsockopt(SO_BUSY_POLL)"),
            (
                libc::SO_PREFER_BUSY_POLL,
                1,
                "setsockopt(SO_PREFER_BUSY_POLL)",
            ),
        ];
        opts.into_iter()
            .filter_map(|(name, value, what)| {
                setsockopt_int(fd, libc::SOL_SOCKET, name, value, what).err()
            })
            .collect()
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

    /// The fd datagrams are sent from: the reply socket after
    /// [`connect_peer`](Self::connect_peer), else the bound socket.
    fn tx_fd(&self) -> RawFd {
        self.tx.as_ref().unwrap_or(&self.sock).as_raw_fd()
    }

    /// The port datagrams leave from (what their ICRC covers): the reply
    /// socket's after [`connect_peer`](Self::connect_peer), else the bound
    /// one.
    pub fn tx_port(&self) -> Result<u16> {
        match self.tx.as_ref().unwrap_or(&self.sock).local_addr() {
            Ok(a) => Ok(a.port()),
            Err(e) => Err(Error::io("getsockname", e)),
        }
    }

    /// Receives from `peer` only (port 0: any port of its address), and
    /// sends from then on from a reply socket of its own, on the same
    /// address and port.
    ///
    /// The bound socket is connected to `peer`: in a group of sockets
    /// sharing the address and port ([`bind_shared`](Self::bind_shared)),
    /// the kernel's lookup hands a packet to the connected socket whose
    /// peer matches its source (a connected socket scores above any
    /// unconnected one), so each server of a shared port gets its FPGA's
    /// packets and no other's. A connected socket numbers the IP IDs of
    /// what it sends (DF set) from a random start, which an ICRC covers:
    /// so datagrams leave from a second, unconnected socket (IP ID 0, as
    /// before) bound to the same address and port in the group, which a
    /// filter keeps from queueing anything. Its source port matters: surf's
    /// UDP engine answers (sends its next requests) to the port the last
    /// datagram came from, so an ACK must come from the port the server
    /// receives on. An unconnected member that joins the group makes the
    /// kernel forget the group has connected members (Linux 6.18: it then
    /// takes every packet), so the reply socket connects once (to its own
    /// address) and disconnects, which marks the group as connected again.
    /// In raw capture mode the capture's filter is narrowed to `peer` too.
    pub fn connect_peer(&mut self, peer: SocketAddrV4) -> Result<()> {
        let local = self.local_addr()?;
        let tx = holder::shared_socket(local)
            .map_err(|e| Error::io(&format!("binding the reply socket on {local}"), e))?;
        // At once: connected once and disconnected, the group is marked as
        // having connected members again (see above; until then the kernel
        // spreads packets over every member), and the socket sends with IP
        // ID 0 (unconnected).
        tx.connect(local)
            .map_err(|e| Error::io(&format!("connecting the reply socket {local}"), e))?;
        let fd = tx.as_raw_fd();
        capture::attach_filter(fd, &capture::NOTHING, "the reply socket's filter")?;
        disconnect(fd).map_err(|e| Error::io("disconnecting the reply socket", e))?;
        sending(&tx, "the reply socket")?;
        let _ = setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20, "SO_SNDBUF");
        if self.raw.is_some() {
            self.narrow_capture(peer)?;
        }
        self.sock.connect(peer).map_err(|e| {
            Error::io(
                &format!("connecting the socket {local} to the FPGA {peer}"),
                e,
            )
        })?;
        self.tx = Some(tx);
        self.aimed = None;
        Ok(())
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
        drops_of(self.rx_fd())
    }

    /// The receiving socket's buffer (SO_RCVBUF as the kernel keeps it:
    /// twice what was asked, capped at net.core.rmem_max, and charged with
    /// each packet's kernel overhead too), bytes; None when unknown.
    pub fn rx_buffer_bytes(&self) -> Option<u64> {
        meminfo(self.rx_fd()).map(|i| i[SK_MEMINFO_RCVBUF] as u64)
    }

    #[cfg(test)]
    /// The UDP socket's drop count (in raw capture mode, its filter at work).
    pub fn udp_socket_drops(&self) -> u64 {
        drops_of(self.sock.as_raw_fd())
    }

    #[cfg(test)]
    /// Raw capture mode: datagrams that arrived through the UDP socket
    /// instead (another ingress interface), ICRC unchecked.
    pub fn via_udp(&self) -> u64 {
        self.via_udp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An int socket option's value.
    fn sockopt(fd: RawFd, name: i32) -> i32 {
        let mut v: i32 = -1;
        let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `v`, ours.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                &mut v as *mut i32 as *mut _,
                &mut len,
            )
        };
        assert_eq!(rc, 0, "getsockopt({name})");
        v
    }

    #[test]
    fn busy_polling_is_set_or_its_refusal_named() {
        let mut a = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1).unwrap();
        let refused = a.set_busy_poll(50);
        for e in &refused {
            assert!(e.message().contains("BUSY_POLL)"), "{e}");
        }
        let named = |o: &str| refused.iter().any(|e| e.message().contains(o));
        if !named("(SO_BUSY_POLL)") {
            assert_eq!(sockopt(a.fd(), libc::SO_BUSY_POLL), 50);
        }
        if !named("(SO_PREFER_BUSY_POLL)") {
            assert_eq!(sockopt(a.fd(), libc::SO_PREFER_BUSY_POLL), 1);
        }
    }

    #[test]
    fn received_datagrams_carry_the_kernels_receive_stamp_when_asked() {
        let lo = Ipv4Addr::LOCALHOST;
        let mut a = UdpIo::bind(SocketAddrV4::new(lo, 0), 4).unwrap();
        let mut b = UdpIo::bind(SocketAddrV4::new(lo, 0), 4).unwrap();
        let to = a.local_addr().unwrap();
        let mut next = |a: &mut UdpIo| -> u64 {
            b.send_to(to, &[vec![7u8; 64]]).unwrap();
            for _ in 0..10_000 {
                if a.recv_batch().unwrap() == 1 {
                    return a.datagram(0).rx_ns;
                }
                std::thread::yield_now();
            }
            panic!("the datagram never came");
        };
        assert_eq!(next(&mut a), 0, "not asked: no stamp");
        a.enable_rx_timestamps().unwrap();
        let before = crate::server::latency::now_ns();
        let stamp = next(&mut a);
        let after = crate::server::latency::now_ns();
        assert!(
            before <= stamp && stamp <= after,
            "{before} <= {stamp} <= {after}"
        );
    }

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
                let d = a.datagram(i);
                assert_eq!(d.from, b.local_addr().unwrap());
                assert!(!d.truncated);
                got.push(d.bytes().to_vec());
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
