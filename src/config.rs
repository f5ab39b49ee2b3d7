//! Configuration: device and server settings, the connection parameters, the
//! path-MTU and RNR-timer code tables, and their validation. Error messages
//! match rogue's where rogue has one (its tests match substrings).

use crate::error::{Error, Result};
use crate::wire::MASK_24;

/// rogue's `DefaultMaxPayload`: bytes per receive slot.
pub const DEFAULT_MAX_PAYLOAD: u32 = 9000;
/// rogue's `DefaultRxQueueDepth`: number of receive slots.
pub const DEFAULT_RX_QUEUE_DEPTH: u32 = 256;
/// Default path MTU code (5 = 4096 bytes).
pub const DEFAULT_PMTU: u32 = 5;
/// rogue C++'s default min RNR timer code (1 = 0.01 ms). The pyrogue wrapper
/// uses 12 (0.64 ms), the value proven on hardware.
pub const DEFAULT_MIN_RNR_TIMER: u32 = 1;
/// Largest receive queue depth accepted (hardware limits may be lower; the
/// verbs backend also checks the device's `max_qp_wr`).
pub const MAX_RX_QUEUE_DEPTH: u32 = 65536;
/// Largest `ServerConfig::counter_wrap`: the FPGA's frame counter is
/// immediate bits \[31:8\], 24 bits.
pub const COUNTER_WRAP_LIMIT: u32 = 1 << 24;
/// Largest receive slot accepted (1 GiB).
pub const MAX_PAYLOAD_LIMIT: u32 = 1 << 30;
/// The UDP port of RoCEv2.
pub const ROCE_UDP_PORT: u16 = 4791;

/// Path MTU (libibverbs `enum ibv_mtu` codes 1..5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes (code 1)
    Mtu256 = 1,
    /// 512 bytes (code 2)
    Mtu512 = 2,
    /// 1024 bytes (code 3)
    Mtu1024 = 3,
    /// 2048 bytes (code 4)
    Mtu2048 = 4,
    /// 4096 bytes (code 5)
    Mtu4096 = 5,
}

impl Mtu {
    /// Every MTU, by code.
    pub const ALL: [Mtu; 5] = [
        Mtu::Mtu256,
        Mtu::Mtu512,
        Mtu::Mtu1024,
        Mtu::Mtu2048,
        Mtu::Mtu4096,
    ];

    /// The MTU for ibverbs code `code` (1..5), with rogue's error text otherwise.
    pub fn from_code(code: u32) -> Result<Mtu> {
        match code {
            1..=5 => Ok(Mtu::ALL[code as usize - 1]),
            _ => Err(Error::invalid(format!(
                "pmtu must be in the range 1..5 (1=256 2=512 3=1024 4=2048 5=4096); got {code}"
            ))),
        }
    }
    /// The MTU whose payload size is `bytes` (256, 512, 1024, 2048, 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Mtu::ALL.into_iter().find(|m| m.bytes() == bytes)
    }
    /// The ibverbs code (1..5).
    pub fn code(self) -> u32 {
        self as u32
    }
    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << self.code()
    }
}

/// IBA "Min RNR NAK Timer Field" codes (IBA vol 1, table 45), in microseconds.
/// Code 0 is the special 655.36 ms slot.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// A min RNR NAK timer code (0..31): how long the sender waits after an RNR NAK.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RnrTimer(u8);

impl RnrTimer {
    /// The timer for `code` (0..31), with a message naming the range otherwise.
    pub fn from_code(code: u32) -> Result<RnrTimer> {
        if code < 32 {
            Ok(RnrTimer(code as u8))
        } else {
            Err(Error::invalid(format!(
                "minRnrTimer must be an IB RNR timer code 0..31 (IBA table 45: 1=0.01 ms .. \
                 31=491.52 ms, 0=655.36 ms); got {code}"
            )))
        }
    }
    /// The smallest code whose wait is at least `us` microseconds (code 0,
    /// the longest wait, when `us` exceeds 491.52 ms).
    pub fn at_least_us(us: u32) -> RnrTimer {
        (1..32u8)
            .find(|&c| RNR_TIMER_US[c as usize] >= us)
            .map(RnrTimer)
            .unwrap_or(RnrTimer(0))
    }
    /// The code (0..31).
    pub fn code(self) -> u32 {
        self.0 as u32
    }
    /// The wait in microseconds.
    pub fn micros(self) -> u32 {
        RNR_TIMER_US[self.0 as usize]
    }
    /// The wait in milliseconds.
    pub fn millis(self) -> f64 {
        self.micros() as f64 / 1000.0
    }
}

