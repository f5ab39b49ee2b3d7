#!/usr/bin/env python3
"""rogue stream graphs fed by rocev2 (through the rogue drop-in) from the FPGA
emulator over the soft backend, in one process:

1. exception: a C++ Slave that throws (a StreamWriter over its size limit)
   behind the server: the error is logged, frame delivery ends, the sender is
   stalled (RNR), stop() returns, and the process goes on to the next checks;
2. rogue.protocols.rocev2.Server with a pyrogue Slave (server 127.0.0.1:4791,
   emulator 127.0.0.2:4791): every frame arrives in order, byte-exact, on the
   right channel with SSI SOF; holding frames stalls the sender (RNR NAKs),
   returning them resumes it;
3. pyrogue.protocols.RoCEv2Server (the Device) on one address, 127.0.0.1,
   with ROCEV2_SOFT_PORT=0 (an ephemeral port, read back with
   getUdpPort()) and ROCEV2_SOFT_PEER_PORT=0 (ACKs to the sender's port);
   gidIndex=0, since -1 would scan sysfs for an RDMA device named "soft";
4. bring-up at log level Info (in a child process, to read its output):
   every log line appears once, and one thread is named RoCEv2Server.

Needs a rogue built with -DROGUE_ROCEV2_RS=ON (see README.md), with
<rogue>/python on PYTHONPATH and <rocev2 prefix>/lib:<rogue build> on
LD_LIBRARY_PATH, and the rocev2 CLI: stream_graph.py <path to rocev2 CLI>."""
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pyrogue as pr
import pyrogue.protocols
import rogue
import rogue.interfaces.stream as ris
import rogue.protocols.rocev2 as rr
import rogue.utilities.fileio

CLI = sys.argv[1]
N, SIZE, DEPTH = 2000, 1024, 16


def gid(ip: str) -> bytes:
    return b"\0" * 10 + b"\xff\xff" + socket.inet_aton(ip)


def wait_until(cond, seconds=30.0):
    t0 = time.time()
    while not cond() and time.time() - t0 < seconds:
        time.sleep(0.01)
    return cond()


def fpga_sim(srv, host: str, bind: str, qpn: int, frames: int):
    return subprocess.Popen([CLI, "fpga-sim", "--bind", bind, "--host", host,
                             "--host-qpn", str(srv.getQpn()), "--psn", str(srv.getSqPsn()),
                             "--qpn", hex(qpn), "--frames", str(frames), "--size", str(SIZE),
                             "--channels", "0,1,2"], stdout=subprocess.PIPE, text=True)


def pattern_seq(b: bytes) -> int:
    seq = int.from_bytes(b[:8], "little")
    s = ((seq * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF) >> 32) | 1
    out = bytearray()
    while len(out) < len(b) - 8:
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        out += s.to_bytes(4, "little")
    assert bytes(out[:len(b) - 8]) == b[8:], f"frame {seq}: payload differs"
    return seq


class Counter(ris.Slave):
    def __init__(self):
        super().__init__()
        self.count = 0

    def _acceptFrame(self, frame):
        self.count += 1


class HoldingSlave(ris.Slave):
    """Checks every frame; holds the first DEPTH until told to let go."""

    def __init__(self, hold=True):
        super().__init__()
        self.count = 0
        self.errors = []
        self.held = []
        self.hold = hold
        self.lock = threading.Lock()

    def _acceptFrame(self, frame):
        with frame.lock():
            data = bytes(frame.getBa())
            try:
                seq = pattern_seq(data)
                assert seq == self.count, f"frame {seq} arrived, {self.count} due"
                assert frame.getChannel() == seq % 3, "channel"
                assert frame.getFirstUser() == 0x02, "SSI SOF"
            except AssertionError as e:
                self.errors.append(str(e))
        with self.lock:
            self.count += 1
            if self.hold and len(self.held) < DEPTH:
                self.held.append(frame)  # keeps the slot on loan


def soft_env(port: str, peer_port: str):
    os.environ["ROCEV2_SOFT_PORT"] = port
    os.environ["ROCEV2_SOFT_PEER_PORT"] = peer_port


