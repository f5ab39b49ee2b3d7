"""Transport vocabulary (the pyrogue wrapper's tables): path MTU and RNR
timer codes, link states, channel ids."""
from __future__ import annotations

import ctypes
import enum
import typing

from ._errors import Rocev2Error, Status
from ._loader import _check, _lib


class LinkState(enum.IntEnum):
    """The link's state (``rocev2_stats.link_state``, ROCEV2_LINK_*)."""
    CREATED = 0
    CONNECTED = 1
    ERROR = 2
    STOPPED = 3


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


def _u32(value: object, name: str) -> int:
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


def validate_channel(channel: int) -> int:
    """Checks a channel id (immediate bits [7:0]): 0..255."""
    if not isinstance(channel, int) or not 0 <= channel <= 0xFF:
        raise Rocev2Error(Status.INVALID_ARGUMENT, f"channel must be in the range 0..255 (bits [7:0] of the "
                          f"RDMA immediate value); got {channel}")
    return channel
