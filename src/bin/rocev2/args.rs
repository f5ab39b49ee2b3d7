//! Typed, range-checked option values: numbers (decimal or 0x hex) within a
//! range, seconds, channel lists, fault specs, QPNs read from stdin, GIDs.
//! clap reports a bad value naming the flag, the value and the valid range.
//! Also the check clap cannot make across options: the slab's size.

use std::ffi::OsStr;
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use clap::builder::TypedValueParser;
use clap::error::ErrorKind;
use rocev2::emulator::Faults;

use crate::Fail;

/// Largest 24-bit value (QP numbers and PSNs).
pub const MAX_24BIT: u64 = rocev2::wire::MASK_24 as u64;
/// Largest receive slot (bytes).
pub const MAX_PAYLOAD: u64 = rocev2::config::MAX_PAYLOAD_LIMIT as u64;
/// Largest receive queue depth (slots).
pub const MAX_DEPTH: u64 = rocev2::config::MAX_RX_QUEUE_DEPTH as u64;
/// Longest duration accepted, in seconds (one year).
pub const MAX_SECONDS: f64 = 365.0 * 86400.0;

/// Parses `text` as a u64: decimal, or hex with a 0x prefix.
pub fn parse_u64(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => t.parse().ok(),
    }
}

fn invalid(cmd: &clap::Command, arg: Option<&clap::Arg>, value: &str, why: &str) -> clap::Error {
    let name = arg.map_or_else(|| "value".to_string(), |a| a.to_string());
    let mut cmd = cmd.clone();
    cmd.error(
        ErrorKind::ValueValidation,
        format!("invalid value '{value}' for '{name}': {why}"),
    )
}

/// An integer option in `min..=max`, converted to `T` (which holds `max`).
#[derive(Clone)]
pub struct Num<T> {
    min: u64,
    max: u64,
    _t: PhantomData<fn() -> T>,
}

/// A [`Num`] parser for `min..=max`.
pub fn num<T>(min: u64, max: u64) -> Num<T> {
    Num {
        min,
        max,
        _t: PhantomData,
    }
}

impl<T: TryFrom<u64> + Clone + Send + Sync + 'static> TypedValueParser for Num<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let text = value.to_string_lossy();
        let range = if self.max == u64::MAX {
            format!("at least {}", self.min)
        } else if self.max == MAX_24BIT {
            format!("{}..={} (24 bits, 0x{:x})", self.min, self.max, self.max)
        } else {
            format!("{}..={}", self.min, self.max)
        };
        let n = parse_u64(&text).ok_or_else(|| {
            invalid(
                cmd,
                arg,
                &text,
                &format!("not a number (decimal or 0x hex); valid: {range}"),
            )
        })?;
        if n < self.min || n > self.max {
            return Err(invalid(
                cmd,
                arg,
                &text,
                &format!("{n} is out of range; valid: {range}"),
            ));
        }
        T::try_from(n)
            .map_err(|_| invalid(cmd, arg, &text, &format!("out of range; valid: {range}")))
    }
}

/// A duration in seconds: finite, greater than 0 and at most a year.
pub fn seconds(text: &str) -> Result<f64, String> {
    let s: f64 = text
        .trim()
        .parse()
        .map_err(|_| "not a number of seconds (e.g. 0.5, 10)".to_string())?;
    if !(s > 0.0 && s <= MAX_SECONDS) {
        return Err(format!(
            "{s} is out of range: seconds must be > 0 and <= {MAX_SECONDS}"
        ));
    }
    Ok(s)
}

/// A comma-separated list of channel numbers (0..=255), e.g. `0,1,2,3`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Channels(pub Vec<u8>);

impl FromStr for Channels {
    type Err = String;
    fn from_str(text: &str) -> Result<Channels, String> {
        let v = text
            .split(',')
            .map(|c| {
                c.trim()
                    .parse::<u8>()
                    .map_err(|_| format!("channel {:?} is not a number in 0..=255", c.trim()))
            })
            .collect::<Result<Vec<u8>, String>>()?;
        Ok(Channels(v))
    }
}

impl fmt::Display for Channels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u8::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

/// `--faults drop=P,dup=P,reorder=P,corrupt=P,skip=P,sticky-half`:
/// probabilities per packet (skip: per frame number), and surf's sticky-half
/// latch. Shown back in the same syntax.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultSpec {
    pub drop: f64,
    pub dup: f64,
    pub reorder: f64,
    pub corrupt: f64,
    pub skip: f64,
    pub sticky_half: bool,
}

impl FaultSpec {
    /// The emulator's fault settings with RNG seed `seed`.
    pub fn faults(&self, seed: u64) -> Faults {
        Faults {
            seed,
            drop: self.drop,
            duplicate: self.dup,
            reorder: self.reorder,
            corrupt: self.corrupt,
            skip: self.skip,
            sticky_half: self.sticky_half,
        }
    }
    /// True when any fault has a probability above 0.
    pub fn any(&self) -> bool {
        self.faults(0).any()
    }
}

