#!/usr/bin/env python3
"""A rogue stream graph fed by rocev2 (through the rogue drop-in) from the FPGA
emulator over the soft backend: a pyrogue Slave gets every frame, in order,
byte-exact, on the right channel with SSI SOF; holding frames stalls the
sender (RNR NAKs), returning them resumes it.

Needs a rogue built with -DROGUE_ROCEV2_RS=ON (see README.md) on PYTHONPATH /
LD_LIBRARY_PATH, and the rocev2 CLI: stream_graph.py <path to rocev2 CLI>.
Uses 127.0.0.1:4791 (server) and 127.0.0.2:4791 (emulator)."""
import socket
import subprocess
import sys
import threading
import time

import rogue
import rogue.interfaces.stream as ris
import rogue.protocols.rocev2 as rr

CLI = sys.argv[1]
N, SIZE, DEPTH = 2000, 1024, 16


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


class HoldingSlave(ris.Slave):
    """Checks every frame; holds the first DEPTH until told to let go."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.errors = []
        self.held = []
        self.hold = True
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


def main():
    srv = rr.Server.create("soft", 1, 0, SIZE, DEPTH)
    sink = HoldingSlave()
    srv >> sink
    srv.setFpgaGid(b"\0" * 10 + b"\xff\xff" + socket.inet_aton("127.0.0.2"))
    srv.completeConnection(0x4242, srv.getSqPsn(), 5, 1)
    sim = subprocess.Popen([CLI, "fpga-sim", "--bind", "127.0.0.2:4791", "--host", "127.0.0.1:4791",
                            "--host-qpn", str(srv.getQpn()), "--psn", str(srv.getSqPsn()),
                            "--qpn", "0x4242", "--frames", str(N), "--size", str(SIZE),
                            "--channels", "0,1,2"], stdout=subprocess.PIPE, text=True)
    t0 = time.time()
    while len(sink.held) < DEPTH and time.time() - t0 < 30:
        time.sleep(0.01)
    time.sleep(0.5)
    stalled_at = sink.count
    assert stalled_at == DEPTH, f"with every slot held, {stalled_at} frames arrived (expected {DEPTH})"
    print(f"held {DEPTH} frames: the sender is stalled at {stalled_at} frames (RNR)")
    with sink.lock:
        sink.hold = False
        sink.held.clear()  # returning the frames re-posts their slots
    out, _ = sim.communicate(timeout=120)
    assert sim.returncode == 0, out
    t0 = time.time()
    while sink.count < N and time.time() - t0 < 30:
        time.sleep(0.01)
    srv.stop()
    assert not sink.errors, sink.errors[:3]
    assert sink.count == N and srv.getFrameCount() == N, (sink.count, srv.getFrameCount())
    print(f"pyrogue Slave: {sink.count} frames, in order, byte-exact, channels and SOF right; "
          f"resumed after release; emulator {out.strip()}")


if __name__ == "__main__":
    main()