/// Soft backend: what happens to the ICRC of received packets. A UDP socket
/// does not see the IP header the ICRC covers; a raw capture (AF_PACKET)
/// socket does, but needs CAP_NET_RAW.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IcrcCheck {
    /// Verify through raw capture when the process may (CAP_NET_RAW),
    /// otherwise receive on the UDP socket and count packets `icrc_unchecked`
    /// (logged once at server creation).
    #[default]
    Auto,
    /// Never capture: receive on the UDP socket, ICRCs unchecked.
    Off,
    /// Verify every ICRC; server creation fails if raw capture is not allowed.
    Require,
}

impl IcrcCheck {
    /// From the C API code (0 auto, 1 off, 2 require).
    pub fn from_code(code: u32) -> Result<IcrcCheck> {
        match code {
            0 => Ok(IcrcCheck::Auto),
            1 => Ok(IcrcCheck::Off),
            2 => Ok(IcrcCheck::Require),
            _ => Err(Error::invalid(format!(
                "icrc_check {code} is not valid: use 0 (auto), 1 (off) or 2 (require)"
            ))),
        }
    }
}

impl std::str::FromStr for IcrcCheck {
    type Err = Error;
    fn from_str(s: &str) -> Result<IcrcCheck> {
        match s {
            "auto" => Ok(IcrcCheck::Auto),
            "off" => Ok(IcrcCheck::Off),
            "require" => Ok(IcrcCheck::Require),
            _ => Err(Error::invalid(format!(
                "ICRC check {s:?} is not valid: use auto, off or require"
            ))),
        }
    }
}

/// Which device to open (rogue's `Core`), by transport: an ibverbs device,
/// or the userspace soft backend bound to an address. Text front ends (the C
/// API, Python, the CLI) name the soft backend `"soft"`:
/// [`DeviceConfig::by_name`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceConfig {
    /// An ibverbs device: a RoCE NIC or the kernel's rdma_rxe.
    Verbs(VerbsConfig),
    /// The userspace RoCEv2 responder on a UDP socket.
    Soft(SoftConfig),
}

/// An ibverbs device and how servers on it use it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerbsConfig {
    /// ibverbs device name (`mlx5_0`, `rxe0`, ...).
    pub name: String,
    /// ibverbs port number (default 1).
    pub ib_port: u8,
    /// GID table index of the host's RoCE v2 IPv4 address (default 0). Not
    /// checked at open (as in rogue); server creation checks it.
    pub gid_index: u8,
    /// Also register each server's slab with IBV_ACCESS_REMOTE_WRITE, so the
    /// MR has a valid rkey (rogue reports it; rdma_rxe gives rkey 0
    /// otherwise). The QP still grants no remote access (qp_access_flags =
    /// 0), so no peer can RDMA-write into the slab either way. Default false.
    pub mr_remote_write: bool,
}

impl VerbsConfig {
    /// The ibverbs device `name` with rogue's defaults (port 1, GID index 0).
    pub fn new(name: impl Into<String>) -> Self {
        VerbsConfig {
            name: name.into(),
            ib_port: 1,
            gid_index: 0,
            mr_remote_write: false,
        }
    }
}

