//! Server handles: create, connect, host params, callback, stats, stop,
//! destroy. A handle is an id in the handle registry (`handles.rs`), which
//! holds the handle's strong count of the server core; each loan token holds
//! another (see frame.rs), so the slab outlives destroy until the last token
//! is released, and a stale handle is refused, never dereferenced.

use std::ffi::{c_char, c_int, c_void};

use super::device::rocev2_device;
use super::frame::{rocev2_frame, to_frame};
use super::guard::{copy_out, deref_mut, fn_name, guard, guard_or, null, slice, BoxHandle};
use super::handles::{self, core_ref, rocev2_server};
use super::sized::{init_sized, read_sized, write_sized, SizedStruct};
use super::status::rocev2_status;
use crate::config::{ConnectParams, ServerConfig};
use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::{Server, Stats};

/// Server settings. Fill with `rocev2_server_config_init(&cfg, sizeof cfg)`,
/// then adjust.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_server_config {
    /// The caller's sizeof(rocev2_server_config), set by rocev2_server_config_init.
    pub struct_size: u32,
    /// Bytes per receive slot, the largest frame (default 9000; 1..2^30).
    pub max_payload: u32,
    /// Number of receive slots (default 256; 1..65536; slab < 4 GiB).
    pub rx_queue_depth: u32,
    /// Most the receive thread busy-polls before it blocks, microseconds (default 50; 0 never;
    /// adaptive below it: spins while packets come within it, blocks at once on an idle or slow link;
    /// on a paced link, where spinning brings no more frames than napping, naps up to 200 us instead).
    pub spin_us: u32,
    /// How long stop waits for a running frame callback before detaching, ms (default 5000).
    pub stop_timeout_ms: u32,
    /// CPU to pin the receive thread to, or -1 (default) for none.
    pub cpu_affinity: i32,
    /// verbs: 1 = also register the slab with remote-write access so the MR
    /// has a valid rkey (what rogue reports); the QP still grants no remote
    /// access. Default 0 (least privilege).
    pub mr_remote_write: u32,
    /// 1 = measure the ACK turnaround and the frame delivery latency into
    /// rocev2_stats' histogram fields (soft backend; the kernel stamps each
    /// received packet, the receive thread reads the clock per ACK batch
    /// and per frame). Default 0: off, no cost. The verbs backend refuses
    /// 1 (ROCEV2_ERR_UNSUPPORTED: its NIC ACKs). Since 2.3.
    pub measure_latency: u32,
    /// Check the FPGA's frame counter (immediate bits \[31:8\], surf's
    /// addrCount: +1 per frame, wrapping to 0 at its AddrWrapCount) on
    /// every delivered frame, modulo this (1..2^24); gaps and resets are
    /// counted in rocev2_stats (counter_gaps, counter_gap_frames,
    /// counter_resets) and logged once each. Default 0: not checked (for
    /// FPGAs that put other things there). Since 2.4.
    pub counter_wrap: u32,
}

/// What the FPGA is programmed with (rogue's getters). Set `struct_size` to
/// sizeof(rocev2_host_params) before the call; the library writes at most
/// that many bytes and sets it to the bytes written.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct rocev2_host_params {
    /// In: the caller's sizeof(rocev2_host_params). Out: bytes written.
    pub struct_size: u32,
    /// Host QP number (24 bits).
    pub qpn: u32,
    /// Host receive PSN (rogue getRqPsn).
    pub rq_psn: u32,
    /// Host send PSN (rogue getSqPsn). surf programs the FPGA's send PSN with
    /// this value, so pass it as `fpga_rq_psn` to complete_connection.
    pub sq_psn: u32,
    /// MR length in bytes (max_payload * rx_queue_depth, < 2^32).
    pub mr_len: u32,
    /// MR (slab) virtual address.
    pub mr_addr: u64,
    /// MR rkey (the MR grants no remote access).
    pub mr_rkey: u32,
    /// Host GID, raw bytes.
    pub gid: [u8; 16],
    /// Host GID as text, "0000:0000:0000:0000:0000:ffff:0a00:0001" (NUL-terminated).
    pub gid_str: [c_char; 40],
    /// UDP port the host receives on (4791; the bound port on the soft backend).
    pub udp_port: u16,
}

