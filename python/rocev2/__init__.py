"""rocev2: Python binding (pure ctypes) of librocev2, the RoCEv2 RC receive
server for FPGA data streams.

Offers what rogue's pyrogue wrapper (``pyrogue.protocols.RoCEv2Server``) offers,
without pyrogue: the Mtu / RnrTimer code tables, validated config dataclasses,
GID helpers and GID-index detection, and a :class:`Server` with rogue's getter
names (``getQpn``, ``getGid``, ...) plus snake_case ones.

Frames arrive on loan, zero-copy: ``frame.data`` is a memoryview into the
receive slab, valid until ``frame.release()`` (or the frame is garbage
collected). Use the pull API (``server.poll()``, ``for frame in
server.frames()``) or a callback (``server.set_frame_callback(fn)``).

The library is the copy ``pip install`` bundled in this package, unless
``$ROCEV2_LIBRARY`` names another (then only that one is tried); without a
bundled copy, the system loader's ``librocev2.so.2``. It is loaded at first
use: the module and its code tables (``Mtu``, ``RnrTimer``, ``Status``)
import without it; validation is the library's (``ServerCfg``,
``TransportCfg``, the GID helpers and ``pattern_check`` call it), so there is
one rule and one message for C, C++, Python and the CLI. At load the binding
checks its struct declarations and status codes against the library's
(``rocev2_struct_size``, ``rocev2_status_str``) and refuses an older library.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import enum
import ipaddress
import logging
import math
import os
import struct
import sys
import threading
import time
import typing
import weakref

__all__ = [
    "Rocev2Error", "Mtu", "RnrTimer", "PMTU_BYTES", "MIN_RNR_TIMER_MS",
    "ServerCfg", "TransportCfg", "HostParams", "Frame", "Server", "ChannelView",
    "ip_to_gid_bytes", "gid_bytes_to_str", "host_ip_from_gid", "parse_gid",
    "detect_gid_index", "validate_channel", "version", "abi_version",
    "DEFAULT_MAX_PAYLOAD", "DEFAULT_RX_QUEUE_DEPTH", "list_devices", "pattern_check",
    "forward_logs_to_python", "Status", "pmtu_bytes", "rnr_timer_us", "LinkState",
]

ABI_VERSION = 2
DEFAULT_MAX_PAYLOAD = 9000      # rogue C++ DefaultMaxPayload
DEFAULT_RX_QUEUE_DEPTH = 256    # rogue C++ DefaultRxQueueDepth

# ---------------------------------------------------------------------------
# Library loading and the C declarations
# ---------------------------------------------------------------------------

class Status(enum.IntEnum):
    """The library's status codes (``rocev2_status``; ROCEV2_OK,
    ROCEV2_ERR_<name>). Checked against the library at load."""
    OK = 0
    INVALID_ARGUMENT = 1
    NULL_POINTER = 2
    NO_DEVICE = 3
    DEVICE_NOT_FOUND = 4
    DEVICE = 5
    STATE = 6
    TIMEOUT = 7
    STOPPED = 8
    UNSUPPORTED = 9
    IO = 10
    NO_MEMORY = 11
    UNKNOWN_TOKEN = 12
    NOT_FOUND = 13
    BUFFER_TOO_SMALL = 14
    PANIC = 15
    INTERNAL = 16


class Rocev2Error(RuntimeError):
    """A failed library call: ``status`` (a :class:`Status` when the code is
    known, else the int), ``status_name`` and the library's message
    (``str(err)``)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        try:
            self.status = Status(status)
            self.status_name = self.status.name
        except ValueError:
            self.status = status
            self.status_name = f"status {status}"


# ServerCfg.icrcCheck -> rocev2_device_config.icrc_check (ROCEV2_ICRC_*).
_ICRC_CHECK = {"auto": 0, "off": 1, "require": 2}


class _DeviceConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("ib_port", ctypes.c_uint8),
                ("gid_index", ctypes.c_uint8), ("udp_port", ctypes.c_uint16),
                ("peer_udp_port", ctypes.c_uint16), ("icrc_check", ctypes.c_uint16),
                ("name", ctypes.c_char_p), ("bind_addr", ctypes.c_char_p)]


class _ServerConfig(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("max_payload", ctypes.c_uint32),
                ("rx_queue_depth", ctypes.c_uint32), ("spin_us", ctypes.c_uint32),
                ("stop_timeout_ms", ctypes.c_uint32), ("cpu_affinity", ctypes.c_int32),
                ("mr_remote_write", ctypes.c_uint32)]


class _HostParams(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("qpn", ctypes.c_uint32), ("rq_psn", ctypes.c_uint32),
                ("sq_psn", ctypes.c_uint32), ("mr_len", ctypes.c_uint32),
                ("mr_addr", ctypes.c_uint64), ("mr_rkey", ctypes.c_uint32),
                ("gid", ctypes.c_uint8 * 16), ("gid_str", ctypes.c_char * 40),
                ("udp_port", ctypes.c_uint16)]


FRAME_HAS_IMMEDIATE = 1  # rocev2_frame.flags (ROCEV2_FRAME_HAS_IMMEDIATE)


class _Frame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("data", ctypes.c_void_p), ("len", ctypes.c_uint32),
                ("channel", ctypes.c_uint32), ("immediate", ctypes.c_uint32),
                ("slot", ctypes.c_uint32), ("token", ctypes.c_uint64)]


# One rocev2_frame as Server.poll_frames reads a batch: all records in one
# struct.iter_unpack instead of a ctypes field read per field and frame.
_FRAME_RECORD = struct.Struct("=IIQIIIIQ")
_STRUCT_SIZE = struct.Struct("=I")  # a record's first field
if ([getattr(_Frame, n).offset for n, _ in _Frame._fields_] != [0, 4, 8, 16, 20, 24, 28, 32]
        or _FRAME_RECORD.size != ctypes.sizeof(_Frame)):
    raise ImportError("rocev2: _Frame's layout differs from the batch record")


class _Batch:
    """What one poll_frames call fills: the rocev2_frame array, its bytes,
    the count (and its ctypes reference), kept across calls."""
    __slots__ = ("frames", "raw", "got", "got_ref")

    def __init__(self, n: int):
        self.frames = (_Frame * n)()
        self.raw = memoryview(self.frames).cast("B")
        self.got = ctypes.c_size_t(0)
        self.got_ref = ctypes.byref(self.got)


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
# Since 2.3: the verbs backend's verdicts on its peer (README, Operations).
_STAT_FIELDS_2_3_PEER = ["lost_frames_estimate", "stale_peers", "peer_stale", "peer_watched"]


class _Stats(ctypes.Structure):
    _fields_ = ([("struct_size", ctypes.c_uint32), ("reserved", ctypes.c_uint32)]
                + [(n, ctypes.c_uint64) for n in _STAT_FIELDS]
                + [("link_state", ctypes.c_uint32), ("reserved2", ctypes.c_uint32)]
                + [(n, ctypes.c_uint64) for n in _STAT_FIELDS_2_1 + _STAT_FIELDS_2_2]
                + [(n, ctypes.c_uint64) for n in _STAT_FIELDS_2_3_PEER])


