"""rocev2's link health in pyrogue: ``RoCEv2HealthServer``.

pyrogue's ``RoCEv2Server`` (rogue's ``pyrogue.protocols``, unchanged) with
read-only variables that show what librocev2 knows about the link, for a
rogue built with rocev2's adapter (README.md beside this file)::

    from rocev2_pyrogue import RoCEv2HealthServer
    root.add(RoCEv2HealthServer(name="RoCEv2", rocev2Cfg=pyrogue.protocols.RoCEv2ServerCfg(...)))

It is a ``RoCEv2Server`` in every other way (same arguments, ``stream``,
``getChannel``, ``getHostParams``, ``completeConnection``, its 15 variables).
Installed by rocev2's CMake package as ``<prefix>/share/rocev2/rogue/python/
rocev2_pyrogue.py``: put that directory on ``PYTHONPATH``.

How it reads: one hidden variable, ``HealthSnapshot``, polled by pyrogue's
poller (``pollInterval``, default 1 s, when the Root polls), calls the
adapter's ``Server.getStats()`` once (one consistent snapshot of the
library's counters); every health variable is a ``LinkVariable`` computed
from that snapshot, so all of them change together and ZMQ clients (a GUI,
``pyrogue.interfaces.VirtualClient``) see each update. Reading one variable
directly (``dev.RnrNaksTx.get()``) takes a fresh snapshot first.

Latency: ``measureLatency=True`` (soft backend only) has the library measure
the ACK turnaround and the frame delivery latency (it sets
``ROCEV2_MEASURE_LATENCY=1`` while the server is created); otherwise those
variables stay 0.
"""
import os
import threading

import pyrogue as pr
import pyrogue.protocols

__all__ = ["RoCEv2HealthServer", "HEALTH_VARIABLES", "DROP_CAUSES"]

# (variable, rocev2_stats field, units, description, extra pyrogue arguments).
# A counter the library adds is one row here (and one X(field) line in the
# adapter's Server.cpp ROCEV2_ADAPTER_STATS list).
HEALTH_VARIABLES = [
    ("RnrNaksTx", "rnr_naks_tx", "packets",
     "RNR NAKs sent (soft backend): every receive slot was on loan, the FPGA was told to wait. "
     "Steady growth means the consumer (the Slaves) is slower than the FPGA", {}),
    ("SeqNaksTx", "seq_naks_tx", "packets",
     "PSN sequence-error NAKs sent (soft backend): a packet was lost on the way, the FPGA resent from it", {}),
    ("Duplicates", "duplicates", "packets",
     "Duplicate packets received (soft backend): resent by the FPGA after a lost ACK or a timeout; "
     "acknowledged again, never delivered twice", {}),
    ("PeerRestarts", "peer_restarts", "restarts",
     "Times the FPGA started over at the connection's first PSN (re-programmed after a reload). soft: "
     "followed, nothing lost; verbs: the NIC dropped the restarted stream (see LostFramesEstimate): "
     "re-create this Device and re-program the FPGA", {"highWarning": 0}),
    ("StalePeers", "stale_peers", "verdicts",
     "verbs: stale-peer verdicts (the FPGA sends PSNs ahead of the expected one and nothing is delivered): "
     "pulse the FPGA's SoftReset and reconnect", {"highAlarm": 0}),
    ("LostFramesEstimate", "lost_frames_estimate", "frames",
     "verbs: frames estimated lost to peer restarts (the NIC ACKed them as old duplicates and delivered none)",
     {"highAlarm": 0}),
    ("IcrcChecked", "icrc_checked", "packets",
     "Packets whose ICRC was verified (soft backend with raw capture, CAP_NET_RAW); 0 when unchecked", {}),
    ("FramesDelivered", "frames", "frames", "Frames the library delivered to the adapter (all channels)", {}),
    ("UsSinceLastPacket", "us_since_last_packet", "us",
     "Microseconds since the last packet from the FPGA (2^64-1 before the first)", {}),
    ("CounterGaps", "counter_gaps", "gaps",
     "With counterWrap: gaps in the FPGA's frame counter (immediate bits [31:8]): frames the FPGA "
     "numbered and never sent (dropped before its RoCEv2 engine); every frame the host ACKed was "
     "delivered. Look at the firmware's drop counters", {"highWarning": 0}),
    ("CounterGapFrames", "counter_gap_frames", "frames",
     "With counterWrap: the frame numbers the gaps skipped, in all", {}),
    ("CounterResets", "counter_resets", "resets",
     "With counterWrap: the FPGA's frame counter back at 0 before its wrap (a re-armed or reloaded "
     "FPGA)", {}),
    ("DuplicatingPeer", "duplicating_peer", "",
     "1 while the FPGA sends every message twice (surf's sticky half-bandwidth latch: duplicates as many "
     "as frames over 500 ms): the link runs at half rate. Toggle the FPGA's TxEn or soft-reset its "
     "RoCEv2 engine", {"highAlarm": 0}),
    ("DuplicatingPeers", "duplicating_peers", "verdicts",
     "Duplicating-peer verdicts drawn (see DuplicatingPeer)", {}),
    ("RnrStorm", "rnr_storm", "",
     "1 while RNR NAKs go out at 100/s or more (every slot on loan): check LoansOutstanding, a slow "
     "Slave, minRnrTimer (12 = 0.64 ms) and RxQueueDepth", {"highWarning": 0}),
    ("RnrStorms", "rnr_storms", "verdicts", "RNR-storm verdicts drawn (see RnrStorm)", {}),
]