/// Counters. Set `struct_size` to sizeof(rocev2_stats) before the call; the
/// library fills at most that many bytes and sets it to the bytes written.
/// Fields documented "soft" stay 0 on the verbs backend.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct rocev2_stats {
    /// In: size of the caller's struct. Out: bytes written.
    pub struct_size: u32,
    /// Reserved, 0.
    pub reserved: u32,
    /// Frames delivered.
    pub frames: u64,
    /// Payload bytes delivered.
    pub bytes: u64,
    /// Loans released.
    pub releases: u64,
    /// Slots re-posted after release.
    pub reposts: u64,
    /// Re-post calls (batches).
    pub repost_batches: u64,
    /// Times the receive thread blocked waiting.
    pub parks: u64,
    /// Completions with an error status.
    pub completion_errors: u64,
    /// Flush completions (QP in error; the thread ends).
    pub flush_errors: u64,
    /// Completions with zero or oversized length (dropped).
    pub bad_length: u64,
    /// Completions that were not a receive with immediate (dropped).
    pub unexpected_opcode: u64,
    /// Release calls with an unknown or released token.
    pub invalid_releases: u64,
    /// Frame callbacks that panicked (Rust consumers only).
    pub callback_panics: u64,
    /// soft: packets received.
    pub packets_rx: u64,
    /// soft: packets sent.
    pub packets_tx: u64,
    /// soft: ACKs sent.
    pub acks_tx: u64,
    /// soft: RNR NAKs sent.
    pub rnr_naks_tx: u64,
    /// soft: PSN sequence error NAKs sent.
    pub seq_naks_tx: u64,
    /// soft: invalid request NAKs sent.
    pub invalid_naks_tx: u64,
    /// soft: duplicate packets.
    pub duplicates: u64,
    /// soft: packets ahead of the expected PSN.
    pub out_of_sequence: u64,
    /// soft: packets for another QP or from another address.
    pub foreign_packets: u64,
    /// soft: malformed packets.
    pub malformed: u64,
    /// soft: packets with a bad ICRC.
    pub icrc_errors: u64,
    /// soft: packets whose ICRC could not be checked.
    pub icrc_unchecked: u64,
    /// Slots on loan right now.
    pub loans_outstanding: u64,
    /// soft: packets whose ICRC was verified (raw capture mode). Since 1.1.
    pub icrc_checked: u64,
    /// soft: packets received straight into their slot (no copy). Since 1.1.
    pub payload_direct: u64,
    /// soft: packets copied into their slot after a missed landing guess
    /// (loss, reordering, a change of frame size). Since 1.1.
    pub payload_copied: u64,
    /// soft: packets the kernel dropped, the receive socket's buffer being
    /// full (the sender resends them). Since 1.1.
    pub socket_drops: u64,
    /// The link's state: ROCEV2_LINK_CREATED, _CONNECTED, _ERROR (see
    /// rocev2_server_end_cause) or _STOPPED. Since 2.1 (the fields from here
    /// on are written when struct_size covers them).
    pub link_state: u32,
    /// Reserved, 0. Since 2.1.
    pub reserved2: u32,
    /// Microseconds since the last packet from the FPGA (soft: any datagram
    /// from its address; verbs: any completion); UINT64_MAX before the
    /// first. Since 2.1.
    pub us_since_last_packet: u64,
    /// Microseconds since the last frame was delivered; UINT64_MAX before
    /// the first. Since 2.1.
    pub us_since_last_frame: u64,
    /// soft: packets further from the expected PSN than any sender window
    /// allows (dropped, not ACKed). Since 2.1.
    pub stale_packets: u64,
    /// Peer restarts (the FPGA started over at the connection's first PSN,
    /// re-programmed after a reload), logged with a warning. soft: the
    /// server re-synchronised, nothing lost. verbs (since 2.3): seen in the
    /// port's duplicate_request counter; the NIC dropped the restarted
    /// stream, see lost_frames_estimate. Since 2.1.
    pub peer_restarts: u64,
    /// Times the receive thread napped: slept briefly, then took what came
    /// (a paced sender, whose rate spinning would not raise; see
    /// spin_us). Since 2.2.
    pub naps: u64,
    /// verbs: frames estimated lost to peer restarts (the NIC ACKed them as
    /// old duplicates and delivered none; the FPGA believes them
    /// delivered). Since 2.3.
    pub lost_frames_estimate: u64,
    /// verbs: stale-peer verdicts (out-of-sequence requests and no delivery
    /// for 50 ms: the FPGA sends PSNs ahead of the expected one), each
    /// logged with its remedy. Since 2.3.
    pub stale_peers: u64,
    /// verbs: 1 while a stale-peer verdict holds (cleared when delivery
    /// resumes), else 0. Since 2.3.
    pub peer_stale: u64,
    /// 1 when restarted and stale peers are watched (soft: always; verbs:
    /// when the port's hw_counters exist), 0 when not (said once in the log
    /// at connect). Since 2.3.
    pub peer_watched: u64,
    /// Soft, with measure_latency: from the kernel's receive stamp of each packet that asked for an ACK to the ACK covering it leaving: samples (0: not measured). Since 2.3.
    pub ack_turnaround_count: u64,
    /// ack_turnaround: median, ns (quantiles within 3.2%). Since 2.3.
    pub ack_turnaround_p50_ns: u64,
    /// ack_turnaround: 99th percentile, ns. Since 2.3.
    pub ack_turnaround_p99_ns: u64,
    /// ack_turnaround: 99.9th percentile, ns. Since 2.3.
    pub ack_turnaround_p999_ns: u64,
    /// ack_turnaround: the largest sample, ns. Since 2.3.
    pub ack_turnaround_max_ns: u64,
    /// With measure_latency: from the kernel's receive stamp of a frame's last packet to the callback's entry or the poll's return: samples (0: not measured). Since 2.3.
    pub delivery_count: u64,
    /// delivery: median, ns (quantiles within 3.2%). Since 2.3.
    pub delivery_p50_ns: u64,
    /// delivery: 99th percentile, ns. Since 2.3.
    pub delivery_p99_ns: u64,
    /// delivery: 99.9th percentile, ns. Since 2.3.
    pub delivery_p999_ns: u64,
    /// delivery: the largest sample, ns. Since 2.3.
    pub delivery_max_ns: u64,
    /// Gaps in the FPGA's frame counter (with counter_wrap set): delivered
    /// frames whose counter skipped numbers, each logged once with the
    /// positions. Since 2.4.
    pub counter_gaps: u64,
    /// Frames the FPGA numbered that never arrived: the numbers the gaps
    /// skipped, in all. Since 2.4.
    pub counter_gap_frames: u64,
    /// Resets of the FPGA's frame counter: back to 0 before the wrap (a
    /// re-armed or restarted FPGA), each logged once. Since 2.4.
    pub counter_resets: u64,
    /// Duplicating-peer verdicts: duplicates nearly as many as the frames
    /// delivered over a window (surf's sticky half-bandwidth latch: the FPGA
    /// sends every message twice; soft: the duplicate counter, verbs: the
    /// port's duplicate_request), each logged once with its remedy (toggle
    /// the FPGA's TxEn or soft-reset it). Since 2.4.
    pub duplicating_peers: u64,
    /// 1 while a duplicating-peer verdict holds, else 0. Since 2.4.
    pub duplicating_peer: u64,
    /// RNR storms: RNR NAKs sent above 100 a second over a window (soft:
    /// rnr_naks_tx; verbs: the port's send_rnr_err / out_of_buffer), each
    /// logged once with what to check. Since 2.4.
    pub rnr_storms: u64,
    /// 1 while an RNR storm verdict holds, else 0. Since 2.4.
    pub rnr_storm: u64,
}