class LinkState(enum.IntEnum):
    """The link's state (``rocev2_stats.link_state``, ROCEV2_LINK_*)."""
    CREATED = 0
    CONNECTED = 1
    ERROR = 2
    STOPPED = 3


_FRAME_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Frame))
_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p)


_HERE = os.path.dirname(os.path.abspath(__file__))

_BUILD_HINT = (
    "Build and bundle it: `pip install ./python` in a rocev2 checkout (needs cargo, "
    "libibverbs-dev, librdmacm-dev, libclang-dev); or install the C library: "
    "`cmake -S cmake -B build -DCMAKE_INSTALL_PREFIX=/usr/local && cmake --build build && "
    "cmake --install build && ldconfig`; or point ROCEV2_LIBRARY at a built "
    "librocev2.so.2 (e.g. build/install/lib/librocev2.so.2 after `./run test`)."
)


def _candidates() -> typing.List[str]:
    """Where the library is looked for: ``$ROCEV2_LIBRARY`` alone when set
    (an override is never silently replaced by another copy); else the copy
    bundled in this package (``pip install``), then the system loader."""
    env = os.environ.get("ROCEV2_LIBRARY")
    if env:
        return [env]
    bundled = sorted(os.path.join(_HERE, n) for n in os.listdir(_HERE)
                     if n.startswith("librocev2") and ".so" in n)
    return bundled + ["librocev2.so.2"]


def _load() -> ctypes.CDLL:
    errors = []
    for cand in _candidates():
        try:
            lib = ctypes.CDLL(cand)
        except OSError as e:
            errors.append(f"{cand}: {e}")
            continue
        _declare(lib)
        if lib.rocev2_abi_version() != ABI_VERSION:
            raise ImportError(f"{cand} has C ABI version {lib.rocev2_abi_version()}, "
                              f"this package needs {ABI_VERSION}")
        _check_layouts(lib, cand)
        return lib
    raise ImportError("cannot load librocev2. " + _BUILD_HINT + " Tried:\n  " + "\n  ".join(errors))


_library: typing.Optional[ctypes.CDLL] = None
_load_lock = threading.Lock()


def _lib() -> ctypes.CDLL:
    """The loaded library, loaded at first use (so the module and its code
    tables, ``Mtu``, ``RnrTimer``, ``Status``, import without it)."""
    global _library
    if _library is None:
        with _load_lock:
            if _library is None:
                _library = _load()
    return _library


_raw_calls: typing.Dict[str, typing.Any] = {}
_NO_WAIT = ctypes.c_int32(0)  # a timeout_ms for _raw calls


def _raw(name: str) -> typing.Any:
    """``name`` from the library without ctypes' argument conversion (its
    argtypes cost about 0.5 us a call): for the batch path's calls, whose
    callers pass exactly the C types (c_void_p, c_int32, c_size_t, arrays,
    byref). Returns the C status."""
    fn = _raw_calls.get(name)
    if fn is None:
        lib = _lib()
        fn = lib._FuncPtr((name, lib))
        fn.restype = ctypes.c_int
        _raw_calls[name] = fn
    return fn


def __getattr__(name: str):
    # ``rocev2.library``: the ctypes handle, loaded on first access (PEP 562).
    if name == "library":
        return _lib()
    raise AttributeError(f"module 'rocev2' has no attribute {name!r}")


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


def _check_layouts(lib: ctypes.CDLL, path: str) -> None:
    """Refuses a library whose structs are smaller than this binding's
    declarations (an older library: fields the binding would read or set are
    not there) or whose status codes differ. A larger struct (a newer
    library) is fine: the size protocol gives the binding its own size."""
    for which, struct in _STRUCTS.items():
        theirs, ours = lib.rocev2_struct_size(which), ctypes.sizeof(struct)
        if theirs < ours:
            raise ImportError(
                f"{path}: its {struct.__name__[1:]} has {theirs} bytes, this binding "
                f"declares {ours}: the library ({lib.rocev2_version().decode()}) is older than "
                f"the binding. Install the matching library, or the package built "
                f"with it (`pip install ./python`).")
    unknown = lib.rocev2_status_str(len(Status))
    for st in Status:
        text = lib.rocev2_status_str(int(st))
        if text == unknown:
            raise ImportError(f"{path}: status {int(st)} ({st.name}) is unknown to the "
                              f"library; the binding and library disagree on the status codes")


def _answered(written: ctypes.Structure, fn: str) -> None:
    """The size protocol's answer: the library wrote the whole struct (a
    shorter answer would leave fields unwritten; _check_layouts refuses such
    a library at load, so this guards against a library swapped since)."""
    if written.struct_size != ctypes.sizeof(written):
        raise Rocev2Error(Status.INTERNAL, f"{fn} wrote {written.struct_size} bytes of "
                          f"{type(written).__name__[1:]}, the binding needs {ctypes.sizeof(written)}")


def _last_error() -> str:
    n = _lib().rocev2_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    _lib().rocev2_last_error(buf, n + 1)
    return buf.value.decode("utf-8", "replace")


def _check(status: int) -> None:
    if status != Status.OK:
        raise Rocev2Error(status, _last_error())


def version() -> str:
    """The library version string."""
    return _lib().rocev2_version().decode()


def abi_version() -> int:
    """The library's C ABI version."""
    return _lib().rocev2_abi_version()


def list_devices() -> typing.List[str]:
    """Names of the ibverbs devices on this host."""
    count = ctypes.c_size_t(0)
    buf = ctypes.create_string_buffer(4096)
    _check(_lib().rocev2_device_list(buf, len(buf), ctypes.byref(count)))
    return [n for n in buf.value.decode().split(",") if n]


# ---------------------------------------------------------------------------
# Transport vocabulary (the pyrogue wrapper's tables)
# ---------------------------------------------------------------------------

class Mtu(enum.IntEnum):
    """Path MTU codes (libibverbs ibv_mtu)."""
    MTU_256 = 1
    MTU_512 = 2
    MTU_1024 = 3
    MTU_2048 = 4
    MTU_4096 = 5


PMTU_BYTES = {m: 128 << int(m) for m in Mtu}


class RnrTimer(enum.IntEnum):
    """IBA Min RNR NAK Timer codes (vol 1 table 45); names give milliseconds."""
    MS_655_36 = 0
    MS_0_01 = 1
    MS_0_02 = 2
    MS_0_03 = 3
    MS_0_04 = 4
    MS_0_06 = 5
    MS_0_08 = 6
    MS_0_12 = 7
    MS_0_16 = 8
    MS_0_24 = 9
    MS_0_32 = 10
    MS_0_48 = 11
    MS_0_64 = 12
    MS_0_96 = 13
    MS_1_28 = 14
    MS_1_92 = 15
    MS_2_56 = 16
    MS_3_84 = 17
    MS_5_12 = 18
    MS_7_68 = 19
    MS_10_24 = 20
    MS_15_36 = 21
    MS_20_48 = 22
    MS_30_72 = 23
    MS_40_96 = 24
    MS_61_44 = 25
    MS_81_92 = 26
    MS_122_88 = 27
    MS_163_84 = 28
    MS_245_76 = 29
    MS_327_68 = 30
    MS_491_52 = 31