impl FromStr for FaultSpec {
    type Err = String;
    fn from_str(spec: &str) -> Result<FaultSpec, String> {
        let mut f = FaultSpec::default();
        if spec.trim() == "none" {
            return Ok(f);
        }
        for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
            if part.trim() == "sticky-half" {
                f.sticky_half = true;
                continue;
            }
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("{part:?} is not fault=probability (e.g. drop=0.01) or sticky-half")
            })?;
            let p: f64 = v
                .trim()
                .parse()
                .map_err(|_| format!("{v:?} is not a probability (0..1)"))?;
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("{k}={v}: the probability must be in 0..1"));
            }
            match k.trim() {
                "drop" => f.drop = p,
                "dup" | "duplicate" => f.dup = p,
                "reorder" => f.reorder = p,
                "corrupt" => f.corrupt = p,
                "skip" => f.skip = p,
                _ => {
                    return Err(format!(
                        "unknown fault {k:?}: use drop, dup, reorder, corrupt, skip (=P) or \
                         sticky-half"
                    ))
                }
            }
        }
        Ok(f)
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all = [
            ("drop", self.drop),
            ("dup", self.dup),
            ("reorder", self.reorder),
            ("corrupt", self.corrupt),
            ("skip", self.skip),
        ];
        let mut set: Vec<String> = all
            .iter()
            .filter(|(_, p)| *p > 0.0)
            .map(|(k, p)| format!("{k}={p}"))
            .collect();
        if self.sticky_half {
            set.push("sticky-half".to_string());
        }
        if set.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&set.join(","))
        }
    }
}

/// `--fpga-qpn N|-`: a 24-bit QPN, or `-` to read it from stdin after the
/// host params are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpnArg {
    Stdin,
    Qpn(u32),
}

/// `--fpga IP:QPN`: one FPGA of several a `recv` serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FpgaArg {
    pub gid: rocev2::Gid,
    pub qpn: u32,
}

/// Parses `IP:QPN` (10.0.0.11:0x11).
pub fn fpga(text: &str) -> Result<FpgaArg, String> {
    let (ip, qpn) = text.rsplit_once(':').ok_or_else(|| {
        format!(
            "{text:?} is not IP:QPN (e.g. 10.0.0.11:0x11: the FPGA's address and its QP number)"
        )
    })?;
    let ip: std::net::Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("{ip:?} in {text:?} is not an IPv4 address (10.0.0.11)"))?;
    Ok(FpgaArg {
        gid: rocev2::Gid::from_ipv4(ip),
        qpn: qpn24(qpn)?,
    })
}

/// Parses a 24-bit QPN (decimal or 0x hex).
pub fn qpn24(text: &str) -> Result<u32, String> {
    match parse_u64(text) {
        Some(n) if n <= MAX_24BIT => Ok(n as u32),
        Some(n) => Err(format!(
            "{n:#x} is out of range 0..=0xffffff (QP numbers are 24 bits)"
        )),
        None => Err(format!(
            "{:?} is not a QP number (decimal or 0x hex, 24 bits)",
            text.trim()
        )),
    }
}

impl FromStr for QpnArg {
    type Err = String;
    fn from_str(text: &str) -> Result<QpnArg, String> {
        if text.trim() == "-" {
            Ok(QpnArg::Stdin)
        } else {
            qpn24(text).map(QpnArg::Qpn)
        }
    }
}

/// An IPv4 socket address `IP:PORT`, with an example when the port (or
/// the form) is wrong.
pub fn socket_v4(text: &str) -> Result<std::net::SocketAddrV4, String> {
    if let Ok(a) = text.parse() {
        return Ok(a);
    }
    Err(match text.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => format!("{text:?} has no port: give IP:PORT, e.g. {ip}:4791"),
        Err(_) => format!("{text:?} is not IP:PORT, e.g. 127.0.0.1:4791"),
    })
}

/// A GID: an IPv4 address (IPv4-mapped GID) or a full GID.
pub fn gid(text: &str) -> Result<rocev2::Gid, String> {
    rocev2::Gid::parse(text).map_err(|_| {
        format!("{text:?} is not an IPv4 address (10.0.0.1) or a GID (0000:...:ffff:0a00:0001)")
    })
}

/// `--icrc-check`: what the soft backend does with received ICRCs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IcrcArg {
    Auto,
    Off,
    Require,
}

impl From<IcrcArg> for rocev2::IcrcCheck {
    fn from(a: IcrcArg) -> Self {
        match a {
            IcrcArg::Auto => rocev2::IcrcCheck::Auto,
            IcrcArg::Off => rocev2::IcrcCheck::Off,
            IcrcArg::Require => rocev2::IcrcCheck::Require,
        }
    }
}