/// The soft backend's socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoftConfig {
    /// Local IPv4 address to bind (a specific one: it is the host GID).
    pub bind_addr: String,
    /// UDP port to bind (default 4791; 0 picks a free port).
    pub udp_port: u16,
    /// UDP port the FPGA listens on, where ACKs go (default 4791, the RoCEv2
    /// port; 0 = reply to each packet's source port, for emulators on
    /// ephemeral ports).
    pub peer_udp_port: u16,
    /// Check received ICRCs (default [`IcrcCheck::Auto`]).
    pub icrc_check: IcrcCheck,
    /// Busy-poll the NIC's receive queue for up to this many microseconds
    /// when the socket is empty (`SO_BUSY_POLL`; default 0: off), and ask
    /// the kernel to prefer busy polling over interrupts
    /// (`SO_PREFER_BUSY_POLL`, which needs CAP_NET_ADMIN: without it, the
    /// refusal is logged once and busy polling still runs). Only a NIC's
    /// queue with a NAPI ID is polled: on loopback it does nothing. See
    /// docs/tuning.md, "What to tune".
    pub busy_poll_us: u32,
}

impl SoftConfig {
    /// Bound to `bind_addr`:4791, ACKs to the FPGA's port 4791.
    pub fn new(bind_addr: impl Into<String>) -> Self {
        SoftConfig {
            bind_addr: bind_addr.into(),
            udp_port: ROCE_UDP_PORT,
            peer_udp_port: ROCE_UDP_PORT,
            icrc_check: IcrcCheck::Auto,
            busy_poll_us: 0,
        }
    }
    /// On `bind_addr`, any free UDP port (reported in the host params), ACKs
    /// to each packet's source port: a server for an emulator on this host
    /// (tests, demos, benchmarks).
    pub fn ephemeral(bind_addr: impl Into<String>) -> Self {
        SoftConfig {
            udp_port: 0,
            peer_udp_port: 0,
            ..SoftConfig::new(bind_addr)
        }
    }
}

impl From<VerbsConfig> for DeviceConfig {
    fn from(c: VerbsConfig) -> Self {
        DeviceConfig::Verbs(c)
    }
}

impl From<SoftConfig> for DeviceConfig {
    fn from(c: SoftConfig) -> Self {
        DeviceConfig::Soft(c)
    }
}

impl DeviceConfig {
    /// The ibverbs device `name` with rogue's defaults.
    pub fn verbs(name: impl Into<String>) -> Self {
        VerbsConfig::new(name).into()
    }
    /// The soft backend on `bind_addr`:4791 (see [`SoftConfig::new`]).
    pub fn soft(bind_addr: impl Into<String>) -> Self {
        SoftConfig::new(bind_addr).into()
    }
    /// The soft backend on a free port (see [`SoftConfig::ephemeral`]).
    pub fn soft_ephemeral(bind_addr: impl Into<String>) -> Self {
        SoftConfig::ephemeral(bind_addr).into()
    }
    /// What text front ends mean by a device name: `"soft"` is the soft
    /// backend on 127.0.0.1:4791, anything else an ibverbs device.
    pub fn by_name(name: &str) -> Self {
        match name {
            "soft" => DeviceConfig::soft("127.0.0.1"),
            _ => DeviceConfig::verbs(name),
        }
    }
    /// The device name (`"soft"` for the soft backend).
    pub fn name(&self) -> &str {
        match self {
            DeviceConfig::Verbs(v) => &v.name,
            DeviceConfig::Soft(_) => "soft",
        }
    }

    /// Checks the fields that can be checked without a device.
    pub fn validate(&self) -> Result<()> {
        let DeviceConfig::Verbs(v) = self else {
            return Ok(());
        };
        if v.name.is_empty() {
            return Err(Error::invalid(
                "device name is empty: pass an ibverbs device name (see `rocev2 info` or \
                 `ibv_devices`) or \"soft\" for the userspace backend",
            ));
        }
        if v.ib_port == 0 {
            return Err(Error::invalid(
                "ib_port must be >= 1 (ibverbs ports count from 1); got 0",
            ));
        }
        Ok(())
    }
}