MIN_RNR_TIMER_MS = {t: float(t.name[3:].replace("_", ".")) for t in RnrTimer}


def _u32(value, name: str) -> int:
    if not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise Rocev2Error(Status.INVALID_ARGUMENT, f"{name} must be an integer code; got {value!r}")
    return value


def pmtu_bytes(pmtu: int) -> int:
    """Payload bytes of a path MTU code (the library's table); Rocev2Error
    (INVALID_ARGUMENT) for a code outside 1..5."""
    out = ctypes.c_uint32(0)
    _check(_lib().rocev2_pmtu_bytes(_u32(pmtu, "pmtu"), ctypes.byref(out)))
    return out.value


def rnr_timer_us(code: int) -> int:
    """Microseconds of an IB min RNR NAK timer code (the library's table);
    Rocev2Error (INVALID_ARGUMENT) for a code outside 0..31."""
    out = ctypes.c_uint32(0)
    _check(_lib().rocev2_rnr_timer_us(_u32(code, "minRnrTimer"), ctypes.byref(out)))
    return out.value


# ---------------------------------------------------------------------------
# GID helpers
# ---------------------------------------------------------------------------

def _ipv4(value: str, field: str) -> str:
    """``value`` as a dotted-quad IPv4 address, or Rocev2Error naming ``field``."""
    try:
        if not isinstance(value, str):
            raise ValueError
        return str(ipaddress.IPv4Address(value))
    except ValueError:
        raise Rocev2Error(Status.INVALID_ARGUMENT, f"{field} must be an IPv4 address such as '10.0.0.20'; "
                          f"got {value!r}") from None


def ip_to_gid_bytes(ip: str) -> bytes:
    """IPv4 string -> 16-byte IPv4-mapped GID (via the library)."""
    return parse_gid(_ipv4(ip, "ip"))


def gid_bytes_to_str(gid: bytes) -> str:
    """16 GID bytes -> ibv_devinfo form (8 groups of 4 hex digits; via the library)."""
    raw = bytes(gid)
    if len(raw) != 16:
        raise Rocev2Error(Status.INVALID_ARGUMENT, f"GID must be 16 bytes, got {len(raw)}")
    buf = ctypes.create_string_buffer(40)
    _check(_lib().rocev2_gid_format(raw, buf, len(buf)))
    return buf.value.decode()


def parse_gid(text: str) -> bytes:
    """ibv_devinfo form, IPv6 text or an IPv4 address -> 16 bytes (via the library)."""
    out = ctypes.create_string_buffer(16)
    _check(_lib().rocev2_gid_parse(text.encode(), out))
    return out.raw


def host_ip_from_gid(gid: str) -> str:
    """IPv4 of an 8-group IPv4-mapped GID string; '' for anything else (via the library)."""
    if not isinstance(gid, str) or "\0" in gid:
        return ""
    buf = ctypes.create_string_buffer(16)
    _check(_lib().rocev2_gid_host_ip(gid.encode(), buf, len(buf)))
    return buf.value.decode()


def detect_gid_index(device: str, ip: str, ib_port: int = 1,
                     sysfs_root: typing.Optional[str] = None) -> typing.Optional[int]:
    """GID-table index of the RoCE v2 IPv4 GID on ``ip``'s /24 (sysfs), or None."""
    out = ctypes.c_uint32(0)
    st = _lib().rocev2_gid_detect_index(device.encode(), ip.encode(), ib_port,
                                         sysfs_root.encode() if sysfs_root else None,
                                         ctypes.byref(out))
    if st == Status.NOT_FOUND:
        return None
    _check(st)
    return out.value


def pattern_check(data) -> int:
    """Checks a frame of the FPGA emulator's pattern (bytes 0..8: sequence
    number, little-endian; then xorshift32 seeded from it) with the library's
    check; returns the sequence number or raises ValueError. ``data``: a
    :class:`Frame` (checked in place, no copy) or any bytes-like object."""
    seq = ctypes.c_uint64(0)
    if isinstance(data, Frame):
        st = _lib().rocev2_pattern_check(data.address, len(data), ctypes.byref(seq))
    else:
        b = bytes(data)
        st = _lib().rocev2_pattern_check(b, len(b), ctypes.byref(seq))
    if st != Status.OK:
        raise ValueError(_last_error())
    return seq.value


def validate_channel(channel: int) -> int:
    """Checks a channel id (immediate bits [7:0]): 0..255."""
    if not isinstance(channel, int) or not 0 <= channel <= 0xFF:
        raise Rocev2Error(Status.INVALID_ARGUMENT, f"channel must be in the range 0..255 (bits [7:0] of the "
                          f"RDMA immediate value); got {channel}")
    return channel


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------

@dataclasses.dataclass
class ServerCfg:
    """Bring-up configuration (pyrogue RoCEv2ServerCfg). ``gidIndex`` -1
    auto-detects from sysfs; ``maxPayload`` defaults to 4096 like pyrogue
    (None = the C++ default 9000); ``rxQueueDepth`` None = 256. ``deviceName``
    "soft" selects the userspace backend (``bindAddr``/``udpPort``; ``icrcCheck``
    "auto" checks received ICRCs by raw capture when the process has
    CAP_NET_RAW, "require" insists, "off" never does). ``peerUdpPort`` is the
    FPGA's port, where ACKs go (0 = each packet's source port); when ``ip``
    and the port are the server's own socket (``ip="127.0.0.1"`` with the
    defaults, an emulator on this host) the library ACKs the source port."""
    ip: str
    deviceName: str
    ibPort: int = 1
    gidIndex: int = -1
    maxPayload: typing.Optional[int] = 4096
    rxQueueDepth: typing.Optional[int] = None
    bindAddr: str = "127.0.0.1"
    udpPort: int = 4791
    peerUdpPort: int = 4791
    spinUs: int = 50
    stopTimeoutMs: int = 5000
    cpuAffinity: int = -1
    mrRemoteWrite: bool = False
    icrcCheck: str = "auto"

    def __post_init__(self) -> None:
        if self.icrcCheck not in _ICRC_CHECK:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"icrcCheck must be one of {sorted(_ICRC_CHECK)}; got {self.icrcCheck!r}")
        self.ip = _ipv4(self.ip, "ServerCfg.ip (the FPGA's address)")
        self.bindAddr = _ipv4(self.bindAddr, "ServerCfg.bindAddr (the soft backend's address)")
        for field in ("udpPort", "peerUdpPort"):
            port = getattr(self, field)
            if not isinstance(port, int) or not 0 <= port <= 0xFFFF:
                raise Rocev2Error(Status.INVALID_ARGUMENT, f"ServerCfg.{field} must be in the range 0..65535; got {port!r}")
        if self.maxPayload is None:
            self.maxPayload = DEFAULT_MAX_PAYLOAD
        if self.rxQueueDepth is None:
            self.rxQueueDepth = DEFAULT_RX_QUEUE_DEPTH
        if not 1 <= self.ibPort <= 255:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"ibPort must be in the range 1..255; got {self.ibPort}")
        if not -1 <= self.gidIndex <= 255:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"gidIndex must be -1 (auto) or 0..255; got {self.gidIndex}")
        # Payload size, queue depth, the MR's 32-bit length: the library's checks.
        _check(_lib().rocev2_server_config_check(ctypes.byref(self._c_config())))

    def _c_config(self) -> _ServerConfig:
        """This config as the library's rocev2_server_config."""
        sc = _ServerConfig()
        _check(_lib().rocev2_server_config_init(ctypes.byref(sc), ctypes.sizeof(sc)))
        for name, value in (("max_payload", self.maxPayload), ("rx_queue_depth", self.rxQueueDepth),
                            ("spin_us", self.spinUs), ("stop_timeout_ms", self.stopTimeoutMs)):
            if not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
                raise Rocev2Error(Status.INVALID_ARGUMENT,
                                  f"ServerCfg: {name} must be an integer 0..2^32-1; got {value!r}")
            setattr(sc, name, value)
        if not isinstance(self.cpuAffinity, int) or not -(1 << 31) <= self.cpuAffinity < 1 << 31:
            raise Rocev2Error(Status.INVALID_ARGUMENT,
                              f"ServerCfg.cpuAffinity must be -1 or a CPU number; got {self.cpuAffinity!r}")
        sc.cpu_affinity = self.cpuAffinity
        sc.mr_remote_write = int(bool(self.mrRemoteWrite))
        return sc


