"""The C declarations: the library's structs, callbacks and function
signatures as ctypes sees them (include/rocev2.h), checked against the
library at load (:func:`rocev2._loader._check_layouts`)."""
from __future__ import annotations

import ctypes
import struct
import typing


ABI_VERSION = 2


class _DeviceConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("ib_port", ctypes.c_uint8),
                ("gid_index", ctypes.c_uint8), ("udp_port", ctypes.c_uint16),
                ("peer_udp_port", ctypes.c_uint16), ("icrc_check", ctypes.c_uint16),
                ("name", ctypes.c_char_p), ("bind_addr", ctypes.c_char_p),
                ("busy_poll_us", ctypes.c_uint32)]  # since 2.3


class _ServerConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("max_payload", ctypes.c_uint32),
                ("rx_queue_depth", ctypes.c_uint32), ("spin_us", ctypes.c_uint32),
                ("stop_timeout_ms", ctypes.c_uint32), ("cpu_affinity", ctypes.c_int32),
                ("mr_remote_write", ctypes.c_uint32),
                ("measure_latency", ctypes.c_uint32),  # since 2.3
                ("counter_wrap", ctypes.c_uint32)]  # since 2.4


class _HostParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("qpn", ctypes.c_uint32), ("rq_psn", ctypes.c_uint32),
                ("sq_psn", ctypes.c_uint32), ("mr_len", ctypes.c_uint32),
                ("mr_addr", ctypes.c_uint64), ("mr_rkey", ctypes.c_uint32),
                ("gid", ctypes.c_uint8 * 16), ("gid_str", ctypes.c_char * 40),
                ("udp_port", ctypes.c_uint16)]


FRAME_HAS_IMMEDIATE = 1  # rocev2_frame.flags (ROCEV2_FRAME_HAS_IMMEDIATE)
FRAME_RX_TIME_KERNEL = 2  # ROCEV2_FRAME_RX_TIME_KERNEL: rx_time_ns is the kernel's stamp (since 2.4)
FRAME_RX_TIME_NIC = 8  # ROCEV2_FRAME_RX_TIME_NIC: rx_time_ns is the NIC's completion stamp (since 2.4)


class _Frame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("data", ctypes.c_void_p), ("len", ctypes.c_uint32),
                ("channel", ctypes.c_uint32), ("immediate", ctypes.c_uint32),
                ("slot", ctypes.c_uint32), ("token", ctypes.c_uint64),
                ("rx_time_ns", ctypes.c_uint64)]  # since 2.4


# One rocev2_frame as Server.poll_frames reads a batch: all records in one
# struct.iter_unpack instead of a ctypes field read per field and frame.
_FRAME_RECORD = struct.Struct("=IIQIIIIQQ")
_STRUCT_SIZE = struct.Struct("=I")  # a record's first field
# A record as u64 words, and the token's word: the give-back path gathers
# the tokens with one strided copy.
_TOKEN_WORD, _RECORD_WORDS = _Frame.token.offset // 8, _FRAME_RECORD.size // 8
if ([getattr(_Frame, n).offset for n, *_ in _Frame._fields_] != [0, 4, 8, 16, 20, 24, 28, 32, 40]
        or _FRAME_RECORD.size != ctypes.sizeof(_Frame) or _FRAME_RECORD.size % 8):
    raise ImportError("rocev2: _Frame's layout differs from the batch record")


class _Batch:
    """What one poll_frames call fills: the rocev2_frame array, its bytes
    (and as u64s: ``words``), the count (and its ctypes reference), kept
    across calls; ``armed``: how many of the records a Frame took;
    ``tokens``: where the rest are gathered to be given back."""
    __slots__ = ("frames", "raw", "words", "got", "got_ref", "armed", "tokens", "token_words")

    def __init__(self, n: int):
        self.frames = (_Frame * n)()
        self.raw = memoryview(self.frames).cast("B")
        self.words = self.raw.cast("Q")
        self.got = ctypes.c_size_t(0)
        self.got_ref = ctypes.byref(self.got)
        self.armed = 0
        self.tokens = (ctypes.c_uint64 * n)()
        self.token_words = memoryview(self.tokens).cast("B").cast("Q")


_STAT_FIELDS = [
    "frames", "bytes", "releases", "reposts", "repost_batches", "parks",
    "completion_errors", "flush_errors", "bad_length", "unexpected_opcode",
    "invalid_releases", "callback_panics", "packets_rx", "packets_tx", "acks_tx",
    "rnr_naks_tx", "seq_naks_tx", "invalid_naks_tx", "duplicates",
    "out_of_sequence", "foreign_packets", "malformed", "icrc_errors",
    "icrc_unchecked", "loans_outstanding", "icrc_checked", "payload_direct",
    "payload_copied", "socket_drops",
]
# Since 2.1, after link_state (+ reserved2).
_STAT_FIELDS_2_1 = ["us_since_last_packet", "us_since_last_frame", "stale_packets", "peer_restarts"]
# Since 2.2.
_STAT_FIELDS_2_2 = ["naps"]
# Since 2.3: the verbs backend's verdicts on its peer (docs/operations.md).
_STAT_FIELDS_2_3_PEER = ["lost_frames_estimate", "stale_peers", "peer_stale", "peer_watched"]
# Since 2.3: the latency histograms (ServerCfg.measureLatency), nanoseconds.
_STAT_FIELDS_2_3 = [f"{h}_{q}" for h in ("ack_turnaround", "delivery")
                    for q in ("count", "p50_ns", "p99_ns", "p999_ns", "max_ns")]
