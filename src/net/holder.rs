//! Binding a port several servers share (`SO_REUSEPORT`), and, when a bind
//! fails because the port is taken, who holds it: the kernel (rdma_rxe
//! listens on UDP 4791 at every address), this process, another process
//! (named), or another user. Read from /proc/net/udp and /proc/*/fd.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::FromRawFd;

use super::setsockopt_int;
use crate::error::Error;

/// A UDP socket bound to `addr` with `SO_REUSEPORT` set first: sockets of
/// this user that set it too share the address and port.
pub(super) fn shared_socket(addr: SocketAddrV4) -> std::io::Result<UdpSocket> {
    // SAFETY: plain syscall; the result is checked and owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh socket we own from here on (closed on drop).
    let sock = unsafe { UdpSocket::from_raw_fd(fd) };
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1, "SO_REUSEPORT")
        .map_err(|e| std::io::Error::other(e.message().to_string()))?;
    let sa = super::from_v4(&addr);
    // SAFETY: binds our socket to a valid sockaddr_in of the right size.
    let rc = unsafe {
        libc::bind(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sock)
}

/// The error for a failed bind of `addr`: for a port in use, who holds it
/// and what to do.
pub(super) fn bind_error(addr: SocketAddrV4, e: std::io::Error, shared: bool) -> Error {
    let hint = match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(" — {}", holder(addr, shared)),
        std::io::ErrorKind::AddrNotAvailable => {
            " — the address is not configured on this host (see `ip -4 addr`)".to_string()
        }
        std::io::ErrorKind::PermissionDenied => {
            " — ports below 1024 need root or CAP_NET_BIND_SERVICE".to_string()
        }
        _ => String::new(),
    };
    Error::new(
        crate::error::ErrorKind::Io,
        format!("binding UDP {addr} failed: {e}{hint}"),
    )
}

/// Who holds `addr`'s port, as a sentence with what to do.
fn holder(addr: SocketAddrV4, shared: bool) -> String {
    let what_to_do = "pick another udp_port (0 = any free port) or bind another address";
    let Some(h) = find_holder(addr) else {
        return format!("another socket holds it (not found in /proc/net/udp): {what_to_do}");
    };
    let owner = owner_of(h.inode);
    if owner.is_none() && kernel_holds(h.inode, addr.port()) {
        let rxe = std::path::Path::new("/sys/module/rdma_rxe").exists();
        return if rxe {
            format!(
                "the kernel holds it: rdma_rxe (a soft-RoCE device, `rdma link show`) listens on \
                 UDP {} at every address. Use the verbs backend on that device, or remove it \
                 (`rdma link delete rxe0`), or {what_to_do}",
                addr.port()
            )
        } else {
            format!(
                "the kernel holds it (a kernel socket, e.g. a tunnel on that port): {what_to_do}"
            )
        };
    }
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    let share = if shared {
        if h.uid != me {
            format!(
                "; sockets share a port only when all set SO_REUSEPORT and belong to one user \
                 (it is uid {}, this process uid {me})",
                h.uid
            )
        } else {
            "; it does not share the port (no SO_REUSEPORT: not a rocev2 server of this \
             version)"
                .to_string()
        }
    } else {
        String::new()
    };
    let who = match owner {
        Some(pid) if pid == std::process::id() => "this process".to_string(),
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("another process, pid {pid} ({})", comm.trim())
        }
        None => format!("another process (of uid {}; its pid is not visible)", h.uid),
    };
    format!(
        "{who} holds it (a socket on {}){share}: {what_to_do}",
        h.local
    )
}

/// True when the socket with `inode` (no process has it open) is the
/// kernel's: inode 0, or RoCEv2's port while rdma_rxe is loaded (its tunnel
/// socket has an inode no process holds).
fn kernel_holds(inode: u64, port: u16) -> bool {
    inode == 0 || (port == 4791 && std::path::Path::new("/sys/module/rdma_rxe").exists())
}

/// A socket from /proc/net/udp.
struct Holder {
    local: SocketAddrV4,
    uid: u32,
    inode: u64,
}

/// The socket bound to `addr`'s port at its address or the wildcard.
fn find_holder(addr: SocketAddrV4) -> Option<Holder> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (ip, port) = f.get(1)?.split_once(':')?;
        // The address as the kernel prints a __be32: its bytes in memory order.
        let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes());
        let port = u16::from_str_radix(port, 16).ok()?;
        let holds = port == addr.port() && (ip == *addr.ip() || ip.is_unspecified());
        holds.then_some(Holder {
            local: SocketAddrV4::new(ip, port),
            uid: f.get(7)?.parse().ok()?,
            inode: f.get(9)?.parse().ok()?,
        })
    })
}

/// The process with socket `inode` open (one this process may look into).
fn owner_of(inode: u64) -> Option<u32> {
    let link = format!("socket:[{inode}]");
    let mine = std::process::id();
    let pids = std::fs::read_dir("/proc").ok()?.filter_map(|e| {
        let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
        Some(pid)
    });
    // This process first: the common case and the cheapest.
    std::iter::once(mine)
        .chain(pids.filter(|&p| p != mine))
        .find(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                    .any(|t| t.as_os_str() == link.as_str())
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_held_in_this_process_without_sharing_is_named() {
        let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(at) = plain.local_addr().unwrap() else {
            unreachable!()
        };
        let e = super::super::UdpIo::bind_shared(at, 1).err().unwrap();
        let m = e.message();
        assert!(m.contains("this process holds it"), "{m}");
        assert!(m.contains("no SO_REUSEPORT"), "{m}");
        assert!(m.contains("pick another udp_port"), "{m}");
    }

    #[test]
    fn shared_binds_share_and_a_plain_bind_names_this_process() {
        let a =
            super::super::UdpIo::bind_shared(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0), 1).unwrap();
        let at = a.local_addr().unwrap();
        let b = super::super::UdpIo::bind_shared(at, 1).expect("a second shared bind");
        assert_eq!(b.local_addr().unwrap(), at);
        let e = super::super::UdpIo::bind(at, 1).err().unwrap();
        assert!(e.message().contains("this process holds it"), "{e}");
    }

    #[test]
    fn a_port_held_by_another_process_names_it() {
        // A child that holds a plain socket on a port we then ask for.
        let plain = UdpSocket::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(at) = plain.local_addr().unwrap() else {
            unreachable!()
        };
        drop(plain);
        let code = format!(
            "import socket,sys,time; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); \
             s.bind(('127.0.0.1',{})); print('up',flush=True); sys.stdin.read()",
            at.port()
        );
        let Ok(mut child) = std::process::Command::new("python3")
            .args(["-c", &code])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            eprintln!("no python3: skipped");
            return;
        };
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let e = super::super::UdpIo::bind_shared(at, 1).err();
        let _ = child.kill();
        let _ = child.wait();
        if line.trim() != "up" {
            eprintln!("the child could not bind {at} (taken meanwhile): skipped");
            return;
        }
        let e = e.expect("the port is held");
        let m = e.message();
        assert!(
            m.contains(&format!("another process, pid {}", child.id())),
            "{m}"
        );
        assert!(m.contains("python3"), "{m}");
    }
}