@dataclasses.dataclass
class TransportCfg:
    """Transport knobs (pyrogue RoCEv2TransportCfg), validated at construction.
    ``rnrRetry``/``retryCount`` govern the FPGA side only."""
    pmtu: int = Mtu.MTU_4096
    minRnrTimer: int = 12
    rnrRetry: int = 7
    retryCount: int = 3

    def __post_init__(self) -> None:
        pmtu_bytes(self.pmtu)  # the library's tables say which codes exist
        rnr_timer_us(self.minRnrTimer)


class HostParams(typing.NamedTuple):
    """What the FPGA engine's setupConnection() consumes."""
    hostQpn: int
    hostRqPsn: int
    hostSqPsn: int
    mrAddr: int
    mrLen: int


# ---------------------------------------------------------------------------
# Frames and the server
# ---------------------------------------------------------------------------

class Frame:
    """A received frame on loan. ``data`` is a read-only memoryview into the
    receive slab (zero copy), valid until :meth:`release`. Released on garbage
    collection or context-manager exit if not before.

    A consumer that holds ``data``'s buffer (an export: ``numpy.frombuffer(
    frame.data)``, ``struct.iter_unpack(fmt, frame.data)``, ...) holds the
    slot: while it does, :meth:`release` raises BufferError and keeps the
    loan (release again once the consumer is dropped), and a frame garbage
    collected meanwhile leaves its loan to the export, released when the
    consumer drops it. A held frame is a slot the sender cannot fill: hold
    ``rxQueueDepth`` of them and the link stalls (RNR NAKs) until one is
    released. Views *derived* from ``data`` (``memoryview(frame.data)``, a
    slice, ``.cast()``) share its memory but are not exports: they do not
    hold the slot, and after release they read whatever the slot receives
    next. Copy (``frame.tobytes()``, ``numpy.array(frame.data)``) to keep
    the bytes."""
    __slots__ = ("_server", "_handle", "_token", "data", "channel", "immediate", "has_immediate", "slot",
                 "address")

    def __init__(self, server: "Server", f: _Frame, handle: typing.Optional[int] = None):
        self._server = server
        # The library handle this loan belongs to (the one polled): it stays
        # valid for its tokens after destroy (and after Server.recreate()).
        self._handle = server._srv.value if handle is None else handle
        self.address = f.data
        buf = (ctypes.c_uint8 * f.len).from_address(f.data)
        self.data = memoryview(buf).cast("B").toreadonly()
        self.channel = f.channel
        self.immediate = f.immediate
        # False for a message sent without an immediate (channel and
        # immediate are then 0); a 0-byte message is a frame like any other.
        self.has_immediate = bool(f.flags & FRAME_HAS_IMMEDIATE)
        self.slot = f.slot
        self._token = f.token  # last: a frame interrupted before it owns no loan

    @property
    def ring_position(self) -> int:
        """The FPGA's ring position: immediate bits [31:8]."""
        return self.immediate >> 8

    def __len__(self) -> int:
        return len(self.data) if self._token else 0

    def tobytes(self) -> bytes:
        """A copy of the payload."""
        return self.data.tobytes()

    def release(self) -> None:
        """Returns the slot to the receiver (idempotent). Raises BufferError,
        and keeps the loan, while a consumer holds an export of ``data``
        (``numpy.frombuffer(frame.data)``, ...): drop it, then release again."""
        if self._token:
            # The view first: it refuses while exported, and the loan (the
            # token) must outlive every reader of the slot.
            try:
                self.data.release()
            except BufferError:
                raise BufferError(_HELD_EXPORT) from None
            token, self._token = self._token, 0
            if token:  # another thread's release() may have taken it meanwhile
                _check(_lib().rocev2_server_release(self._handle, token))

    def __enter__(self) -> "Frame":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        try:
            token = self._token
            if not token:
                return
            try:
                self.data.release()
            except BufferError:
                # A consumer still holds data's buffer (and so the view):
                # the loan goes with the view, released when it is freed.
                _release_with(self.data, self._handle, token)
            else:
                _lib().rocev2_server_release(self._handle, token)
            self._token = 0
        except Exception:
            pass  # __init__ did not finish, or the interpreter is exiting

    @classmethod
    def _batch(cls, server: "Server", handle: int, slab: "_SlabView",
               records: typing.Iterable[tuple], frames: typing.List["Frame"]) -> typing.List["Frame"]:
        """Appends to ``frames`` (and returns it) the frames of unpacked
        rocev2_frame records (:data:`_FRAME_RECORD`): as ``Frame(server, f)``
        each, with ``data`` a slice of the slab's view."""
        new, base, size, whole = cls.__new__, slab.base, slab.size, slab.whole
        append = frames.append
        for _, flags, address, length, channel, immediate, slot, token in records:
            f = new(cls)
            f._server = server
            f._handle = handle
            f.address = address
            off = address - base
            f.data = whole[off:off + length] if 0 <= off <= size - length else _view(address, length)
            f.channel = channel
            f.immediate = immediate
            f.has_immediate = flags & FRAME_HAS_IMMEDIATE != 0
            f.slot = slot
            # The loan, then into the list: nothing Python checks for a
            # signal at runs between, so each loan is the list's or a record's.
            f._token = token
            append(f)
        return frames

    def __repr__(self) -> str:
        return (f"Frame(channel={self.channel}, len={len(self)}, "
                f"ring_position={self.ring_position}, slot={self.slot})")