def throwing_slave():
    """A StreamWriter whose size limit is below one frame throws from
    acceptFrame ("Frame size is larger than file size limit")."""
    soft_env("0", "0")
    srv = rr.Server.create("soft", 1, 0, SIZE, DEPTH)
    port = srv.getUdpPort()
    before = Counter()
    writer = rogue.utilities.fileio.StreamWriter()
    writer.setMaxSize(SIZE // 2)
    with tempfile.TemporaryDirectory() as d:
        writer.open(os.path.join(d, "data.dat"))
        # rogue's Master calls its Slaves last-added first: `before` sees each
        # frame, then the writer throws.
        srv >> writer.getChannel(0)
        srv >> before
        srv.setFpgaGid(gid("127.0.0.1"))
        srv.completeConnection(0x4141, srv.getSqPsn(), 5, 12)
        sim = fpga_sim(srv, f"127.0.0.1:{port}", "127.0.0.1:0", 0x4141, N)
        assert wait_until(lambda: before.count >= 1), "no frame arrived"
        time.sleep(1.0)
        assert before.count == 1, f"{before.count} frames delivered after the exception (expected 1)"
        assert srv.getFrameCount() == 0, srv.getFrameCount()
        assert sim.poll() is None, "the sender should be stalled (RNR), not finished or failed"
        srv.stop()
        sim.kill()
        sim.wait()
        writer.close()
    print(f"throwing Slave: the exception was caught and logged; {before.count} frame delivered, "
          f"then delivery ended; the sender stalled (RNR) until stop(); the process lives on")


def hold_and_release():
    soft_env("4791", "4791")
    srv = rr.Server.create("soft", 1, 0, SIZE, DEPTH)
    assert srv.getUdpPort() == 4791, srv.getUdpPort()
    sink = HoldingSlave()
    srv >> sink
    srv.setFpgaGid(gid("127.0.0.2"))
    srv.completeConnection(0x4242, srv.getSqPsn(), 5, 1)
    sim = fpga_sim(srv, "127.0.0.1:4791", "127.0.0.2:4791", 0x4242, N)
    wait_until(lambda: len(sink.held) >= DEPTH)
    time.sleep(0.5)
    stalled_at = sink.count
    assert stalled_at == DEPTH, f"with every slot held, {stalled_at} frames arrived (expected {DEPTH})"
    with sink.lock:
        sink.hold = False
        sink.held.clear()  # returning the frames re-posts their slots
    out, _ = sim.communicate(timeout=120)
    assert sim.returncode == 0, out
    wait_until(lambda: sink.count >= N)
    srv.stop()
    assert not sink.errors, sink.errors[:3]
    assert sink.count == N and srv.getFrameCount() == N, (sink.count, srv.getFrameCount())
    print(f"pyrogue Slave: held {DEPTH} frames, the sender stalled at {stalled_at} (RNR); after release "
          f"{sink.count} frames, in order, byte-exact, channels and SOF right; emulator {out.strip()}")


class SoftRoot(pr.Root):
    def __init__(self):
        super().__init__(name="SoftRoot", pollEn=False)
        self.add(pyrogue.protocols.RoCEv2Server(
            name="RoCEv2",
            rocev2Cfg=pyrogue.protocols.RoCEv2ServerCfg(
                ip="127.0.0.1", deviceName="soft", gidIndex=0, maxPayload=SIZE, rxQueueDepth=DEPTH)))


def pyrogue_device_one_host():
    soft_env("0", "0")  # read before the Device creates its server
    with SoftRoot() as root:
        dev = root.RoCEv2
        port = dev.stream.getUdpPort()
        assert port not in (0, 4791), port
        sink = HoldingSlave(hold=False)
        dev.stream >> sink
        hp = dev.getHostParams()
        dev.completeConnection(0x4343, pmtu=5, minRnrTimer=1, rnrRetry=7, retryCount=3)
        sim = subprocess.Popen([CLI, "fpga-sim", "--bind", "127.0.0.1:0", "--host", f"127.0.0.1:{port}",
                                "--host-qpn", str(hp.hostQpn), "--psn", str(hp.hostSqPsn),
                                "--qpn", "0x4343", "--frames", str(N), "--size", str(SIZE),
                                "--channels", "0,1,2"], stdout=subprocess.PIPE, text=True)
        out, _ = sim.communicate(timeout=120)
        assert sim.returncode == 0, out
        wait_until(lambda: sink.count >= N)
        frames = dev.RxFrameCount.get()
    assert not sink.errors, sink.errors[:3]
    assert sink.count == N and frames == N, (sink.count, frames)
    print(f"pyrogue RoCEv2Server Device: soft backend on 127.0.0.1:{port} (ROCEV2_SOFT_PORT=0), "
          f"{sink.count} frames in order, byte-exact; RxFrameCount {frames}")


BRING_UP = r"""
import os, socket, time, rogue, rogue.protocols.rocev2 as rr
rogue.Logging.setLevel(rogue.Logging.Info)
srv = rr.Server.create("soft", 1, 0, 1024, 16)
srv.setFpgaGid(b"\0" * 10 + b"\xff\xff" + socket.inet_aton("127.0.0.2"))
srv.completeConnection(0x4444, srv.getSqPsn(), 5, 1)
def names():
    return [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
t0 = time.time()
while "RoCEv2Server" not in names() and time.time() - t0 < 10:
    time.sleep(0.01)
time.sleep(0.2)
print("threads named RoCEv2Server:", names().count("RoCEv2Server"), flush=True)
srv.stop()
"""


def log_once_one_thread():
    soft_env("0", "0")
    out = subprocess.run([sys.executable, "-c", BRING_UP], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    # rogue's log lines: "<seconds>.<micro>:<logger>: <message>"
    lines = [m.group(1) for m in re.finditer(r"^\d+\.\d+:(.*)$", text, re.M)]
    twice = sorted({line for line in lines if lines.count(line) > 1})
    assert not twice, f"logged more than once: {twice}"
    for want in ("RC QP ready", "FPGA GID stored", "Opened RoCEv2 device 'soft'"):
        assert sum(want in line for line in lines) == 1, (want, lines)
    assert "threads named RoCEv2Server: 1" in text, text
    print(f"bring-up: {len(lines)} log lines, each once; one thread named RoCEv2Server")


def main():
    checks = [throwing_slave, hold_and_release, pyrogue_device_one_host, log_once_one_thread]
    for check in checks:
        check()
    print(f"stream_graph.py: {len(checks)} passed, 0 failed")


if __name__ == "__main__":
    main()
