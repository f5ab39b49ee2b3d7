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

The package's modules, by job (all private; the API is this module's):
``_errors`` (status codes, :class:`Rocev2Error`), ``_cdecl`` (the C structs
and signatures), ``_loader`` (finding and loading the library, status
checks), ``_codes`` (MTU / RNR timer / link state codes), ``_gid`` (GID
helpers), ``_config`` (:class:`ServerCfg`, :class:`TransportCfg`, the device config
marshalling), ``_frames`` (:class:`Frame`), ``_server`` (:class:`Server`),
``_channels`` (the channel demultiplexer, :class:`ChannelView`),
``_logs`` (log forwarding), ``_version`` (``__version__``).
"""
from __future__ import annotations

import ctypes
import typing

# Besides the public names (__all__), kept importable as before the split: the C
# ABI version this binding speaks, rocev2_frame's flag, and what the tests
# inspect (_LOG_CB, _STRUCTS, _check_layouts, _deferred).
from ._cdecl import _LOG_CB, _STRUCTS, ABI_VERSION, FRAME_HAS_IMMEDIATE
from ._codes import (MIN_RNR_TIMER_MS, PMTU_BYTES, LinkState, Mtu, RnrTimer, pmtu_bytes,
                     rnr_timer_us, validate_channel)
from ._config import DEFAULT_MAX_PAYLOAD, DEFAULT_RX_QUEUE_DEPTH, HostParams, ServerCfg, TransportCfg
from ._errors import Rocev2Error, Status
from ._frames import Frame, pattern_check
from ._gid import detect_gid_index, gid_bytes_to_str, host_ip_from_gid, ip_to_gid_bytes, parse_gid
from ._loader import _check_layouts, _lib, abi_version, list_devices, version
from ._logs import forward_logs_to_python
from ._channels import ChannelView
from ._server import Server, _deferred, _live
from ._version import __version__ as __version__

__all__ = [
    "Rocev2Error", "Mtu", "RnrTimer", "PMTU_BYTES", "MIN_RNR_TIMER_MS",
    "ServerCfg", "TransportCfg", "HostParams", "Frame", "Server", "ChannelView",
    "ip_to_gid_bytes", "gid_bytes_to_str", "host_ip_from_gid", "parse_gid",
    "detect_gid_index", "validate_channel", "version", "abi_version",
    "DEFAULT_MAX_PAYLOAD", "DEFAULT_RX_QUEUE_DEPTH", "list_devices", "pattern_check",
    "forward_logs_to_python", "Status", "pmtu_bytes", "rnr_timer_us", "LinkState",
]


if typing.TYPE_CHECKING:
    library: ctypes.CDLL  # (a type checker sees no other dynamic attribute)
else:
    def __getattr__(name: str) -> ctypes.CDLL:
        # ``rocev2.library``: the ctypes handle, loaded on first access (PEP 562).
        if name == "library":
            return _lib()
        raise AttributeError(f"module 'rocev2' has no attribute {name!r}")