/// Server settings (slab geometry and receive-thread tuning).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Bytes per receive slot: the largest frame the FPGA may send (default 9000).
    pub max_payload: u32,
    /// Number of receive slots, each a posted receive (default 256).
    pub rx_queue_depth: u32,
    /// The most the receive thread busy-polls an empty completion queue
    /// before it arms the completion channel and blocks, in microseconds
    /// (default 50; 0 blocks at once: lowest CPU, highest wake-up latency).
    /// Below it the budget adapts (as Linux KVM's halt polling): a spin that
    /// finds the packet keeps it, a block that ends within `spin_us` doubles
    /// it, a longer block halves it down to 0 (block at once); so an idle
    /// link, or one slower than `spin_us` between packets, costs what
    /// blocking costs instead of a spin per gap. Whether to spin at all is
    /// judged by the frame rate it brings (trials of a few milliseconds,
    /// one a second once settled): a sender that waits for the host's ACKs
    /// (surf's 4-message window) keeps the spin; a paced sender, whose rate
    /// napping reaches too, gets a thread that naps (sleeps up to 200 us,
    /// sized to the slots and socket buffer, then takes the batch) and
    /// parks when a nap found nothing. 0 neither spins nor naps.
    pub spin_us: u32,
    /// How long `stop` waits for a frame callback that is still running before
    /// it detaches the receive thread instead of joining it, in milliseconds
    /// (default 5000).
    pub stop_timeout_ms: u32,
    /// Pin the receive thread to this CPU (default: not pinned).
    pub cpu_affinity: Option<u32>,
    /// Measure the ACK turnaround and the frame delivery latency into
    /// [`Stats`](crate::Stats)' histograms (soft backend; default off).
    /// The kernel then stamps each received packet (`SO_TIMESTAMPNS`) and
    /// the receive thread reads the clock once per ACK batch and once per
    /// frame; off, neither happens. The verbs backend refuses it (its NIC
    /// ACKs in hardware).
    pub measure_latency: bool,
    /// Check the FPGA's frame counter (immediate bits \[31:8\], surf's
    /// `addrCount`: +1 per SEND, wrapping to 0 at its `AddrWrapCount`
    /// register) on every delivered frame, modulo this (1..=2^24); 0 (the
    /// default) leaves it unchecked, for FPGAs that put other things there.
    /// Gaps (frames numbered and never sent) and resets (back to 0) are
    /// counted in [`Stats`](crate::Stats) and logged once each.
    pub counter_wrap: u32,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_payload: DEFAULT_MAX_PAYLOAD,
            rx_queue_depth: DEFAULT_RX_QUEUE_DEPTH,
            spin_us: 50,
            stop_timeout_ms: 5000,
            cpu_affinity: None,
            measure_latency: false,
            counter_wrap: 0,
        }
    }
}

impl ServerConfig {
    /// Total slab size in bytes (may exceed 4 GiB: see [`ServerConfig::validate`]).
    pub fn slab_bytes(&self) -> u64 {
        self.max_payload as u64 * self.rx_queue_depth as u64
    }
    /// Checks ranges; the slab must fit the FPGA's 32-bit MR length field.
    pub fn validate(&self) -> Result<()> {
        if self.max_payload == 0 || self.max_payload > MAX_PAYLOAD_LIMIT {
            return Err(Error::invalid(format!(
                "maxPayload must be in the range 1..{MAX_PAYLOAD_LIMIT} bytes; got {}",
                self.max_payload
            )));
        }
        if self.rx_queue_depth == 0 || self.rx_queue_depth > MAX_RX_QUEUE_DEPTH {
            return Err(Error::invalid(format!(
                "rxQueueDepth must be in the range 1..{MAX_RX_QUEUE_DEPTH}; got {}",
                self.rx_queue_depth
            )));
        }
        if self.counter_wrap > COUNTER_WRAP_LIMIT {
            return Err(Error::invalid(format!(
                "counterWrap must be 0 (the check off) or in the range 1..{COUNTER_WRAP_LIMIT} \
                 (the FPGA's AddrWrapCount: its counter is 24 bits); got {}",
                self.counter_wrap
            )));
        }
        let slab = self.slab_bytes();
        if slab > u32::MAX as u64 {
            return Err(Error::invalid(format!(
                "RX slab too large: {} * {} = {slab} exceeds 4 GiB (the FPGA's MR length field is \
                 32 bits): reduce maxPayload or rxQueueDepth",
                self.rx_queue_depth, self.max_payload
            )));
        }
        Ok(())
    }
}

