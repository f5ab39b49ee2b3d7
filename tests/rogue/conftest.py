"""Helpers for the rogue stage's tests (tests/rogue/run.sh runs them with a
rogue built with rocev2's adapter: rogue and pyrogue on PYTHONPATH, the
rocev2 CLI in ROCEV2_CLI, rocev2_pyrogue.py's directory in
ROCEV2_ROGUE_PYTHON)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

CLI = os.environ.get("ROCEV2_CLI", "")
if os.environ.get("ROCEV2_ROGUE_PYTHON"):
    sys.path.insert(0, os.environ["ROCEV2_ROGUE_PYTHON"])
# The project's Python binding, for its pattern check only (ROCEV2_LIBRARY:
# the librocev2.so.2 rogue links, so one library is loaded).
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))

import pyrogue as pr  # noqa: E402
import pyrogue.protocols  # noqa: E402
import rogue.interfaces.stream as ris  # noqa: E402
from rocev2 import pattern_check  # noqa: E402

# Bounded waits: generous, for a loaded machine; each returns as soon as its
# event happens.
WAIT = 120.0


def wait_until(cond, seconds=WAIT):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > seconds:
            return cond()
        time.sleep(0.01)
    return True


def soft_env(port="0", peer_port="0"):
    """One address: the server on any free port, ACKs to the sender's port.
    Read when the Server is created."""
    os.environ["ROCEV2_SOFT_BIND"] = "127.0.0.1"
    os.environ["ROCEV2_SOFT_PORT"] = port
    os.environ["ROCEV2_SOFT_PEER_PORT"] = peer_port


class CheckingSlave(ris.Slave):
    """Checks every frame: byte-exact pattern, sequence numbers consecutive
    from `first` in steps of `step` (a channel filter sees every n-th),
    channel = seq % nchan (when nchan), SSI SOF. `hold` keeps frames (their
    slots stay on loan) until release(); `delay` sleeps per frame."""

    def __init__(self, first=0, step=1, nchan=0, hold=0, delay=0.0, size=None):
        super().__init__()
        self.next, self.step, self.nchan, self.size = first, step, nchan, size
        self.count, self.errors, self.held = 0, [], []
        self.hold, self.delay = hold, delay
        self.lock = threading.Lock()

    def _acceptFrame(self, frame):
        with frame.lock():
            data = bytes(frame.getBa())
            chan, sof = frame.getChannel(), frame.getFirstUser()
        try:
            seq = pattern_check(data)
            assert seq == self.next, f"frame {seq} arrived, {self.next} due"
            assert self.size is None or len(data) == self.size, f"frame {seq}: {len(data)} bytes"
            assert not self.nchan or chan == seq % self.nchan, f"frame {seq} on channel {chan}"
            assert sof == 0x02, f"frame {seq}: first user {sof:#x}, SSI SOF 0x02 expected"
        except (AssertionError, ValueError) as e:
            self.errors.append(str(e))
        with self.lock:
            self.next += self.step
            self.count += 1
            if len(self.held) < self.hold:
                self.held.append(frame)
        if self.delay:
            time.sleep(self.delay)

    def release(self):
        with self.lock:
            self.hold = 0
            self.held.clear()


def fpga_sim(hp, port, frames, size, *extra, channels="0,1,2", qpn=0x4343):
    """`rocev2 fpga-sim` streaming to a server at 127.0.0.1:port with host
    params hp (pyrogue's RoCEv2HostParams)."""
    assert CLI, "ROCEV2_CLI names the rocev2 CLI"
    return subprocess.Popen(
        [CLI, "fpga-sim", "--bind", "127.0.0.1:0", "--host", f"127.0.0.1:{port}",
         "--host-qpn", str(hp.hostQpn), "--psn", str(hp.hostSqPsn), "--qpn", hex(qpn),
         "--frames", str(frames), "--size", str(size), "--channels", channels, *map(str, extra)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def sim_result(sim, timeout=WAIT):
    out, err = sim.communicate(timeout=timeout)
    assert sim.returncode == 0, f"fpga-sim failed ({sim.returncode}): {err}"
    return json.loads(out.strip().splitlines()[-1])


def gid(ip: str) -> bytes:
    return b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)


class SoftRoot(pr.Root):
    """A pyrogue Root holding one RoCEv2 Device on the soft backend (one
    address: ROCEV2_SOFT_PORT=0, ROCEV2_SOFT_PEER_PORT=0, gidIndex=0)."""

    def __init__(self, device=None, maxPayload=1024, rxQueueDepth=16, pollEn=False, **devargs):
        super().__init__(name="Root", pollEn=pollEn)
        soft_env()
        cls = device or pyrogue.protocols.RoCEv2Server
        self.add(cls(name="RoCEv2", rocev2Cfg=pyrogue.protocols.RoCEv2ServerCfg(
            ip="127.0.0.1", deviceName="soft", gidIndex=0, maxPayload=maxPayload,
            rxQueueDepth=rxQueueDepth), **devargs))

    def connect(self, qpn=0x4343, minRnrTimer=1):
        """pyrogue's bring-up: host params to the FPGA, then completeConnection."""
        dev = self.RoCEv2
        hp = dev.getHostParams()
        dev.completeConnection(qpn, pmtu=5, minRnrTimer=minRnrTimer, rnrRetry=7, retryCount=3)
        return hp, dev.stream.getUdpPort()


@pytest.fixture
def cli():
    return CLI