# The drop causes beside Drops (their sum): packets or completions the
# library dropped, each counted once.
DROP_CAUSES = [
    ("DropsMalformed", "malformed", "Malformed packets (soft)"),
    ("DropsIcrc", "icrc_errors", "Packets with a bad ICRC (soft, checked)"),
    ("DropsForeign", "foreign_packets", "Packets for another QP or from another address (soft)"),
    ("DropsStale", "stale_packets", "Packets further from the expected PSN than any sender window (soft)"),
    ("DropsSocket", "socket_drops",
     "Packets the kernel dropped, the receive socket's buffer full (soft; the FPGA resends them)"),
    ("DropsBadLength", "bad_length", "Completions of zero or oversized length"),
    ("DropsUnexpectedOpcode", "unexpected_opcode", "Completions that were not a SEND with immediate"),
    ("DropsCompletionErrors", "completion_errors", "Completions with an error status (verbs)"),
]

LINK_STATES = {0: "Created", 1: "Connected", 2: "Error", 3: "Stopped"}


class RoCEv2HealthServer(pyrogue.protocols.RoCEv2Server):
    """pyrogue's ``RoCEv2Server`` with the library's link health as read-only
    polled variables (see the module's doc). Extra arguments: ``pollInterval``
    (seconds between snapshots, default 1), ``measureLatency`` (soft
    backend: measure the ACK turnaround and the delivery latency) and
    ``counterWrap`` (the FPGA's AddrWrapCount: check its frame counter,
    immediate bits [31:8], on every frame; 0, the default: not checked)."""

    def __init__(self, *, rocev2Cfg, pollInterval=1, measureLatency=False, counterWrap=0, **kwargs):
        self._stats = {}
        self._statsLock = threading.Lock()
        # The adapter reads both when the server is created (rogue's
        # constructor has no place for them).
        env = {"ROCEV2_MEASURE_LATENCY": "1" if measureLatency else "0",
               "ROCEV2_COUNTER_WRAP": str(int(counterWrap))}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            super().__init__(rocev2Cfg=rocev2Cfg, **kwargs)
        finally:
            for k, v in old.items():
                if v is None:
                    del os.environ[k]
                else:
                    os.environ[k] = v
        self._stats = dict(self._server.getStats())

        self.add(pr.LocalVariable(
            name="HealthSnapshot", mode="RO", value=0, typeStr="UInt64", hidden=True,
            localGet=self._snapshot, pollInterval=pollInterval,
            description="Snapshots of the library's counters taken (each updates every health variable)"))
        snap = [self.HealthSnapshot]

        def field(name):
            return lambda read: self._field(read, name)

        self.add(pr.LinkVariable(
            name="LinkState", mode="RO", dependencies=snap, typeStr="UInt32", enum=LINK_STATES,
            linkedGet=field("link_state"),
            description="The link: Created (no connection yet), Connected (receiving), Error (ended: see "
                        "EndCause), Stopped (stop() or the Root's stop)"))
        self.add(pr.LinkVariable(
            name="EndCause", mode="RO", dependencies=snap, typeStr="str",
            linkedGet=lambda read: self._field(read, "end_cause"),
            description="Why the link is down (a QP error with its completion status, a failing socket, "
                        "'stopped'); empty while created or connected"))
        self.add(pr.LinkVariable(
            name="Backend", mode="RO", dependencies=snap, typeStr="str",
            linkedGet=lambda read: self._field(read, "backend"),
            description="The library's receive path: 'verbs' (an RDMA NIC ACKs in hardware) or 'soft' "
                        "(rocev2's userspace responder on UDP 4791, device name 'soft')"))
        for name, key, units, desc, extra in HEALTH_VARIABLES:
            self.add(pr.LinkVariable(name=name, mode="RO", dependencies=snap, typeStr="UInt64",
                                     units=units or None, linkedGet=field(key), description=desc, **extra))
        self.add(pr.LinkVariable(
            name="LoansOutstanding", mode="RO", dependencies=snap, typeStr="UInt64", units="slots",
            linkedGet=field("loans_outstanding"),
            highWarning=max(1, self._rxQueueDepth * 3 // 4), highAlarm=self._rxQueueDepth - 1,
            description="Receive slots on loan to rogue right now (frames not yet released downstream). "
                        "At RxQueueDepth the FPGA gets RNR NAKs until a frame is released"))
        for name, key, desc in DROP_CAUSES:
            self.add(pr.LinkVariable(name=name, mode="RO", dependencies=snap, typeStr="UInt64",
                                     units="packets", linkedGet=field(key), description=desc))
        self.add(pr.LinkVariable(
            name="Drops", mode="RO", dependencies=snap, typeStr="UInt64", units="packets",
            linkedGet=lambda read: sum(self._field(read, key) for _, key, _ in DROP_CAUSES),
            highWarning=0,
            description="Packets or completions dropped, all causes (the Drops* variables beside it); "
                        "duplicates and out-of-sequence packets are not drops (the FPGA resends)"))
        for name, key, what in (("AckTurnaroundP50", "ack_turnaround_p50", "median"),
                                ("AckTurnaroundP99", "ack_turnaround_p99", "99th percentile"),
                                ("DeliveryLatencyP50", "delivery_p50", "median"),
                                ("DeliveryLatencyP99", "delivery_p99", "99th percentile")):
            kind = ("ACK turnaround: from the kernel's receive stamp of a packet that asked for an ACK to "
                    "the ACK leaving" if key.startswith("ack") else
                    "delivery latency: from the kernel's receive stamp of a frame's last packet to the "
                    "frame reaching rogue")
            self.add(pr.LinkVariable(
                name=name, mode="RO", dependencies=snap, typeStr="Float", units="us", disp="{:.1f}",
                linkedGet=lambda read, k=key: self._field(read, k + "_us"),
                description=f"{kind}, {what} (soft backend with measureLatency=True; 0 when not measured)"))

    def _snapshot(self):
        s = dict(self._server.getStats())
        with self._statsLock:
            self._stats = s
            self._count = getattr(self, "_count", 0) + 1
            return self._count

    def _field(self, read, key):
        if read:
            self.HealthSnapshot.get(read=True)
        with self._statsLock:
            return self._stats.get(key, 0)

    def health(self):
        """A fresh snapshot as a dict (every rocev2_stats field by name,
        link_state_name, end_cause, backend, latency in us)."""
        self.HealthSnapshot.get(read=True)
        with self._statsLock:
            return dict(self._stats)
