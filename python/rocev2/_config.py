"""Configuration: the server's bring-up config, the transport knobs and the
host parameters the FPGA is programmed with."""
from __future__ import annotations

import ctypes
import dataclasses
import typing

from ._cdecl import _DeviceConfig, _ServerConfig
from ._codes import Mtu, pmtu_bytes, rnr_timer_us
from ._errors import Rocev2Error, Status
from ._gid import _ipv4, detect_gid_index
from ._loader import _check, _lib


DEFAULT_MAX_PAYLOAD = 9000      # rogue C++ DefaultMaxPayload
DEFAULT_RX_QUEUE_DEPTH = 256    # rogue C++ DefaultRxQueueDepth


# ServerCfg.icrcCheck -> rocev2_device_config.icrc_check (ROCEV2_ICRC_*).
_ICRC_CHECK = {"auto": 0, "off": 1, "require": 2}


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
    defaults, an emulator on this host) the library ACKs the source port.
    ``measureLatency`` fills the ACK turnaround and delivery latency
    histograms of ``Server.stats()`` (``ack_turnaround_*``, ``delivery_*``,
    nanoseconds; soft backend). ``busyPollUs`` busy-polls the NIC's queue on
    an empty socket (SO_BUSY_POLL; soft backend; docs/tuning.md).
    ``counterWrap`` checks the FPGA's frame counter (immediate bits [31:8],
    +1 per frame, wrapping to 0 at its AddrWrapCount) on every frame: gaps
    and resets land in ``Server.stats()`` (``counter_gaps``,
    ``counter_gap_frames``, ``counter_resets``); 0 (default) does not check."""
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
    measureLatency: bool = False
    busyPollUs: int = 0
    counterWrap: int = 0

    def __post_init__(self) -> None:
        if self.icrcCheck not in _ICRC_CHECK:
            raise Rocev2Error(Status.INVALID_ARGUMENT, f"icrcCheck must be one of {sorted(_ICRC_CHECK)}; got {self.icrcCheck!r}")
        self.ip = _ipv4(self.ip, "ServerCfg.ip (the FPGA's address)")
        self.bindAddr = _ipv4(self.bindAddr, "ServerCfg.bindAddr (the soft backend's address)")
        if not isinstance(self.busyPollUs, int) or not 0 <= self.busyPollUs <= 0xFFFFFFFF:
            raise Rocev2Error(Status.INVALID_ARGUMENT,
                              f"ServerCfg.busyPollUs must be an integer 0..2^32-1 (microseconds; 0 = off); got {self.busyPollUs!r}")
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
        sc.measure_latency = int(bool(self.measureLatency))
        if not isinstance(self.counterWrap, int) or not 0 <= self.counterWrap <= 1 << 24:
            raise Rocev2Error(Status.INVALID_ARGUMENT,
                              f"ServerCfg.counterWrap must be 0 (off) or 1..2^24 (the FPGA's AddrWrapCount); "
                              f"got {self.counterWrap!r}")
        sc.counter_wrap = self.counterWrap
        return sc

    def _gid_index(self) -> int:
        """gidIndex, auto-detected (-1) from the device's GIDs on ip's subnet
        (0 on the soft backend)."""
        if self.gidIndex >= 0:
            return self.gidIndex
        if self.deviceName == "soft":
            return 0
        detected = detect_gid_index(self.deviceName, self.ip, self.ibPort)
        if detected is None:
            raise Rocev2Error(Status.NOT_FOUND, f"could not auto-detect a RoCE v2 IPv4 GID on "
                              f"{self.deviceName} matching {self.ip}'s subnet — pass "
                              f"gidIndex explicitly (see: ibv_devinfo -v -d {self.deviceName})")
        return detected

    def _c_device_config(self, gid_index: int) -> _DeviceConfig:
        """This config as the library's rocev2_device_config, with GID index ``gid_index``."""
        dc = _DeviceConfig()
        _check(_lib().rocev2_device_config_init(ctypes.byref(dc), ctypes.sizeof(dc)))
        dc.name = self.deviceName.encode()
        dc.ib_port = self.ibPort
        dc.gid_index = gid_index
        dc.bind_addr = self.bindAddr.encode()
        dc.udp_port = self.udpPort
        dc.peer_udp_port = self.peerUdpPort
        dc.icrc_check = _ICRC_CHECK[self.icrcCheck]
        dc.busy_poll_us = self.busyPollUs
        return dc


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