/// What `complete_connection` needs from the FPGA side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// The FPGA's QP number (24 bits).
    pub fpga_qpn: u32,
    /// The first PSN the FPGA's SENDs carry: the host QP's RTR `rq_psn`.
    /// rogue calls it `fpgaRqPsn`; surf programs the FPGA's send PSN with the
    /// host SQ PSN, so pass [`HostParams::sq_psn`](crate::config::HostParams) (the
    /// default of every wrapper in this project).
    pub fpga_rq_psn: u32,
    /// Path MTU.
    pub pmtu: Mtu,
    /// Min RNR NAK timer the host advertises.
    pub min_rnr_timer: RnrTimer,
}

impl ConnectParams {
    /// Validated params from raw values (rogue's `completeConnection` argument checks).
    pub fn new(fpga_qpn: u32, fpga_rq_psn: u32, pmtu: u32, min_rnr_timer: u32) -> Result<Self> {
        let pmtu = Mtu::from_code(pmtu)?;
        let min_rnr_timer = RnrTimer::from_code(min_rnr_timer)?;
        if fpga_qpn > MASK_24 {
            return Err(Error::invalid(format!(
                "fpgaQpn must be a 24-bit QP number (0..0xffffff); got {fpga_qpn:#x}"
            )));
        }
        if fpga_rq_psn > MASK_24 {
            return Err(Error::invalid(format!(
                "fpgaRqPsn must be a 24-bit PSN (0..0xffffff); got {fpga_rq_psn:#x}"
            )));
        }
        Ok(ConnectParams {
            fpga_qpn,
            fpga_rq_psn,
            pmtu,
            min_rnr_timer,
        })
    }
}

