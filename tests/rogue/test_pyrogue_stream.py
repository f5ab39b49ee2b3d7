"""rogue's unchanged pyrogue RoCEv2Server (in a pyrogue Root) on rocev2's
adapter, fed by `rocev2 fpga-sim` over the soft backend (tests/rogue/run.sh
runs these with a rogue built with the adapter)."""
import os
import subprocess
import sys
import tempfile
import time

import pyrogue.protocols
import rogue
import rogue.utilities.fileio
from conftest import CLI, WAIT, CheckingSlave, SoftRoot, fpga_sim, sim_result, wait_until

N = 3000


def test_device_streams_every_frame_byte_exact_in_order():
    with SoftRoot() as root:
        dev = root.RoCEv2
        assert type(dev) is pyrogue.protocols.RoCEv2Server
        sink = CheckingSlave(nchan=3, size=1024)
        dev.stream >> sink
        hp, port = root.connect()
        res = sim_result(fpga_sim(hp, port, N, 1024))
        assert wait_until(lambda: sink.count >= N)
        assert not sink.errors, sink.errors[:3]
        assert sink.count == N and dev.RxFrameCount.get() == N and dev.RxByteCount.get() == N * 1024
        assert res["frames"] == N


def test_channels_through_getChannel():
    with SoftRoot() as root:
        dev = root.RoCEv2
        sinks = [CheckingSlave(first=c, step=4, nchan=4) for c in range(4)]
        for c, sink in enumerate(sinks):
            dev.getChannel(c) >> sink
        hp, port = root.connect()
        sim_result(fpga_sim(hp, port, N, 512, channels="0,1,2,3"))
        assert wait_until(lambda: sum(s.count for s in sinks) >= N)
        for c, sink in enumerate(sinks):
            assert not sink.errors, (c, sink.errors[:3])
            assert sink.count == N // 4, (c, sink.count)


def test_frames_of_max_payload():
    # 9000 bytes (rogue's DefaultMaxPayload) in 3 packets of path MTU 4096.
    with SoftRoot(maxPayload=9000, rxQueueDepth=32) as root:
        dev = root.RoCEv2
        assert dev.MaxPayload.get() == 9000
        sink = CheckingSlave(nchan=3, size=9000)
        dev.stream >> sink
        hp, port = root.connect()
        sim_result(fpga_sim(hp, port, 1000, 9000))
        assert wait_until(lambda: sink.count >= 1000)
        assert not sink.errors, sink.errors[:3]
        assert sink.count == 1000


def test_slow_slave_behind_fifo_rnr_nothing_lost():
    """A slow Slave behind rogue's Fifo (no copy: each queued frame keeps its
    slot): the slots run out, the server sends RNR NAKs, the FPGA waits, and
    every frame arrives, in order."""
    with SoftRoot(rxQueueDepth=8) as root:
        dev = root.RoCEv2
        fifo = rogue.interfaces.stream.Fifo(0, 0, True)
        sink = CheckingSlave(nchan=3, delay=0.002)
        dev.stream >> fifo >> sink
        hp, port = root.connect()
        res = sim_result(fpga_sim(hp, port, 500, 1024))
        assert wait_until(lambda: sink.count >= 500)
        assert not sink.errors, sink.errors[:3]
        assert sink.count == 500
        assert res["rnr_naks"] > 0, res


def test_frames_held_downstream_outlive_stop():
    """rogue #1276: frames held downstream stay valid after the Root stops;
    releasing them afterwards is safe."""
    root = SoftRoot()
    root.start()
    dev = root.RoCEv2
    sink = CheckingSlave(nchan=3, hold=16)
    dev.stream >> sink
    hp, port = root.connect()
    sim = fpga_sim(hp, port, 200, 1024)
    assert wait_until(lambda: len(sink.held) >= 16)
    root.stop()
    sim.kill()
    sim.wait()
    assert not sink.errors, sink.errors[:3]
    for i, frame in enumerate(sink.held):  # still readable, byte-exact
        with frame.lock():
            data = bytes(frame.getBa())
        assert int.from_bytes(data[:8], "little") == i
    sink.release()
    try:
        dev.completeConnection(0x4343, pmtu=5, minRnrTimer=1, rnrRetry=7, retryCount=3)
        raise AssertionError("completeConnection after stop was accepted")
    except rogue.GeneralError:
        pass


def test_throwing_cpp_slave_process_lives_stop_clean():
    """A C++ Slave that throws (a StreamWriter whose size limit is below a
    frame): the adapter logs it and ends delivery, the FPGA stalls (RNR),
    the Root's stop returns, the process goes on."""
    with tempfile.TemporaryDirectory() as d:
        writer = rogue.utilities.fileio.StreamWriter()
        writer.setMaxSize(512)
        writer.open(os.path.join(d, "data.dat"))
        root = SoftRoot()
        root.start()
        dev = root.RoCEv2
        before = CheckingSlave(nchan=3)
        dev.stream >> writer.getChannel(0)
        dev.stream >> before  # rogue calls the last-added Slave first
        hp, port = root.connect()
        sim = fpga_sim(hp, port, 200, 1024)
        assert wait_until(lambda: before.count >= 1)
        # The sender stalls: it neither finishes nor fails while frames are held.
        time.sleep(1.0)
        assert sim.poll() is None, "the sender should be stalled (RNR)"
        assert before.count == 1 and dev.RxFrameCount.get() == 0, (before.count, dev.RxFrameCount.get())
        t0 = time.monotonic()
        root.stop()
        assert time.monotonic() - t0 < WAIT
        sim.kill()
        sim.wait()
        writer.close()
    assert not before.errors, before.errors[:3]


def test_stop_then_second_root_in_one_process():
    for round_ in range(2):
        with SoftRoot() as root:
            sink = CheckingSlave(nchan=3)
            root.RoCEv2.stream >> sink
            hp, port = root.connect(qpn=0x4343 + round_)
            sim_result(fpga_sim(hp, port, 500, 1024, qpn=0x4343 + round_))
            assert wait_until(lambda: sink.count >= 500), round_
            assert not sink.errors, sink.errors[:3]


def test_example_stream_graph_py():
    """examples/rogue/stream_graph.py (the README's checks) against this rogue."""
    ex = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "rogue", "stream_graph.py")
    out = subprocess.run([sys.executable, ex, CLI], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "4 passed, 0 failed" in out.stdout, out.stdout