# Since 2.4: the FPGA's frame counter check (ServerCfg.counterWrap) and link
# verdicts (docs/operations.md).
_STAT_FIELDS_2_4 = ["counter_gaps", "counter_gap_frames", "counter_resets",
                    "duplicating_peers", "duplicating_peer", "rnr_storms", "rnr_storm"]


class _Stats(ctypes.Structure):
    _fields_ = ([("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]
                + [(n, ctypes.c_uint64) for n in _STAT_FIELDS]
                + [("link_state", ctypes.c_uint32), ("reserved2", ctypes.c_uint32)]
                + [(n, ctypes.c_uint64) for n in _STAT_FIELDS_2_1 + _STAT_FIELDS_2_2
                                                   + _STAT_FIELDS_2_3_PEER + _STAT_FIELDS_2_3
                                                   + _STAT_FIELDS_2_4])


_FRAME_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Frame))
_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


def _declare(lib: ctypes.CDLL) -> None:
    S, P, U32, U64, I32 = ctypes.c_int, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_int32
    sig = {
        "rocev2_version": (ctypes.c_char_p, []),
        "rocev2_abi_version": (U32, []),
        "rocev2_last_error": (ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
        "rocev2_set_log_callback": (S, [_LOG_CB, P, ctypes.c_int]),
        "rocev2_device_config_init": (S, [ctypes.POINTER(_DeviceConfig), ctypes.c_size_t]),
        "rocev2_device_open": (S, [ctypes.POINTER(_DeviceConfig), ctypes.POINTER(P)]),
        "rocev2_device_close": (None, [P]),
        "rocev2_device_list": (S, [ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]),
        "rocev2_server_config_init": (S, [ctypes.POINTER(_ServerConfig), ctypes.c_size_t]),
        "rocev2_server_create": (S, [P, ctypes.POINTER(_ServerConfig), ctypes.POINTER(P)]),
        "rocev2_server_set_fpga_gid": (S, [P, ctypes.c_char_p]),
        "rocev2_server_get_host_params": (S, [P, ctypes.POINTER(_HostParams)]),
        "rocev2_server_register_frame_callback": (S, [P, _FRAME_CB, P]),
        "rocev2_server_complete_connection": (S, [P, U32, U32, U32, U32]),
        "rocev2_server_poll_frame": (S, [P, I32, ctypes.POINTER(_Frame)]),
        "rocev2_server_release": (S, [P, U64]),
        "rocev2_server_poll_frames": (S, [P, I32, ctypes.POINTER(_Frame), ctypes.c_size_t,
                                          ctypes.POINTER(ctypes.c_size_t)]),
        "rocev2_server_release_many": (S, [P, ctypes.POINTER(U64), ctypes.c_size_t]),
        "rocev2_server_get_stats": (S, [P, ctypes.POINTER(_Stats)]),
        "rocev2_server_is_running": (ctypes.c_int, [P]),
        "rocev2_server_end_cause": (ctypes.c_size_t, [P, ctypes.c_char_p, ctypes.c_size_t]),
        "rocev2_server_stop": (S, [P]),
        "rocev2_server_destroy": (None, [P]),
        "rocev2_gid_parse": (S, [ctypes.c_char_p, ctypes.c_char_p]),
        "rocev2_gid_format": (S, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
        "rocev2_gid_detect_index": (S, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint8,
                                        ctypes.c_char_p, ctypes.POINTER(U32)]),
        "rocev2_gid_host_ip": (S, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
        "rocev2_status_str": (ctypes.c_char_p, [ctypes.c_int]),
        "rocev2_struct_size": (ctypes.c_size_t, [U32]),
        "rocev2_server_config_check": (S, [ctypes.POINTER(_ServerConfig)]),
        "rocev2_pmtu_bytes": (S, [U32, ctypes.POINTER(U32)]),
        "rocev2_rnr_timer_us": (S, [U32, ctypes.POINTER(U32)]),
        "rocev2_pattern_check": (S, [P, ctypes.c_size_t, ctypes.POINTER(U64)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


# rocev2_struct_size(ROCEV2_STRUCT_*) -> the ctypes declaration of that struct.
_STRUCTS = {1: _DeviceConfig, 2: _ServerConfig, 3: _HostParams, 4: _Frame, 5: _Stats}