/// The host parameters the FPGA is programmed with (rogue's getters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostParams {
    /// Host QP number (24 bits).
    pub qpn: u32,
    /// Host receive PSN (rogue `getRqPsn`); surf programs it as the FPGA's rq_psn.
    pub rq_psn: u32,
    /// Host send PSN (rogue `getSqPsn`); surf programs it as the FPGA's sq_psn,
    /// so the FPGA's SENDs start here.
    pub sq_psn: u32,
    /// MR (slab) virtual address.
    pub mr_addr: u64,
    /// MR length in bytes (max_payload * rx_queue_depth, < 2^32).
    pub mr_len: u32,
    /// MR rkey (the MR grants no remote access; informational).
    pub mr_rkey: u32,
    /// Host GID.
    pub gid: crate::gid::Gid,
    /// UDP port the host receives on (4791 on verbs; the bound port on soft).
    pub udp_port: u16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_and_bytes() {
        let table = [(1, 256), (2, 512), (3, 1024), (4, 2048), (5, 4096)];
        for (code, bytes) in table {
            let m = Mtu::from_code(code).unwrap();
            assert_eq!(m.code(), code);
            assert_eq!(m.bytes(), bytes);
            assert_eq!(Mtu::from_bytes(bytes), Some(m));
        }
        for bad in [0, 6, 7, 255, u32::MAX] {
            let e = Mtu::from_code(bad).unwrap_err();
            assert_eq!(
                e.message(),
                format!(
                    "pmtu must be in the range 1..5 (1=256 2=512 3=1024 4=2048 5=4096); got {bad}"
                )
            );
        }
        assert_eq!(Mtu::from_bytes(1500), None);
    }

    #[test]
    fn rnr_timer_table_matches_iba_table_45() {
        // Spot values from the spec table and rogue's RoCEv2RnrTimer names.
        let spot = [
            (0, 655.36),
            (1, 0.01),
            (5, 0.06),
            (12, 0.64),
            (14, 1.28),
            (31, 491.52),
        ];
        for (code, ms) in spot {
            assert!((RnrTimer::from_code(code).unwrap().millis() - ms).abs() < 1e-9);
        }
        // Codes 1..31 strictly increase.
        for c in 2..32 {
            assert!(RNR_TIMER_US[c] > RNR_TIMER_US[c - 1]);
        }
        for c in 0..32 {
            assert_eq!(RnrTimer::from_code(c).unwrap().code(), c);
        }
        let e = RnrTimer::from_code(32).unwrap_err();
        assert!(e.message().contains("0..31"), "{e}");
        assert!(e.message().ends_with("got 32"), "{e}");
    }

    #[test]
    fn rnr_timer_at_least() {
        assert_eq!(RnrTimer::at_least_us(0).code(), 1);
        assert_eq!(RnrTimer::at_least_us(10).code(), 1);
        assert_eq!(RnrTimer::at_least_us(11).code(), 2);
        assert_eq!(RnrTimer::at_least_us(640).code(), 12);
        assert_eq!(RnrTimer::at_least_us(491_520).code(), 31);
        assert_eq!(RnrTimer::at_least_us(491_521).code(), 0);
    }

    #[test]
    fn server_config_validation() {
        assert!(ServerConfig::default().validate().is_ok());
        let c = ServerConfig {
            max_payload: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().message().contains("maxPayload"));
        let c = ServerConfig {
            rx_queue_depth: 0,
            ..Default::default()
        };
        assert!(c.validate().unwrap_err().message().contains("rxQueueDepth"));
        // Exactly 4 GiB - 1 passes... 65535 * 65537 = 2^32 - 1.
        let c = ServerConfig {
            max_payload: 65537,
            rx_queue_depth: 65535,
            ..Default::default()
        };
        assert_eq!(c.slab_bytes(), u32::MAX as u64);
        assert!(c.validate().is_ok());
        // ... and 4 GiB fails with rogue's text.
        let c = ServerConfig {
            max_payload: 65536,
            rx_queue_depth: 65536,
            ..Default::default()
        };
        let e = c.validate().unwrap_err();
        assert!(
            e.message()
                .starts_with("RX slab too large: 65536 * 65536 = 4294967296 exceeds 4 GiB"),
            "{e}"
        );
    }

    #[test]
    fn connect_params_validation() {
        let p = ConnectParams::new(0x12, 0xabcdef, 5, 12).unwrap();
        assert_eq!(p.pmtu, Mtu::Mtu4096);
        assert_eq!(p.min_rnr_timer.code(), 12);
        assert!(ConnectParams::new(0x1000000, 0, 5, 1)
            .unwrap_err()
            .message()
            .contains("fpgaQpn"));
        assert!(ConnectParams::new(1, 0x1000000, 5, 1)
            .unwrap_err()
            .message()
            .contains("fpgaRqPsn"));
        assert!(ConnectParams::new(1, 0, 0, 1)
            .unwrap_err()
            .message()
            .contains("pmtu must be in the range 1..5"));
        assert!(ConnectParams::new(1, 0, 5, 99)
            .unwrap_err()
            .message()
            .contains("minRnrTimer"));
    }

    #[test]
    fn device_config_validation() {
        let v = VerbsConfig::new("rxe0");
        assert_eq!((v.ib_port, v.gid_index, v.mr_remote_write), (1, 0, false));
        assert!(DeviceConfig::from(v).validate().is_ok());
        assert!(DeviceConfig::verbs("").validate().is_err());
        let d = DeviceConfig::from(VerbsConfig {
            ib_port: 0,
            ..VerbsConfig::new("mlx5_0")
        });
        assert!(d.validate().unwrap_err().message().contains("ib_port"));
        // Text front ends name the soft backend "soft".
        let s = SoftConfig::new("127.0.0.1");
        assert_eq!((s.udp_port, s.peer_udp_port), (4791, 4791));
        assert_eq!(DeviceConfig::by_name("soft"), DeviceConfig::Soft(s));
        assert_eq!(DeviceConfig::by_name("rxe0").name(), "rxe0");
    }
}
