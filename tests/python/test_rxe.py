"""pytest, inside the rxe VM (tests/vm/run.sh): the verbs backend through
the ctypes binding. A server on rxe0, `rocev2 verbs-fpga` on rxe1 as the FPGA."""
import json
import os
import subprocess
import time

import pytest

import rocev2

pytestmark = pytest.mark.skipif(not os.environ.get("ROCEV2_IN_RXE_VM"),
                                reason="needs the rxe VM (tests/vm/run.sh)")


def test_verbs_end_to_end_through_python():
    cfg = rocev2.ServerCfg(ip="10.77.0.2", deviceName="rxe0", maxPayload=4096, rxQueueDepth=64)
    assert cfg.gidIndex == -1  # detected from sysfs, like pyrogue
    with rocev2.Server(cfg) as srv:
        assert srv.gidIndex == int(os.environ["RXE0_GID_IDX"])
        assert srv.host_ip == "10.77.0.1"
        hp = srv.get_host_params()
        n = 1000
        fpga = subprocess.Popen(
            [os.environ["ROCEV2_CLI"], "verbs-fpga", "--device", "rxe1", "--gid-index", os.environ["RXE1_GID_IDX"],
             "--host-qpn", str(hp.hostQpn), "--host-gid", srv.getGid(), "--psn", str(hp.hostSqPsn),
             "--frames", str(n), "--size", "2048", "--channels", "5,6"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(fpga.stdout.readline())
        srv.completeConnection(hello["qpn"])          # fpgaRqPsn defaults to the host SQ PSN
        fpga.stdin.write("go\n")
        fpga.stdin.flush()
        t0 = time.time()
        for i in range(n):
            f = srv.poll(timeout=60)
            assert f is not None, f"frame {i} missing"
            with f:
                assert rocev2.pattern_check(f.data) == i
                assert f.channel == (5, 6)[i % 2]
                assert f.ring_position == i
        rate = n / (time.time() - t0)
        summary = json.loads(fpga.stdout.readline())
        assert fpga.wait(timeout=60) == 0
        assert summary["frames"] == n
        st = srv.stats()
        assert st["frames"] == n and st["bytes"] == n * 2048 and st["completion_errors"] == 0
        print(f"RXE-RATE python pull API verbs e2e: {rate:.0f} frames/s (2048 B) under TCG")


def _stream(srv, n, size=2048):
    """`rocev2 verbs-fpga` on rxe1 programmed with srv's host params streams
    n frames; returns after checking every one."""
    hp = srv.get_host_params()
    fpga = subprocess.Popen(
        [os.environ["ROCEV2_CLI"], "verbs-fpga", "--device", "rxe1", "--gid-index", os.environ["RXE1_GID_IDX"],
         "--host-qpn", str(hp.hostQpn), "--host-gid", srv.getGid(), "--psn", str(hp.hostSqPsn),
         "--frames", str(n), "--size", str(size)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    hello = json.loads(fpga.stdout.readline())
    srv.completeConnection(hello["qpn"])
    fpga.stdin.write("go\n")
    fpga.stdin.flush()
    for i in range(n):
        f = srv.poll(timeout=60)
        assert f is not None, f"frame {i} missing"
        with f:
            assert rocev2.pattern_check(f) == i
    assert fpga.wait(timeout=60) == 0


def test_recreate_is_the_remedy_on_verbs():
    # After an FPGA reload the NIC ACKs the restarted stream as duplicates:
    # the host re-creates its server (new QP, new PSNs) and the FPGA is
    # programmed again with the new host params.
    cfg = rocev2.ServerCfg(ip="10.77.0.2", deviceName="rxe0", maxPayload=4096, rxQueueDepth=32)
    with rocev2.Server(cfg) as srv:
        _stream(srv, 100)
        old = srv.get_host_params()
        hp = srv.recreate()
        assert hp.hostQpn != old.hostQpn
        assert srv.health()["state"] is rocev2.LinkState.CREATED
        _stream(srv, 100)
        h = srv.health()
        assert h["state"] is rocev2.LinkState.CONNECTED and h["since_last_frame_s"] is not None
        assert srv.stats()["frames"] == 100
        # rxe0's counters are watched; a clean stream draws no verdict.
        assert h["stale_peer"] is False and h["peer_restarts"] == 0 and h["lost_frames_estimate"] == 0
        assert srv.stats()["peer_watched"] == 1
