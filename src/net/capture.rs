//! Raw capture: reading the soft backend's packets with their IP header from
//! an AF_PACKET socket behind a classic-BPF filter, so every received ICRC
//! can be checked (it covers the IP ID, which a UDP socket never shows).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::{setsockopt_int, UdpIo};
use crate::error::{Error, ErrorKind, Result};

impl UdpIo {
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
        check_link_type(&ifname)?;
        let raw = packet_socket(&ifname)?;
        // A connected socket (`bind_shared`, `connect_peer`) receives from
        // its peer only: the capture too.
        let peer = match self.sock.peer_addr() {
            Ok(std::net::SocketAddr::V4(p)) => Some(p),
            _ => None,
        };
        let prog = capture_filter(*local.ip(), local.port(), peer);
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
        let _ = setsockopt_int(
            raw.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            8 << 20,
            "SO_RCVBUF",
        );
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
}

impl UdpIo {
    /// Raw capture mode: passes only `peer`'s packets (port 0: any port of
    /// its address) from now on, as the connected UDP socket receives.
    pub(super) fn narrow_capture(&mut self, peer: SocketAddrV4) -> Result<()> {
        let local = self.local_addr()?;
        let Some(raw) = &self.raw else {
            return Ok(());
        };
        let prog = capture_filter(*local.ip(), local.port(), Some(peer));
        attach_filter(raw.as_raw_fd(), &prog, "the raw capture filter")
    }
}

/// True for a loopback link (type 772): nothing there merges packets before
/// the capture sees them (no NAPI GRO: a local sender's GSO datagram
/// reaches the capture whole either way).
pub(crate) fn is_loopback(ifname: &str) -> bool {
    link_type(ifname) == "772"
}

/// The link type of `ifname` (`/sys/class/net/*/type`; empty if unknown).
fn link_type(ifname: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/net/{ifname}/type"))
        .map(|t| t.trim().to_string())
        .unwrap_or_default()
}

/// Raw capture reads Ethernet (1) and loopback (772) links: a 14-byte link
/// header in front of the IP header (SOCK_RAW: the only packet socket type
/// that tells GSO super-packets' segment size).
fn check_link_type(ifname: &str) -> Result<()> {
    let hw = link_type(ifname);
    if matches!(hw.as_str(), "1" | "772") {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::Unsupported,
        format!(
            "raw capture (to check received ICRCs) reads Ethernet and loopback interfaces; \
             {ifname} has link type {hw:?}: set icrc_check to off"
        ),
    ))
}

/// A non-blocking AF_PACKET SOCK_RAW socket with virtio-net headers, bound
/// to no protocol yet: it receives nothing until bind() names one, after
/// its filter is attached, so no unfiltered packet (another link's data,
/// ACKs) is ever queued on it.
fn packet_socket(ifname: &str) -> Result<OwnedFd> {
    // SAFETY: plain syscall; the result is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(Error::new(
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                ErrorKind::Unsupported
            } else {
                ErrorKind::Io
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
    // Each packet comes behind a virtio-net header, which tells a GSO
    // super-packet (a sender on this host, over lo or a veth, is never
    // segmented) and its segment size, so its segments can be split and
    // each ICRC checked.
    setsockopt_int(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_VNET_HDR,
        1,
        "setsockopt(PACKET_VNET_HDR) on the raw capture socket",
    )?;
    // Loopback shows a tap each packet twice, once as it leaves: the filter
    // drops that copy, but only after the kernel cloned the packet for it on
    // the sending CPU (every FPGA packet from a sender on this host, every
    // ACK of ours). Ignoring outgoing packets skips the tap for them
    // (Linux 4.20+; on an older kernel the filter still drops them).
    if let Err(e) = setsockopt_int(
        fd,
        libc::SOL_PACKET,
        libc::PACKET_IGNORE_OUTGOING,
        1,
        "setsockopt(PACKET_IGNORE_OUTGOING) on the raw capture socket",
    ) {
        log::debug!("{e}; outgoing copies are dropped by the filter");
    }
    Ok(raw)
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

/// A filter that passes nothing (a socket that only sends).
pub(crate) const NOTHING: [libc::sock_filter; 1] = [libc::sock_filter {
    code: BPF_RET | BPF_K,
    jt: 0,
    jf: 0,
    k: 0,
}];

/// Where a check's jump goes when it decides: on a mismatch (`IfFalse`) or
/// a match (`IfTrue`) the packet is rejected; `No`: not a jump.
#[derive(Clone, Copy)]
enum Reject {
    No,
    IfFalse,
    IfTrue,
}

/// Classic BPF for a SOCK_RAW packet socket on an Ethernet or loopback link
/// (offsets from the 14-byte link header): accept unfragmented IPv4/UDP to
/// `ip`:`port` that is not our own outgoing copy (loopback shows each packet
/// twice); with `peer`, only from its address (and its port unless 0), as
/// the connected UDP socket beside it receives.
fn capture_filter(ip: Ipv4Addr, port: u16, peer: Option<SocketAddrV4>) -> Vec<libc::sock_filter> {
    const L: u32 = 14;
    use Reject::*;
    let mut steps = vec![
        (bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, L), No),
        (bpf(BPF_ALU | BPF_AND | BPF_K, 0, 0, 0xf0), No),
        (bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 0x40), IfFalse),
        (bpf(BPF_LD | BPF_B | BPF_ABS, 0, 0, L + 9), No),
        (bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 17), IfFalse),
        (bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, L + 16), No),
        (bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, u32::from(ip)), IfFalse),
    ];
    if let Some(p) = peer {
        steps.push((bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, L + 12), No));
        steps.push((
            bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, u32::from(*p.ip())),
            IfFalse,
        ));
    }
    steps.extend([
        (bpf(BPF_LD | BPF_H | BPF_ABS, 0, 0, L + 6), No),
        (bpf(BPF_JMP | BPF_JSET | BPF_K, 0, 0, 0x3fff), IfTrue),
        (bpf(BPF_LDX | BPF_B | BPF_MSH, 0, 0, L), No),
        (bpf(BPF_LD | BPF_H | BPF_IND, 0, 0, L + 2), No),
        (bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, port as u32), IfFalse),
    ]);
    if let Some(p) = peer.filter(|p| p.port() != 0) {
        steps.push((bpf(BPF_LD | BPF_H | BPF_IND, 0, 0, L), No));
        steps.push((
            bpf(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, p.port() as u32),
            IfFalse,
        ));
    }
    steps.extend([
        (bpf(BPF_LD | BPF_W | BPF_ABS, 0, 0, SKF_AD_PKTTYPE), No),
        (
            bpf(
                BPF_JMP | BPF_JEQ | BPF_K,
                0,
                0,
                libc::PACKET_OUTGOING as u32,
            ),
            IfTrue,
        ),
        (bpf(BPF_RET | BPF_K, 0, 0, 0x0004_0000), No),
    ]);
    // The reject (`ret 0`) follows the last step.
    let reject = steps.len();
    let mut prog: Vec<libc::sock_filter> = steps
        .into_iter()
        .enumerate()
        .map(|(i, (mut op, r))| {
            let to = (reject - i - 1) as u8;
            match r {
                No => {}
                IfFalse => op.jf = to,
                IfTrue => op.jt = to,
            }
            op
        })
        .collect();
    prog.push(bpf(BPF_RET | BPF_K, 0, 0, 0));
    prog
}

pub(crate) fn attach_filter(fd: RawFd, prog: &[libc::sock_filter], what: &str) -> Result<()> {
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