/// rocev2_stats.link_state: created, the connection not complete yet.
pub const ROCEV2_LINK_CREATED: u32 = 0;
/// rocev2_stats.link_state: connected, the receive thread runs.
pub const ROCEV2_LINK_CONNECTED: u32 = 1;
/// rocev2_stats.link_state: ended on an error; rocev2_server_end_cause says why.
pub const ROCEV2_LINK_ERROR: u32 = 2;
/// rocev2_stats.link_state: stopped by rocev2_server_stop.
pub const ROCEV2_LINK_STOPPED: u32 = 3;

const _: () = {
    use crate::server::LinkState;
    assert!(ROCEV2_LINK_CREATED == LinkState::Created as u32);
    assert!(ROCEV2_LINK_CONNECTED == LinkState::Connected as u32);
    assert!(ROCEV2_LINK_ERROR == LinkState::Error as u32);
    assert!(ROCEV2_LINK_STOPPED == LinkState::Stopped as u32);
};

/// Called on the receive thread for every frame. The frame is on loan: release
/// `frame->token` exactly once (here or later, from any thread). `frame`
/// itself (the struct, not the payload) is valid only during the call; its
/// struct_size is sizeof(rocev2_frame) of this library. Must not throw or
/// longjmp. May call rocev2_server_stop (not destroy) on its server.
pub type rocev2_frame_callback =
    Option<unsafe extern "C" fn(user_data: *mut c_void, frame: *const rocev2_frame)>;

