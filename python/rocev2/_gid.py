"""GID helpers: conversions between IPv4 addresses, GID text and GID bytes,
and GID-index detection (all through the library)."""
from __future__ import annotations

import ctypes
import ipaddress
import typing

from ._errors import Rocev2Error, Status
from ._loader import _check, _lib


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