class _SlabView:
    """One read-only memoryview of a server's receive slab (``mr_addr``,
    ``mr_len``: every frame lies in it), so a frame's ``data`` is a slice of it
    (one object) instead of a ctypes array, a memoryview and two views of it
    per frame. The slab outlives every loan (the library keeps it until the
    last token is released), and a slice keeps nothing alive."""
    __slots__ = ("handle", "base", "size", "whole")

    def __init__(self, handle: int, mr_addr: int, mr_len: int):
        self.handle, self.base, self.size = handle, mr_addr, mr_len
        self.whole = _view(mr_addr, mr_len) if mr_len else memoryview(b"")


def _view(address: int, length: int) -> memoryview:
    """A read-only byte view of ``length`` bytes at ``address`` (zero copy)."""
    return memoryview((ctypes.c_uint8 * length).from_address(address)).cast("B").toreadonly()


_HELD_EXPORT = ("frame.data is held by a consumer (an export of its buffer, e.g. "
                "numpy.frombuffer(frame.data)): the frame stays on loan, its slot unavailable "
                "to the sender. Drop the consumer, then release again (or copy the bytes: "
                "frame.tobytes())")


def _release_token(handle: int, token: int) -> None:
    """Releases a loan (a finalizer's callback: never raises)."""
    try:
        _lib().rocev2_server_release(handle, token)
    except Exception:
        pass


def _release_with(view: memoryview, handle: int, token: int) -> None:
    """Hands a loan to an exported ``view``: released when the view is freed
    (its consumer dropped it). Not at interpreter exit, while the consumer
    may still read it; the process's end frees the slab."""
    weakref.finalize(view, _release_token, handle, token).atexit = False


# The longest library wait: a wait for a frame is made of waits of at most
# this, so that Python runs its signal handlers (Ctrl-C: KeyboardInterrupt)
# in between. A frame that is there returns at once, whatever the slice.
_SLICE_MS = 100


def _first_wait(timeout: typing.Optional[float]) -> typing.Tuple[int, typing.Optional[float]]:
    """A wait of ``timeout`` seconds (None: forever) in slices: the first
    slice's milliseconds and the deadline for :func:`_next_wait`
    (time.monotonic(); math.inf: none; None: the first slice is all)."""
    if timeout is None:
        return _SLICE_MS, math.inf
    ms = max(0, int(timeout * 1000))
    if ms <= _SLICE_MS:
        return ms, None
    return _SLICE_MS, time.monotonic() + timeout


def _next_wait(deadline: typing.Optional[float]) -> typing.Optional[int]:
    """The next slice's milliseconds before ``deadline``, None once it passed."""
    if deadline is None:
        return None
    if deadline == math.inf:
        return _SLICE_MS
    left = deadline - time.monotonic()
    return None if left <= 0 else min(_SLICE_MS, math.ceil(left * 1000))


class _Handles:
    """A server's library handles and the frame callback the library calls,
    apart from the :class:`Server` so that its finalizer (weakref.finalize:
    it must not refer to the server) closes them when the server is garbage
    collected. ``srv`` and ``dev`` are the server's own c_void_p objects:
    closing zeroes them in place, so the server sees itself closed.
    ``rx_thread``: the receive thread, once a frame callback ran on it."""
    __slots__ = ("srv", "dev", "cb", "rx_thread")

    def __init__(self, srv: ctypes.c_void_p, dev: ctypes.c_void_p):
        self.srv, self.dev, self.cb, self.rx_thread = srv, dev, None, None
        _live.add(self)

    def stop(self) -> None:
        if self.srv:
            _lib().rocev2_server_stop(self.srv)

    def close(self) -> None:
        """Destroys the server and closes the device (once: the finalizer
        calls it). On the server's own receive thread (its frame callback
        closed it, or dropped the last reference) the library's destroy must
        not run: it stops (allowed there; the thread ends when the callback
        returns) and leaves the rest to the next close on another thread."""
        _live.discard(self)
        srv, dev, cb = self.srv.value, self.dev.value, self.cb
        self.srv.value = self.dev.value = self.cb = None
        if srv and self.rx_thread == threading.get_ident():
            _lib().rocev2_server_stop(srv)
            _deferred.append((srv, dev, cb, self.rx_thread))
            return
        _destroy(srv, dev)
        _reap()


# Servers not yet closed (their handles), for the exit hook.
_live: typing.Set[_Handles] = set()
# Closed on their own receive thread, destroyed by the next close elsewhere:
# (server, device, frame callback kept alive until then, receive thread).
_deferred: typing.List[tuple] = []


def _destroy(srv: typing.Optional[int], dev: typing.Optional[int]) -> None:
    if srv:
        _lib().rocev2_server_destroy(srv)
    if dev:
        _lib().rocev2_device_close(dev)


def _reap() -> None:
    """Destroys the servers closed on their receive threads (but one whose
    receive thread this is)."""
    me = threading.get_ident()
    for _ in range(len(_deferred)):
        try:
            entry = _deferred.pop(0)
        except IndexError:
            return
        if entry[3] == me:
            _deferred.append(entry)
        else:
            _destroy(entry[0], entry[1])


@atexit.register
def _stop_all_at_exit() -> None:
    """At interpreter exit, before it finalizes: stops every live server,
    joining its receive thread, so no library thread calls into Python while
    the interpreter finalizes (a frame callback entering then would end its
    thread mid-call and abort the process). Stop, not destroy: a daemon
    thread may still be inside a poll call; the process's end frees the rest."""
    for h in list(_live):
        try:
            h.stop()
        except Exception:
            pass