// SAFETY (the three impls): #[repr(C)], start with u32 struct_size, plain
// integers only.
unsafe impl SizedStruct for rocev2_server_config {
    const NAME: &'static str = "rocev2_server_config";
    // ABI 2.0's struct ended before measure_latency.
    const SMALLEST: usize = std::mem::offset_of!(rocev2_server_config, measure_latency);
    const READ: bool = true;
}
unsafe impl SizedStruct for rocev2_host_params {
    const NAME: &'static str = "rocev2_host_params";
    const SMALLEST: usize = 4;
    const READ: bool = false;
}
unsafe impl SizedStruct for rocev2_stats {
    const NAME: &'static str = "rocev2_stats";
    const SMALLEST: usize = 4;
    const READ: bool = false;
}

/// Reads and validates a caller's server config (NULL = the defaults):
/// the config and its `mr_remote_write` flag (a device setting in Rust).
///
/// # Safety
/// `cfg` is NULL or points to `cfg->struct_size` readable bytes.
pub(crate) unsafe fn server_config_from(
    cfg: *const rocev2_server_config,
) -> Result<(ServerConfig, bool)> {
    let mut sc = ServerConfig::default();
    let mut remote_write = false;
    if !cfg.is_null() {
        // SAFETY: non-null, struct_size readable bytes (the caller's contract).
        let c = unsafe { read_sized(cfg, rocev2_server_config::default(), "cfg") }?;
        sc.max_payload = c.max_payload;
        sc.rx_queue_depth = c.rx_queue_depth;
        sc.spin_us = c.spin_us;
        sc.stop_timeout_ms = c.stop_timeout_ms;
        remote_write = c.mr_remote_write != 0;
        sc.counter_wrap = c.counter_wrap;
        sc.measure_latency = match c.measure_latency {
            0 => false,
            1 => true,
            n => {
                return Err(Error::invalid(format!(
                    "measure_latency must be 0 (off) or 1 (on); got {n}"
                )))
            }
        };
        sc.cpu_affinity = match c.cpu_affinity {
            -1 => None,
            n if n >= 0 => Some(n as u32),
            n => {
                return Err(Error::invalid(format!(
                    "cpu_affinity must be -1 (not pinned) or a CPU number; got {n}"
                )))
            }
        };
    }
    sc.validate()?;
    Ok((sc, remote_write))
}

impl Default for rocev2_server_config {
    fn default() -> Self {
        let d = ServerConfig::default();
        rocev2_server_config {
            struct_size: std::mem::size_of::<rocev2_server_config>() as u32,
            max_payload: d.max_payload,
            rx_queue_depth: d.rx_queue_depth,
            spin_us: d.spin_us,
            stop_timeout_ms: d.stop_timeout_ms,
            cpu_affinity: -1,
            mr_remote_write: 0,
            measure_latency: 0,
            counter_wrap: d.counter_wrap,
        }
    }
}

/// Fills `cfg` (`size` = the caller's `sizeof(rocev2_server_config)`) with
/// defaults: max_payload 9000, rx_queue_depth 256, spin_us 50,
/// stop_timeout_ms 5000, cpu_affinity -1, mr_remote_write 0, measure_latency 0,
/// counter_wrap 0. Writes exactly
/// `size` bytes (zero beyond the fields this library knows) and sets
/// `struct_size` to `size`.
///
/// Thread safety: any thread; `cfg` is the caller's.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_config_init(
    cfg: *mut rocev2_server_config,
    size: usize,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: cfg is NULL or has `size` writable bytes (API contract).
        unsafe { init_sized(cfg, size, rocev2_server_config::default()) }
    })
}