/// The path MTU for code `pmtu` (already range-checked by clap).
/// Fault injection by the emulator (`demo`, `fpga-sim`).
#[derive(clap::Args, Debug, Clone)]
pub struct FaultArgs {
    /// Faults the emulator injects, per packet, e.g. drop=0.01,dup=0.01,reorder=0.01,corrupt=0.001; skip=P skips a frame number (immediate bits [31:8]) with probability P, as an FPGA that dropped a frame before sending; sticky-half: after the first RNR NAK every packet is sent twice (surf's sticky half-bandwidth latch)
    #[arg(
        long,
        value_name = "SPEC",
        default_value = "none",
        hide_default_value = true
    )]
    pub faults: FaultSpec,
    /// Seed of the fault injection
    #[arg(long, value_name = "N", default_value = "1", value_parser = num::<u64>(0, u64::MAX))]
    pub seed: u64,
}

impl FaultArgs {
    /// The emulator's fault settings.
    pub fn faults(&self) -> Faults {
        self.faults.faults(self.seed)
    }
    /// Whether any fault is set.
    pub fn any(&self) -> bool {
        self.faults.any()
    }
    /// `"{sep}faults {spec}"` when any fault is set, else "" (banner lines).
    pub fn suffix(&self, sep: &str) -> String {
        if self.any() {
            format!("{sep}faults {}", self.faults)
        } else {
            String::new()
        }
    }
}

/// The frames' shape: what `demo`, `fpga-sim` and `verbs-fpga` send.
#[derive(clap::Args, Debug, Clone)]
pub struct Shape {
    /// Bytes per frame (at least 8: the pattern carries the frame's sequence number)
    #[arg(long, value_name = "BYTES", default_value = "4096", value_parser = num::<u32>(8, MAX_PAYLOAD))]
    pub size: u32,
    /// Channels, used in turn (the immediate data's low byte)
    #[arg(long, value_name = "LIST", default_value = "0,1,2,3")]
    pub channels: Channels,
    /// Path MTU code: 1=256 2=512 3=1024 4=2048 5=4096 bytes
    #[arg(long, value_name = "1..5", default_value = "5", value_parser = num::<u32>(1, 5))]
    pub pmtu: u32,
}

pub fn mtu(pmtu: u32) -> rocev2::Mtu {
    rocev2::Mtu::from_code(pmtu).expect("--pmtu is range-checked 1..=5")
}

/// Checks what clap cannot: the slab (`size_flag` x --depth) fits 32 bits.
pub fn check_slab(max_payload: u32, depth: u32, size_flag: &str) -> Result<(), Fail> {
    let cfg = rocev2::ServerConfig {
        max_payload,
        rx_queue_depth: depth,
        ..Default::default()
    };
    if cfg.slab_bytes() > u32::MAX as u64 {
        return Err(Fail::usage(format!(
            "{size_flag} {max_payload} x --depth {depth} = {} bytes of receive slots exceeds \
             4 GiB - 1 (the FPGA's MR length field is 32 bits): lower {size_flag} or --depth",
            cfg.slab_bytes()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_accept_hex() {
        assert_eq!(parse_u64("0x4242"), Some(0x4242));
        assert_eq!(parse_u64("17"), Some(17));
        assert_eq!(parse_u64("-1"), None);
        assert_eq!(parse_u64("0xg"), None);
    }

    #[test]
    fn faults_round_trip_in_their_own_syntax() {
        let f: FaultSpec = "drop=0.01,duplicate=0.02,reorder=0.5".parse().unwrap();
        assert_eq!(f.to_string(), "drop=0.01,dup=0.02,reorder=0.5");
        assert_eq!(f.to_string().parse::<FaultSpec>().unwrap(), f);
        assert_eq!(FaultSpec::default().to_string(), "none");
        assert_eq!("none".parse::<FaultSpec>().unwrap(), FaultSpec::default());
        assert!("drop=2".parse::<FaultSpec>().unwrap_err().contains("0..1"));
        assert!("bogus=1"
            .parse::<FaultSpec>()
            .unwrap_err()
            .contains("unknown fault"));
        assert!("drop".parse::<FaultSpec>().is_err());
    }

    #[test]
    fn channels_and_qpns() {
        assert_eq!("0, 1,255".parse::<Channels>().unwrap().0, vec![0, 1, 255]);
        assert!("0,256".parse::<Channels>().is_err());
        assert_eq!("-".parse::<QpnArg>().unwrap(), QpnArg::Stdin);
        assert_eq!("0xffffff".parse::<QpnArg>().unwrap(), QpnArg::Qpn(0xffffff));
        assert!("0x1000000"
            .parse::<QpnArg>()
            .unwrap_err()
            .contains("24 bits"));
    }

    #[test]
    fn seconds_are_bounded() {
        assert_eq!(seconds("0.5"), Ok(0.5));
        for bad in ["0", "-1", "nan", "inf", "1e300", "x"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