class Server:
    """The RoCEv2 receive server (rogue ``rogue.protocols.rocev2.Server``).

    ``Server(ServerCfg(...))`` opens the device (rogue's Core), creates the
    server (QP in INIT) and sets the FPGA GID from ``cfg.ip``. Then
    :meth:`get_host_params` (program the FPGA), optionally
    :meth:`set_frame_callback`, :meth:`complete_connection`, and frames.

    Close it with :meth:`close` (or ``with``); a server garbage collected
    unclosed is closed then (its thread, sockets, port and memory freed), and
    every live server is stopped at interpreter exit.
    """

    def __init__(self, cfg: ServerCfg):
        self._cfg = cfg
        self._dev = ctypes.c_void_p()
        self._srv = ctypes.c_void_p()
        self._cb_fn = None
        self._h = _Handles(self._srv, self._dev)
        # close() or garbage collection; not at exit (_stop_all_at_exit stops).
        self._closer = weakref.finalize(self, self._h.close)
        self._closer.atexit = False
        _reap()
        # Frames poll(channel=...) took for other channels, kept for their
        # readers as (arrival number, frame) per channel; at most _keep_max in
        # all (half the receive queue), beyond which the oldest is released
        # and counted (channel_drops): unread channels must not hold the slots.
        self._lock = threading.Lock()
        self._pending: typing.Dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self._kept = 0
        self._arrivals = 0
        self._keep_max = cfg.rxQueueDepth // 2
        self._channel_drops = 0
        # Kept for poll_frames / release_frames: rocev2_frame arrays (with
        # their bytes) and token arrays, taken and put back (list.pop and
        # append are atomic: threads polling at once each get their own),
        # and the slab's view (per library handle).
        self._batches: typing.List[_Batch] = []
        self._token_arrays: typing.List[ctypes.Array] = []
        self._slab: typing.Optional[_SlabView] = None
        gid_index = cfg.gidIndex
        if gid_index < 0:
            if cfg.deviceName == "soft":
                gid_index = 0
            else:
                detected = detect_gid_index(cfg.deviceName, cfg.ip, cfg.ibPort)
                if detected is None:
                    raise Rocev2Error(Status.NOT_FOUND, f"could not auto-detect a RoCE v2 IPv4 GID on "
                                      f"{cfg.deviceName} matching {cfg.ip}'s subnet — pass "
                                      f"gidIndex explicitly (see: ibv_devinfo -v -d {cfg.deviceName})")
                gid_index = detected
        self.gidIndex = gid_index
        dc = _DeviceConfig()
        _check(_lib().rocev2_device_config_init(ctypes.byref(dc), ctypes.sizeof(dc)))
        dc.name = cfg.deviceName.encode()
        dc.ib_port = cfg.ibPort
        dc.gid_index = gid_index
        dc.bind_addr = cfg.bindAddr.encode()
        dc.udp_port = cfg.udpPort
        dc.peer_udp_port = cfg.peerUdpPort
        dc.icrc_check = _ICRC_CHECK[cfg.icrcCheck]
        _check(_lib().rocev2_device_open(ctypes.byref(dc), ctypes.byref(self._dev)))
        try:
            sc = cfg._c_config()
            _check(_lib().rocev2_server_create(self._dev, ctypes.byref(sc), ctypes.byref(self._srv)))
            self.setFpgaGid(ip_to_gid_bytes(cfg.ip))
        except BaseException:
            self.close()
            raise

    # -- lifecycle ---------------------------------------------------------
    def _handle(self) -> ctypes.c_void_p:
        if not self._srv:
            raise Rocev2Error(Status.STOPPED, "server is closed")
        return self._srv

    def setFpgaGid(self, gid: typing.Union[bytes, str]) -> None:
        """FPGA GID: 16 bytes, or text (IPv4 / GID string)."""
        raw = parse_gid(gid) if isinstance(gid, str) else bytes(gid)
        if len(raw) != 16:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"GID must be 16 bytes, got {len(raw)}")
        _check(_lib().rocev2_server_set_fpga_gid(self._handle(), raw))

    set_fpga_gid = setFpgaGid

    def set_frame_callback(self, fn: typing.Callable[[Frame], None]) -> None:
        """Calls ``fn(frame)`` on the receive thread for every frame (before
        complete_connection). The frame is released when ``fn`` drops it."""
        # The library holds the trampoline until the server is destroyed: it
        # refers to the server weakly (and finds fn on it), so that the
        # server can be garbage collected (and closed) meanwhile.
        server, h, handle = weakref.ref(self), self._h, self._handle().value
        is_finalizing = sys.is_finalizing

        def trampoline(_user, fp):
            if is_finalizing():
                return  # no Python code while the interpreter finalizes
            if h.rx_thread is None:
                h.rx_thread = threading.get_ident()
            srv = server()
            on_frame = srv._cb_fn if srv is not None else None
            if on_frame is None:  # being collected: give the frame back
                _lib().rocev2_server_release(handle, fp.contents.token)
                return
            on_frame(Frame(srv, fp.contents, handle))
        cb = _FRAME_CB(trampoline)
        _check(_lib().rocev2_server_register_frame_callback(self._handle(), cb, None))
        h.cb = cb  # keep the C function pointer alive until the server is destroyed
        self._cb_fn = fn

    def completeConnection(self, fpgaQpn: int, fpgaRqPsn: typing.Optional[int] = None,
                           pmtu: int = Mtu.MTU_4096, minRnrTimer: int = 12) -> None:
        """INIT->RTR->RTS and start receiving. ``fpgaRqPsn`` defaults to the
        host SQ PSN (surf programs the FPGA's send PSN with it)."""
        pmtu, minRnrTimer = _u32(pmtu, "pmtu"), _u32(minRnrTimer, "minRnrTimer")
        if fpgaRqPsn is None:
            fpgaRqPsn = self.getSqPsn()
        _check(_lib().rocev2_server_complete_connection(self._handle(), fpgaQpn, fpgaRqPsn,
                                                         int(pmtu), int(minRnrTimer)))

    def complete_connection(self, fpga_qpn: int, fpga_rq_psn: typing.Optional[int] = None,
                            transport: typing.Optional[TransportCfg] = None) -> None:
        """snake_case form taking a :class:`TransportCfg` (default: pmtu 4096, RNR 0.64 ms)."""
        t = transport or TransportCfg()
        self.completeConnection(fpga_qpn, fpga_rq_psn, t.pmtu, t.minRnrTimer)

    def stop(self) -> None:
        """Stops receiving (idempotent); loaned frames stay valid until released."""
        if self._srv:
            _check(_lib().rocev2_server_stop(self._srv))

    def recreate(self) -> HostParams:
        """The remedy after an FPGA reload when the server cannot follow it
        (the verbs backend: the NIC ACKs the restarted stream as old
        duplicates, see README "Operations"), or after the link went to the
        error state: destroys this server and creates a new one with the same
        configuration (a new QP with new PSNs, a new slab; the frame callback
        registered again if one was set) and the same FPGA GID. Returns the
        new host params: program the FPGA with them, then call
        :meth:`complete_connection`. Frames still on loan from the old
        server stay valid until released."""
        fn = self._cb_fn
        self.close()
        self.__init__(self._cfg)
        if fn is not None:
            self.set_frame_callback(fn)
        return self.get_host_params()

    def close(self) -> None:
        """Stops and frees the server and device handles (idempotent; done on
        garbage collection if not before). Frames still on loan stay valid
        and release through the retired handle (the library keeps its memory
        until the last one is released)."""
        self._closer()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- frames ------------------------------------------------------------
    def _poll_raw(self, timeout: typing.Optional[float]) -> typing.Optional[Frame]:
        """One frame in slices of a wait (see :data:`_SLICE_MS`)."""
        f = _Frame()
        f.struct_size = ctypes.sizeof(f)
        f.token = 0
        ms, deadline = _first_wait(timeout)
        poll, ref = _lib().rocev2_server_poll_frame, ctypes.byref(f)
        handle = None
        try:
            while True:
                handle = self._handle().value  # closed meanwhile: Rocev2Error (STOPPED)
                st = poll(handle, ms, ref)
                if st != Status.TIMEOUT:
                    break
                ms = _next_wait(deadline)
                if ms is None:
                    return None
            _check(st)
            _answered(f, "rocev2_server_poll_frame")
            return Frame(self, f, handle)
        except BaseException:
            # Interrupted (Ctrl-C) after the library lent a frame, before a
            # Frame owned it: give it back. (Should the Frame have been made
            # after all, its own release is refused: tokens carry a generation.)
            if f.token:
                _release_token(handle, f.token)
            raise

    def poll_frames(self, max_frames: int = 64,
                    timeout: typing.Optional[float] = None) -> typing.List[Frame]:
        """Up to ``max_frames`` frames in one library call: waits up to
        ``timeout`` seconds (None: forever) for the first, then takes those
        already queued. [] on timeout; Rocev2Error (STOPPED) once stopped.
        Release them with :meth:`release_frames` (one call) or each
        ``frame.release()``. The fast path from Python (no channel filter);
        threads may poll one server at once (each gets frames of its own).
        Ctrl-C interrupts the wait (see :data:`_SLICE_MS`)."""
        if max_frames < 1:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"max_frames must be >= 1; got {max_frames}")
        handle = self._handle()
        try:
            b = self._batches.pop()
        except IndexError:
            b = None
        if b is None or len(b.frames) < max_frames:
            b = _Batch(max(max_frames, 64))
        size = _FRAME_RECORD.size
        frames: typing.List[Frame] = []
        b.got.value = 0
        hv = handle.value
        try:
            _STRUCT_SIZE.pack_into(b.raw, 0, size)
            ms, deadline = _first_wait(timeout)
            poll, cap = _raw("rocev2_server_poll_frames"), ctypes.c_size_t(max_frames)
            while True:  # in slices of the wait (see _SLICE_MS)
                hv = handle.value
                st = poll(handle, ctypes.c_int32(ms), b.frames, cap, b.got_ref)
                if st != Status.TIMEOUT:
                    break
                ms = _next_wait(deadline)
                if ms is None:
                    return frames
                handle = self._handle()  # closed meanwhile: Rocev2Error (STOPPED)
            if st:
                _check(st)
            if _STRUCT_SIZE.unpack_from(b.raw)[0] != size:
                _answered(b.frames[0], "rocev2_server_poll_frames")
            slab = self._slab
            if slab is None or slab.handle != hv:
                hp = self.get_host_params()
                slab = self._slab = _SlabView(hv, hp.mrAddr, hp.mrLen)
            records = _FRAME_RECORD.iter_unpack(b.raw[:b.got.value * size])
            return Frame._batch(self, hv, slab, records, frames)
        except BaseException:
            # Interrupted (Ctrl-C) or failed after the library lent frames:
            # give back those no Frame owns yet (the Frames made release
            # themselves when dropped).
            n = b.got.value
            b.got.value = 0
            for i in range(len(frames), n):
                _release_token(hv, _FRAME_RECORD.unpack_from(b.raw, i * size)[7])
            raise
        finally:
            self._batches.append(b)

    def release_frames(self, frames: typing.Iterable[Frame]) -> None:
        """Releases many frames in one library call (each once; already
        released ones are skipped). A frame whose ``data`` a consumer holds
        (see :class:`Frame`) stays on loan: the others are released, then
        BufferError says how many were kept."""
        tokens: typing.List[int] = []
        handle = None
        others: typing.Dict[int, typing.List[int]] = {}  # loans of other handles
        held = seen = 0
        for f in frames:
            seen += 1
            token = f._token
            if token:
                try:
                    f.data.release()
                except BufferError:
                    held += 1
                    continue
                f._token = 0
                if f._handle == handle or handle is None:
                    handle = f._handle
                    tokens.append(token)
                else:
                    others.setdefault(f._handle, []).append(token)
        if handle is not None:
            self._release_many(handle, tokens)
        for h, more in others.items():
            self._release_many(h, more)
        if held:
            raise BufferError(f"{held} of {seen} frames kept: " + _HELD_EXPORT)

    def _release_many(self, handle: int, tokens: typing.List[int]) -> None:
        """One rocev2_server_release_many through a kept token array."""
        n = len(tokens)
        try:
            arr = self._token_arrays.pop()
        except IndexError:
            arr = None
        if arr is None or len(arr) < n:
            arr = (ctypes.c_uint64 * max(n, 64))()
        try:
            arr[:n] = tokens
            _check(_raw("rocev2_server_release_many")(ctypes.c_void_p(handle), arr, ctypes.c_size_t(n)))
        finally:
            self._token_arrays.append(arr)

    def poll(self, timeout: typing.Optional[float] = None,
             channel: typing.Optional[int] = None) -> typing.Optional[Frame]:
        """The next frame (optionally of one channel), or None after ``timeout``
        seconds (None waits forever; Ctrl-C interrupts the wait). Raises
        Rocev2Error (STOPPED) once stopped. Frames of other channels that a
        ``channel`` poll takes are kept for their readers (a poll of theirs,
        or a plain poll: the oldest kept first), at most ``rxQueueDepth // 2``:
        beyond that the oldest is released unread (:attr:`channel_drops`)."""
        if channel is None:
            if self._kept:  # frames kept by poll(channel=...): the oldest first
                with self._lock:
                    queues = [q for q in self._pending.values() if q]
                    if queues:
                        self._kept -= 1
                        return min(queues, key=lambda q: q[0][0]).popleft()[1]
            return self._poll_raw(timeout)
        validate_channel(channel)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._pending[channel]:
                    self._kept -= 1
                    return self._pending[channel].popleft()[1]
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            f = self._poll_raw(left)
            if f is None:
                return None
            if f.channel == channel:
                return f
            self._keep(f, channel)

    def _keep(self, f: Frame, reader: int) -> None:
        """Keeps ``f``, taken by a reader of channel ``reader``, for its own
        channel's reader. Beyond :attr:`_keep_max` kept frames the oldest kept
        is released (counted in :attr:`channel_drops`, logged the first
        time): a channel nobody reads must not hold the receive queue's
        slots (the link would stall under RNR NAKs)."""
        with self._lock:
            self._arrivals += 1
            self._pending[f.channel].append((self._arrivals, f))
            self._kept += 1
            if self._kept <= self._keep_max:
                return
            oldest = min((q for q in self._pending.values() if q), key=lambda q: q[0][0])
            dropped = oldest.popleft()[1]
            self._kept -= 1
            self._channel_drops += 1
            first = self._channel_drops == 1
        if first:
            logging.getLogger("rocev2.Server").warning(
                "poll(channel=%d) keeps at most %d frames of other channels for their readers "
                "(half the receive queue); released unread: the oldest kept, of channel %d "
                "(Server.channel_drops counts them; this is logged once)",
                reader, self._keep_max, dropped.channel)
        dropped.release()

    @property
    def channel_drops(self) -> int:
        """Frames that poll(channel=...) or a :class:`ChannelView` took for
        other channels and released unread, the oldest beyond the
        ``rxQueueDepth // 2`` kept for those channels' readers."""
        return self._channel_drops

    def frames(self, timeout: typing.Optional[float] = None,
               channel: typing.Optional[int] = None) -> typing.Iterator[Frame]:
        """Iterates frames until the server stops (or ``timeout`` passes with none)."""
        while True:
            try:
                f = self.poll(timeout, channel)
            except Rocev2Error as e:
                if e.status == Status.STOPPED:
                    return
                raise
            if f is None:
                return
            yield f

    def __iter__(self) -> typing.Iterator[Frame]:
        return self.frames()

    def channel(self, channel: int) -> "ChannelView":
        """A view of one channel (immediate bits [7:0]), 0..255."""
        return ChannelView(self, validate_channel(channel))

    getChannel = channel

    # -- getters (rogue names) ---------------------------------------------
    def _hp(self) -> _HostParams:
        hp = _HostParams()
        hp.struct_size = ctypes.sizeof(hp)
        _check(_lib().rocev2_server_get_host_params(self._handle(), ctypes.byref(hp)))
        _answered(hp, "rocev2_server_get_host_params")
        return hp

    def getQpn(self) -> int:
        return self._hp().qpn

    def getGid(self) -> str:
        return self._hp().gid_str.decode()

    def getRqPsn(self) -> int:
        return self._hp().rq_psn

    def getSqPsn(self) -> int:
        return self._hp().sq_psn

    def getMrAddr(self) -> int:
        return self._hp().mr_addr

    def getMrRkey(self) -> int:
        return self._hp().mr_rkey

    def maxPayload(self) -> int:
        return self._cfg.maxPayload

    def getFrameCount(self) -> int:
        return self.stats()["frames"]

    def getByteCount(self) -> int:
        return self.stats()["bytes"]

    qpn = property(getQpn)
    gid = property(getGid)
    rq_psn = property(getRqPsn)
    sq_psn = property(getSqPsn)
    mr_addr = property(getMrAddr)
    mr_rkey = property(getMrRkey)
    frame_count = property(getFrameCount)
    byte_count = property(getByteCount)

    @property
    def udp_port(self) -> int:
        """The UDP port the host receives on (4791; the bound port on soft)."""
        return self._hp().udp_port

    @property
    def host_ip(self) -> str:
        return host_ip_from_gid(self.getGid())

    def get_host_params(self) -> HostParams:
        """The five values the FPGA engine's setupConnection() takes."""
        hp = self._hp()  # the library checked the MR length at create
        return HostParams(hp.qpn, hp.rq_psn, hp.sq_psn, hp.mr_addr, hp.mr_len)

    getHostParams = get_host_params

    def stats(self) -> typing.Dict[str, int]:
        """All counters by name."""
        s = _Stats()
        s.struct_size = ctypes.sizeof(_Stats)
        _check(_lib().rocev2_server_get_stats(self._handle(), ctypes.byref(s)))
        _answered(s, "rocev2_server_get_stats")
        return {n: getattr(s, n) for n in _STAT_FIELDS + ["link_state"] + _STAT_FIELDS_2_1
                + _STAT_FIELDS_2_2 + _STAT_FIELDS_2_3_PEER}

    def end_cause(self) -> typing.Optional[str]:
        """Why the link is down (the receive thread's end cause, "stopped"
        after stop(), or why complete_connection failed); None while it is
        created or connected."""
        n = _lib().rocev2_server_end_cause(self._handle(), None, 0)
        if n == 0:
            return None
        buf = ctypes.create_string_buffer(n + 1)
        _lib().rocev2_server_end_cause(self._handle(), buf, n + 1)
        return buf.value.decode("utf-8", "replace")

    def health(self) -> typing.Dict[str, typing.Any]:
        """Link health for an operator: ``state`` (a :class:`LinkState`),
        ``since_last_packet_s`` / ``since_last_frame_s`` (seconds, None
        before the first), ``end_cause`` (see :meth:`end_cause`),
        ``peer_restarts``, ``stale_peer`` (a stale-peer verdict holds, verbs)
        and ``lost_frames_estimate`` (frames lost to restarts, verbs)."""
        st = self.stats()

        def seconds(us: int) -> typing.Optional[float]:
            return None if us == 0xFFFFFFFFFFFFFFFF else us / 1e6
        return {"state": LinkState(st["link_state"]),
                "since_last_packet_s": seconds(st["us_since_last_packet"]),
                "since_last_frame_s": seconds(st["us_since_last_frame"]),
                "end_cause": self.end_cause(), "peer_restarts": st["peer_restarts"],
                "stale_peer": bool(st["peer_stale"]),
                "lost_frames_estimate": st["lost_frames_estimate"]}

    def is_running(self) -> bool:
        return bool(self._srv) and _lib().rocev2_server_is_running(self._srv) != 0

    def conn_info(self) -> str:
        """The RC connection summary (QP/GID/MR and buffer sizing)."""
        hp = self._hp()
        c = self._cfg
        return (f"--- RoCEv2 connection info ---\n"
                f"  Device          : {c.deviceName} port={c.ibPort} GID idx={self.gidIndex}\n"
                f"  Host QPN        : {hex(hp.qpn)}\n"
                f"  Host GID        : {hp.gid_str.decode()}\n"
                f"  Host RQ/SQ PSN  : {hex(hp.rq_psn)} / {hex(hp.sq_psn)}\n"
                f"  MR addr         : {hex(hp.mr_addr)}\n"
                f"  MR rkey         : {hex(hp.mr_rkey)}\n"
                f"  FPGA IP         : {c.ip}\n"
                f"  MaxPayload      : {c.maxPayload}\n"
                f"  RxQueueDepth    : {c.rxQueueDepth}\n"
                f"  MrLen           : {c.maxPayload * c.rxQueueDepth}\n"
                f"------------------------------")

    def printConnInfo(self) -> None:
        print(self.conn_info())

    print_conn_info = printConnInfo