/// Creates a server on `dev`: allocates the slab, registers it, creates the
/// CQ and the RC QP (state INIT), queries the GID at the device's GID index
/// (an all-zero GID is rejected with a message naming index and device) and
/// draws random 24-bit PSNs. `cfg` NULL means defaults; `cfg->struct_size`
/// may be any size from the ABI-2 one up (a larger struct's unknown tail must
/// be zero). On success `*out` owns the server: destroy it with
/// rocev2_server_destroy. Create/destroy (not open/close): the server and
/// its QP and slab are made here.
///
/// Thread safety: any thread, concurrently with any call (a device may host
/// servers created from several threads).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_create(
    dev: *const rocev2_device,
    cfg: *const rocev2_server_config,
    out: *mut *mut rocev2_server,
) -> rocev2_status {
    guard(fn_name!(), || {
        // SAFETY: checked pointers, valid per the API contract.
        let out = unsafe { deref_mut(out, "out") }?;
        *out = std::ptr::null_mut();
        // Arguments first (so a bad config is reported as such), then the handle.
        // SAFETY: cfg is NULL or valid per the API contract.
        let (sc, remote_write) = unsafe { server_config_from(cfg) }?;
        // SAFETY: as above (a handle from rocev2_device_open).
        let dev = unsafe { rocev2_device::borrow(dev, "dev") }?;
        let core = Server::create_core(&dev.with_mr_remote_write(remote_write), &sc)?;
        *out = handles::register(core);
        Ok(())
    })
}

/// Sets the FPGA's GID (16 bytes; IPv4-mapped ::ffff:a.b.c.d, see
/// rocev2_gid_parse). Before complete_connection. Soft: from here on the
/// server's socket takes this FPGA's packets (they wait for
/// complete_connection); ROCEV2_ERR_INVALID_ARGUMENT when another server of this
/// process on the same address and port receives from that FPGA address
/// (docs/operations.md, "Several FPGAs on one host").
///
/// Thread safety: any thread; not concurrently with
/// rocev2_server_complete_connection or rocev2_server_destroy on the same
/// server.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_set_fpga_gid(
    srv: *mut rocev2_server,
    gid: *const u8,
) -> rocev2_status {
    guard(fn_name!(), || {
        let core = core_ref(srv)?;
        // SAFETY: gid is NULL or points to 16 readable bytes (API contract).
        let raw = unsafe { slice(gid, 16, "gid") }?;
        core.set_fpga_gid(Gid::from_slice(raw)?)
    })
}

/// Reads the host parameters for programming the FPGA into `out` (size
/// protocol: see rocev2_host_params).
///
/// Thread safety: any thread, concurrently with any call but destroy.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_get_host_params(
    srv: *const rocev2_server,
    out: *mut rocev2_host_params,
) -> rocev2_status {
    guard(fn_name!(), || {
        let core = core_ref(srv)?;
        let h = core.host_params();
        let mut gid_str = [0 as c_char; 40];
        let text = h.gid.to_string();
        // SAFETY: gid_str has 40 writable bytes.
        unsafe { copy_out(&text, gid_str.as_mut_ptr(), gid_str.len()) };
        let full = rocev2_host_params {
            struct_size: 0,
            qpn: h.qpn,
            rq_psn: h.rq_psn,
            sq_psn: h.sq_psn,
            mr_len: h.mr_len,
            mr_addr: h.mr_addr,
            mr_rkey: h.mr_rkey,
            gid: h.gid.0,
            gid_str,
            udp_port: h.udp_port,
        };
        // SAFETY: out is NULL or has struct_size writable bytes (API contract).
        unsafe { write_sized(out, full, "out") }
    })
}

/// Registers the frame callback (before complete_connection; once). Without
/// one, frames queue for rocev2_server_poll_frame. `user_data` is passed back
/// and must stay valid until the server is destroyed. (Was
/// rocev2_server_set_frame_callback before ABI 2.)
///
/// Thread safety: any thread, before complete_connection; the callback then
/// runs on the receive thread only, one frame at a time.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_register_frame_callback(
    srv: *mut rocev2_server,
    cb: rocev2_frame_callback,
    user_data: *mut c_void,
) -> rocev2_status {
    guard(fn_name!(), || {
        let core = core_ref(srv)?;
        let Some(f) = cb else {
            return Err(null("cb"));
        };
        struct User(*mut c_void);
        // SAFETY: the host promises user_data may be used from the receive thread.
        unsafe impl Send for User {}
        let user = User(user_data);
        core.set_frame_callback(move |frame| {
            let fr = to_frame(frame);
            let u = &user;
            // SAFETY: host function with the documented signature; fr lives
            // across the call.
            unsafe { f(u.0, &fr) };
        })
    })
}

