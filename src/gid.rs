//! GIDs (RoCE v2 addresses): built from IPv4, printed in `ibv_devinfo` form,
//! parsed, mapped back to IPv4, and the RoCE v2 GID-table index detected from
//! sysfs the way the pyrogue wrapper does it.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use crate::error::{Error, ErrorKind, Result};

/// A 16-byte GID. RoCE v2 over IPv4 uses the IPv4-mapped IPv6 form `::ffff:a.b.c.d`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID of `ip`.
    pub fn from_ipv4(ip: Ipv4Addr) -> Gid {
        Gid(ip.to_ipv6_mapped().octets())
    }

    /// Parses `ibv_devinfo` / sysfs form (`0000:0000:0000:0000:0000:ffff:0a00:0001`),
    /// any IPv6 text form (`::ffff:10.0.0.1`), or a dotted IPv4 address.
    pub fn parse(text: &str) -> Result<Gid> {
        let t = text.trim();
        if let Ok(v4) = t.parse::<Ipv4Addr>() {
            return Ok(Gid::from_ipv4(v4));
        }
        if let Ok(v6) = t.parse::<Ipv6Addr>() {
            return Ok(Gid(v6.octets()));
        }
        Err(Error::invalid(format!(
            "cannot parse GID {text:?}: expected 8 colon-separated hex groups \
             (0000:0000:0000:0000:0000:ffff:0a00:0001), IPv6 text (::ffff:10.0.0.1) or an IPv4 address"
        )))
    }

    /// The GID from raw bytes; the slice must be 16 bytes (rogue's message otherwise).
    pub fn from_slice(bytes: &[u8]) -> Result<Gid> {
        let raw: [u8; 16] = bytes
            .try_into()
            .map_err(|_| Error::invalid(format!("GID must be 16 bytes, got {}", bytes.len())))?;
        Ok(Gid(raw))
    }

    /// The IPv4 address of an IPv4-mapped GID, else `None`.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        let b = &self.0;
        if b[..10].iter().all(|&x| x == 0) && b[10] == 0xff && b[11] == 0xff {
            Some(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
        } else {
            None
        }
    }

    /// True for the all-zero GID (never a valid RoCE address).
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl fmt::Display for Gid {
    /// `ibv_devinfo` form: 8 groups of 4 lower-case hex digits (rogue's `getGid`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// The IPv4 of an IPv4-mapped GID string (pyrogue `_host_ip_from_gid`): a
/// text [`Gid::parse`] reads (the one parser of GID text), written as exactly
/// 8 groups of hex digits with group 5 == `ffff`; `""` for anything else.
pub fn host_ip_from_gid(gid: &str) -> String {
    let t = gid.trim();
    let groups: Vec<&str> = t.split(':').collect();
    // 8 written groups: no `::` (which makes an empty one), no dotted quad.
    if groups.len() != 8 || groups.contains(&"") || !groups[5].eq_ignore_ascii_case("ffff") {
        return String::new();
    }
    match Gid::parse(t) {
        Ok(Gid(b)) => Ipv4Addr::new(b[12], b[13], b[14], b[15]).to_string(),
        Err(_) => String::new(),
    }
}

/// Checks that `<sysfs_root>/class/infiniband` lists `device`, with the texts
/// of [`Device::open`](crate::Device::open): "No RDMA devices found on this
/// host" when it lists none, `"RDMA device '<name>' not found"` otherwise. GID
/// auto-detection runs this first, so a host without RDMA says so instead of
/// failing to find a GID.
pub fn check_device_listed(sysfs_root: &Path, device: &str) -> Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(sysfs_root.join("class/infiniband"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        return Err(Error::new(
            ErrorKind::NoDevice,
            "No RDMA devices found on this host (use device \"soft\" for the userspace backend)",
        ));
    }
    if names.iter().any(|n| n == device) {
        return Ok(());
    }
    names.sort();
    Err(Error::new(
        ErrorKind::DeviceNotFound,
        format!(
            "RDMA device '{device}' not found (devices on this host: {})",
            names.join(", ")
        ),
    ))
}

/// Finds the GID-table index of the RoCE v2, IPv4-mapped GID on the same /24 as
/// `fpga_ip`, reading `<sysfs_root>/class/infiniband/<device>/ports/<port>/`
/// (`gid_attrs/types/<i>` and `gids/<i>`), lowest index first. The root is
/// `/sys` in production; tests pass a fake tree laid out as the kernel does.
pub fn detect_gid_index(
    sysfs_root: &Path,
    device: &str,
    fpga_ip: Ipv4Addr,
    ib_port: u8,
) -> Option<u32> {
    let port = sysfs_root
        .join("class/infiniband")
        .join(device)
        .join("ports")
        .join(ib_port.to_string());
    let mut indices: Vec<u32> = std::fs::read_dir(port.join("gid_attrs/types"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    indices.sort_unstable();
    let subnet = &fpga_ip.octets()[..3];
    indices.into_iter().find(|idx| {
        let typ = std::fs::read_to_string(port.join(format!("gid_attrs/types/{idx}")));
        if typ.map(|t| t.trim() != "RoCE v2").unwrap_or(true) {
            return false;
        }
        let Ok(text) = std::fs::read_to_string(port.join(format!("gids/{idx}"))) else {
            return false;
        };
        let groups: Vec<&str> = text.trim().split(':').collect();
        if groups.len() != 8 || !groups[5].eq_ignore_ascii_case("ffff") {
            return false;
        }
        match Gid::parse(text.trim()).ok().and_then(|g| g.ipv4()) {
            Some(ip) => &ip.octets()[..3] == subnet,
            None => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn from_ipv4_and_display() {
        let g = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(&g.0[..10], &[0u8; 10]);
        assert_eq!(&g.0[10..], &[0xff, 0xff, 10, 0, 0, 1]);
        assert_eq!(g.to_string(), "0000:0000:0000:0000:0000:ffff:0a00:0001");
        assert_eq!(g.ipv4(), Some(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(
            format!("{g:?}"),
            "Gid(0000:0000:0000:0000:0000:ffff:0a00:0001)"
        );
    }

    #[test]
    fn parse_forms() {
        let want = Gid::from_ipv4(Ipv4Addr::new(192, 168, 2, 10));
        for text in [
            "0000:0000:0000:0000:0000:ffff:c0a8:020a",
            "0000:0000:0000:0000:0000:FFFF:C0A8:020A",
            "::ffff:192.168.2.10",
            "::ffff:c0a8:20a",
            "192.168.2.10",
            " 0000:0000:0000:0000:0000:ffff:c0a8:020a\n",
        ] {
            assert_eq!(Gid::parse(text).unwrap(), want, "{text}");
        }
        let ll = Gid::parse("fe80:0000:0000:0000:0202:c9ff:fe00:0001").unwrap();
        assert_eq!(ll.ipv4(), None);
        assert!(!ll.is_zero());
        for bad in [
            "",
            "xyz",
            "1:2:3",
            "0000:0000:0000:0000:0000:ffff:c0a8:020a:0000",
        ] {
            assert!(Gid::parse(bad).is_err(), "{bad}");
        }
        assert!(Gid::default().is_zero());
        // Round trip through the display form.
        assert_eq!(Gid::parse(&want.to_string()).unwrap(), want);
    }

    #[test]
    fn from_slice_checks_length() {
        assert!(Gid::from_slice(&[0u8; 16]).is_ok());
        assert_eq!(
            Gid::from_slice(&[0u8; 15]).unwrap_err().message(),
            "GID must be 16 bytes, got 15"
        );
        assert_eq!(
            Gid::from_slice(&[0u8; 17]).unwrap_err().message(),
            "GID must be 16 bytes, got 17"
        );
    }

    #[test]
    fn host_ip_from_gid_cases() {
        // The cases of rogue's tests/protocols/test_rocev2.py.
        assert_eq!(
            host_ip_from_gid("0000:0000:0000:0000:0000:ffff:0a00:0001"),
            "10.0.0.1"
        );
        assert_eq!(
            host_ip_from_gid("0000:0000:0000:0000:0000:FFFF:c0a8:0164"),
            "192.168.1.100"
        );
        assert_eq!(
            host_ip_from_gid("fe80:0000:0000:0000:0202:c9ff:fe00:0001"),
            ""
        );
        assert_eq!(host_ip_from_gid(""), "");
        assert_eq!(host_ip_from_gid("0000:0000:0000:0000:0000:ffff:0a00"), "");
        assert_eq!(
            host_ip_from_gid("0000:0000:0000:0000:0000:ffff:zzzz:0001"),
            ""
        );
        assert_eq!(host_ip_from_gid("::ffff:10.0.0.1"), "");
        // 8 pieces, but one is the empty group of `::`: not 8 written groups.
        assert_eq!(host_ip_from_gid("0::0:0:0:ffff:0a00:0001"), "");
        assert_eq!(
            host_ip_from_gid("0000:0000:0000:0000:0000:ffff:10.0.0.1"),
            ""
        );
    }

    /// A fake sysfs tree laid out as the kernel does.
    struct FakeSysfs(PathBuf);
    impl FakeSysfs {
        fn new(tag: &str) -> Self {
            let dir =
                std::env::temp_dir().join(format!("rocev2-sysfs-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            FakeSysfs(dir)
        }
        fn gid(&self, dev: &str, port: u8, idx: u32, typ: &str, gid: &str) -> &Self {
            let p = self.0.join(format!("class/infiniband/{dev}/ports/{port}"));
            std::fs::create_dir_all(p.join("gid_attrs/types")).unwrap();
            std::fs::create_dir_all(p.join("gids")).unwrap();
            std::fs::write(p.join(format!("gid_attrs/types/{idx}")), format!("{typ}\n")).unwrap();
            std::fs::write(p.join(format!("gids/{idx}")), format!("{gid}\n")).unwrap();
            self
        }
    }
    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn detect_gid_index_picks_roce_v2_on_subnet() {
        let fs = FakeSysfs::new("pick");
        fs.gid(
            "mlx5_0",
            1,
            0,
            "IB/RoCE v1",
            "fe80:0000:0000:0000:0202:c9ff:fe00:0001",
        )
        .gid(
            "mlx5_0",
            1,
            1,
            "RoCE v2",
            "fe80:0000:0000:0000:0202:c9ff:fe00:0001",
        )
        .gid(
            "mlx5_0",
            1,
            2,
            "IB/RoCE v1",
            "0000:0000:0000:0000:0000:ffff:0a00:0001",
        )
        .gid(
            "mlx5_0",
            1,
            3,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:0a00:0001",
        )
        .gid(
            "mlx5_0",
            1,
            10,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:c0a8:0101",
        );
        let fpga = Ipv4Addr::new(10, 0, 0, 20);
        assert_eq!(detect_gid_index(&fs.0, "mlx5_0", fpga, 1), Some(3));
        // Numeric, not lexical, order: index 10 is found for the other subnet.
        assert_eq!(
            detect_gid_index(&fs.0, "mlx5_0", Ipv4Addr::new(192, 168, 1, 5), 1),
            Some(10)
        );
        // No match on another subnet, device or port.
        assert_eq!(
            detect_gid_index(&fs.0, "mlx5_0", Ipv4Addr::new(172, 16, 0, 1), 1),
            None
        );
        assert_eq!(detect_gid_index(&fs.0, "mlx5_1", fpga, 1), None);
        assert_eq!(detect_gid_index(&fs.0, "mlx5_0", fpga, 2), None);
    }

    #[test]
    fn check_device_listed_names_what_is_missing() {
        let fs = FakeSysfs::new("listed");
        let e = check_device_listed(&fs.0, "mlx5_0").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoDevice);
        assert!(
            e.message()
                .starts_with("No RDMA devices found on this host"),
            "{e}"
        );
        fs.gid(
            "rxe1",
            1,
            0,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:0a00:0001",
        )
        .gid(
            "rxe0",
            1,
            0,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:0a00:0002",
        );
        assert!(check_device_listed(&fs.0, "rxe0").is_ok());
        let e = check_device_listed(&fs.0, "mlx5_0").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::DeviceNotFound);
        assert_eq!(
            e.message(),
            "RDMA device 'mlx5_0' not found (devices on this host: rxe0, rxe1)"
        );
    }

    #[test]
    fn detect_gid_index_skips_unreadable_and_v1() {
        let fs = FakeSysfs::new("skip");
        fs.gid(
            "rxe0",
            1,
            0,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:0a00:0001",
        )
        .gid(
            "rxe0",
            1,
            1,
            "RoCE v2",
            "0000:0000:0000:0000:0000:ffff:0a4d:0001",
        );
        // A types entry whose gid file is missing is skipped, not fatal.
        let p = fs.0.join("class/infiniband/rxe0/ports/1");
        std::fs::write(p.join("gid_attrs/types/2"), "RoCE v2\n").unwrap();
        std::fs::write(p.join("gid_attrs/types/notanumber"), "RoCE v2\n").unwrap();
        assert_eq!(
            detect_gid_index(&fs.0, "rxe0", Ipv4Addr::new(10, 77, 0, 2), 1),
            Some(1)
        );
        assert_eq!(
            detect_gid_index(&fs.0, "rxe0", Ipv4Addr::new(10, 0, 0, 9), 1),
            Some(0)
        );
    }
}