class ChannelView:
    """Frames of one channel of a :class:`Server` (pull API). Frames of
    other channels that arrive meanwhile are kept for their readers
    (``server.poll()``, another view), at most ``rxQueueDepth // 2`` of them:
    beyond that the oldest kept is released unread and counted in
    ``server.channel_drops``, so channels nobody reads do not stall the link."""

    def __init__(self, server: Server, channel: int):
        self.server = server
        self.channel = channel

    def poll(self, timeout: typing.Optional[float] = None) -> typing.Optional[Frame]:
        return self.server.poll(timeout, self.channel)

    def __iter__(self) -> typing.Iterator[Frame]:
        return self.server.frames(channel=self.channel)


# ---------------------------------------------------------------------------
# Logging: forward library records to Python's logging ("rocev2.Server")
# ---------------------------------------------------------------------------

_log_cb_ref = None


def forward_logs_to_python(level: int = 3) -> None:
    """Routes library logs to the Python logger ``rocev2.Server`` (level:
    0 off .. 5 trace; default 3 = info)."""
    import logging
    logger = logging.getLogger("rocev2.Server")
    py_level = {1: logging.ERROR, 2: logging.WARNING, 3: logging.INFO, 4: logging.DEBUG, 5: logging.DEBUG}

    def on_log(_user, lvl, target, message):
        logger.log(py_level.get(lvl, logging.INFO), "%s", message.decode("utf-8", "replace"))

    global _log_cb_ref
    _log_cb_ref = _LOG_CB(on_log)
    _check(_lib().rocev2_set_log_callback(_log_cb_ref, None, level))