/// Pre-posts every slot, moves the QP INIT->RTR->RTS and starts the receive
/// thread ("RoCEv2Server"). Once per server. `fpga_rq_psn` is the PSN of the
/// FPGA's first SEND: pass host_params.sq_psn (surf programs the FPGA with
/// sq_psn = host SQ PSN). `pmtu` 1..5 (1=256 .. 5=4096), `min_rnr_timer` 0..31
/// (IBA table 45; 1 = 0.01 ms, 12 = 0.64 ms).
///
/// Thread safety: any thread, once per server; not concurrently with
/// set_fpga_gid, register_frame_callback or destroy on the same server.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_complete_connection(
    srv: *mut rocev2_server,
    fpga_qpn: u32,
    fpga_rq_psn: u32,
    pmtu: u32,
    min_rnr_timer: u32,
) -> rocev2_status {
    guard(fn_name!(), || {
        let p = ConnectParams::new(fpga_qpn, fpga_rq_psn, pmtu, min_rnr_timer)?;
        core_ref(srv)?.complete_connection(&p)
    })
}

/// Reads the counters into `out` (size protocol: see rocev2_stats).
///
/// Thread safety: any thread, concurrently with any call but destroy.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_get_stats(
    srv: *const rocev2_server,
    out: *mut rocev2_stats,
) -> rocev2_status {
    guard(fn_name!(), || {
        let core = core_ref(srv)?;
        let full = rocev2_stats::from(&core.stats());
        // SAFETY: out is NULL or has struct_size writable bytes (API contract).
        unsafe { write_sized(out, full, "out") }
    })
}

/// The C struct of a stats snapshot: a flat field copy (`struct_size` is
/// set by `write_sized`).
impl From<&Stats> for rocev2_stats {
    fn from(s: &Stats) -> Self {
        let soft = s.soft();
        let verbs = s.verbs();
        rocev2_stats {
            struct_size: 0,
            reserved: 0,
            frames: s.frames,
            bytes: s.bytes,
            releases: s.releases,
            reposts: s.reposts,
            repost_batches: s.repost_batches,
            parks: s.parks,
            completion_errors: s.completion_errors,
            flush_errors: s.flush_errors,
            bad_length: s.bad_length,
            unexpected_opcode: s.unexpected_opcode,
            invalid_releases: s.invalid_releases,
            callback_panics: s.callback_panics,
            packets_rx: soft.packets_rx,
            packets_tx: soft.packets_tx,
            acks_tx: soft.acks_tx,
            rnr_naks_tx: soft.rnr_naks_tx,
            seq_naks_tx: soft.seq_naks_tx,
            invalid_naks_tx: soft.invalid_naks_tx,
            duplicates: soft.duplicates,
            out_of_sequence: soft.out_of_sequence,
            foreign_packets: soft.foreign_packets,
            malformed: soft.malformed,
            icrc_errors: soft.icrc_errors,
            icrc_unchecked: soft.icrc_unchecked,
            loans_outstanding: s.loans_outstanding,
            icrc_checked: soft.icrc_checked,
            payload_direct: soft.payload_direct,
            payload_copied: soft.payload_copied,
            socket_drops: soft.socket_drops,
            link_state: s.link.code(),
            reserved2: 0,
            us_since_last_packet: micros_or_max(s.since_last_packet),
            us_since_last_frame: micros_or_max(s.since_last_frame),
            stale_packets: soft.stale_packets,
            peer_restarts: s.peer_restarts(),
            naps: s.naps,
            lost_frames_estimate: verbs.lost_frames_estimate,
            stale_peers: verbs.stale_peers,
            peer_stale: verbs.stale,
            peer_watched: match s.backend {
                crate::BackendStats::Soft(_) => 1,
                crate::BackendStats::Verbs(v) => v.watched,
            },
            ack_turnaround_count: s.ack_turnaround.count,
            ack_turnaround_p50_ns: s.ack_turnaround.p50_ns,
            ack_turnaround_p99_ns: s.ack_turnaround.p99_ns,
            ack_turnaround_p999_ns: s.ack_turnaround.p999_ns,
            ack_turnaround_max_ns: s.ack_turnaround.max_ns,
            delivery_count: s.delivery_latency.count,
            delivery_p50_ns: s.delivery_latency.p50_ns,
            delivery_p99_ns: s.delivery_latency.p99_ns,
            delivery_p999_ns: s.delivery_latency.p999_ns,
            delivery_max_ns: s.delivery_latency.max_ns,
            counter_gaps: s.counter_gaps,
            counter_gap_frames: s.counter_gap_frames,
            counter_resets: s.counter_resets,
            duplicating_peers: s.duplicating_peers,
            duplicating_peer: s.duplicating_peer,
            rnr_storms: s.rnr_storms,
            rnr_storm: s.rnr_storm,
        }
    }
}

