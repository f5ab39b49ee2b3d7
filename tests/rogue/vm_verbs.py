"""Inside the rxe VM (tests/rogue/vm-guest.sh): rogue's unchanged pyrogue
RoCEv2Server (as rocev2_pyrogue.RoCEv2HealthServer, its subclass) on rxe0 —
the adapter on the verbs backend, the GID index detected from sysfs as in
production (gidIndex=-1) — fed by `rocev2 verbs-fpga` on rxe1 (an RC
requester playing the FPGA). Named vm_*.py so the host's pytest run of
tests/rogue does not collect it."""
import json
import os
import subprocess

import pyrogue as pr
import pyrogue.protocols
from conftest import CLI, CheckingSlave, wait_until
from rocev2_pyrogue import RoCEv2HealthServer


class VerbsRoot(pr.Root):
    def __init__(self):
        super().__init__(name="Root", pollEn=False)
        self.add(RoCEv2HealthServer(name="RoCEv2", rocev2Cfg=pyrogue.protocols.RoCEv2ServerCfg(
            ip=os.environ["RXE1_IP"], deviceName="rxe0", gidIndex=-1, maxPayload=4096, rxQueueDepth=64)))


def test_pyrogue_stream_on_rxe0_verbs_backend():
    assert os.environ.get("ROCEV2_IN_RXE_VM"), "runs inside the rxe VM"
    n = 1000
    with VerbsRoot() as root:
        dev = root.RoCEv2
        assert dev._gidIndex == int(os.environ["RXE0_GID_IDX"])
        assert dev.HostIp.get() == os.environ["RXE0_IP"]
        assert dev.Backend.get() == "verbs" and dev.LinkState.getDisp() == "Created"
        sink = CheckingSlave(nchan=3, size=2048)
        dev.stream >> sink
        hp = dev.getHostParams()
        fpga = subprocess.Popen(
            [CLI, "verbs-fpga", "--device", "rxe1", "--gid-index", os.environ["RXE1_GID_IDX"],
             "--host-qpn", str(hp.hostQpn), "--host-gid", dev.HostGid.get(), "--psn", str(hp.hostSqPsn),
             "--frames", str(n), "--size", "2048", "--channels", "0,1,2"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(fpga.stdout.readline())
        dev.completeConnection(hello["qpn"], pmtu=5, minRnrTimer=12, rnrRetry=7, retryCount=3)
        assert dev.LinkState.getDisp() == "Connected"
        fpga.stdin.write("go\n")
        fpga.stdin.flush()
        summary = json.loads(fpga.stdout.readline())
        assert fpga.wait(timeout=300) == 0 and summary["frames"] == n
        assert wait_until(lambda: sink.count >= n)
        assert not sink.errors, sink.errors[:3]
        assert sink.count == n and dev.RxFrameCount.get() == n and dev.FramesDelivered.get() == n
        h = dev.health()
        assert h["completion_errors"] == 0 and h["backend"] == "verbs", h
        assert dev.PeerRestarts.get() == 0 and dev.StalePeers.get() == 0
    assert dev.LinkState.getDisp() == "Stopped"