fn micros_or_max(d: Option<std::time::Duration>) -> u64 {
    d.map_or(u64::MAX, |d| d.as_micros().min(u64::MAX as u128 - 1) as u64)
}

/// Why the link is down, for an operator, copied into `buf` (`len` bytes,
/// NUL-terminated when len > 0, truncated if needed; the caller's): the
/// receive thread's end cause (a QP error with its completion status, a
/// failing socket, "stopped" after rocev2_server_stop) or why
/// complete_connection failed. Returns the full length without the NUL
/// (size a buffer with `rocev2_server_end_cause(srv, NULL, 0) + 1`); 0 while
/// the link is created or connected, and for a NULL server. Since 2.1.
///
/// Thread safety: any thread, concurrently with any call but destroy.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_end_cause(
    srv: *const rocev2_server,
    buf: *mut c_char,
    len: usize,
) -> usize {
    guard_or(fn_name!(), 0, || {
        Ok(match core_ref(srv)?.end_cause() {
            // SAFETY: buf is NULL or has len writable bytes (API contract).
            Some(cause) => unsafe { copy_out(&cause, buf, len) },
            None => 0,
        })
    })
}

/// 1 while the receive thread runs, 0 otherwise (also for NULL).
///
/// Thread safety: any thread, concurrently with any call but destroy.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_is_running(srv: *const rocev2_server) -> c_int {
    // A NULL or stale handle is not running (and not an error).
    guard_or(fn_name!(), 0, || {
        Ok(core_ref(srv).map_or(0, |core| core.is_running() as c_int))
    })
}

/// Stops the server: no callback starts after it returns; the receive thread
/// is joined (detached when called from the callback, or after
/// stop_timeout_ms when a callback is blocked); frames queued for poll_frame
/// are released; the QP, CQ and MR are torn down. Loaned frames stay valid
/// until released. Idempotent.
///
/// Thread safety: any thread, also from the frame callback (then the thread
/// is detached, not joined); concurrently with any call but destroy.
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_stop(srv: *mut rocev2_server) -> rocev2_status {
    guard(fn_name!(), || {
        core_ref(srv)?.stop();
        Ok(())
    })
}

/// Stops (if needed) and releases the handle (NULL is ignored). Slab memory
/// stays valid until the last outstanding token is released; after destroy
/// the handle may only be passed to rocev2_server_release for such tokens
/// (a destroyed handle passed to anything else is refused with
/// ROCEV2_ERR_INVALID_ARGUMENT, destroyed twice it is logged; it is never
/// dereferenced).
/// Must not be called from the frame callback.
///
/// Thread safety: once per handle, from any thread but the receive thread,
/// after every other call on the handle has returned (release excepted).
#[no_mangle]
pub unsafe extern "C" fn rocev2_server_destroy(srv: *mut rocev2_server) {
    guard_or(fn_name!(), (), || {
        if srv.is_null() || handles::is_forked(srv) {
            // A forked child's copy of its parent's server: its threads are
            // not here and its locks may be taken; left alone.
            return Ok(());
        }
        match handles::unregister(srv) {
            Ok(core) => {
                core.stop();
                drop(core);
                handles::forget_if_dead(srv);
            }
            Err(e) => log::error!("rocev2_server_destroy: {e}"),
        }
        Ok(())
    })
}
