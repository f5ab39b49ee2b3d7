"""pytest: end to end through the ctypes binding — a soft-backend server in
this process, the FPGA emulator (`rocev2 fpga-sim`) in another, over loopback."""
import json
import os
import subprocess
import sys
import threading
import time

import pytest

import rocev2
from rocev2 import Rocev2Error

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FPGA_QPN = 0x4242


def cli():
    path = os.environ.get("ROCEV2_CLI")
    if path:
        return path
    for profile in ("release", "debug"):
        p = os.path.join(ROOT, "target", profile, "rocev2")
        if os.path.exists(p):
            return p
    pytest.fail("the rocev2 CLI is not built: cargo build --bin rocev2, or set ROCEV2_CLI")


def fpga_sim(server, frames, size, channels="0,1,2", faults="drop=0", wait=True, extra=()):
    args = [cli(), "fpga-sim", "--host", f"127.0.0.1:{server.udp_port}",
            "--host-qpn", str(server.getQpn()), "--psn", str(server.getSqPsn()),
            "--qpn", str(FPGA_QPN), "--frames", str(frames), "--size", str(size),
            "--channels", channels, "--faults", faults, "--timeout-code", "12", "--seed", "3",
            *extra]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err
    return p


def take_all(server, n, sim):
    """Polls and releases the `n` frames of the emulator `sim`
    (fpga_sim(wait=False)) on the connected `server`, waits for the
    emulator to end; returns its stdout."""
    for i in range(n):
        f = server.poll(timeout=60)
        assert f is not None, f"frame {i} did not arrive"
        f.release()
    out, err = sim.communicate(timeout=120)
    assert sim.returncode == 0, err
    return out


def soft_server(depth=64, max_payload=4096, icrc_check="auto"):
    cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=0,
                           peerUdpPort=0, maxPayload=max_payload, rxQueueDepth=depth, spinUs=0,
                           icrcCheck=icrc_check)
    return rocev2.Server(cfg)


def test_host_params_and_summary():
    with soft_server(depth=16, max_payload=1024) as s:
        hp = s.get_host_params()
        assert hp.mrLen == 16 * 1024
        assert 0 < hp.hostQpn < 1 << 24
        assert hp.hostRqPsn < 1 << 24 and hp.hostSqPsn < 1 << 24
        assert s.getGid() == "0000:0000:0000:0000:0000:ffff:7f00:0001"
        assert s.host_ip == "127.0.0.1"
        assert s.udp_port > 0
        assert s.maxPayload() == 1024
        assert "Host QPN" in s.conn_info() and "MrLen           : 16384" in s.conn_info()
        assert s.getFrameCount() == 0 and s.getByteCount() == 0
        assert not s.is_running()


def test_hundred_thousand_frames_with_faults_through_the_pull_api():
    n = 100_000
    with soft_server(depth=256) as s:
        s.complete_connection(FPGA_QPN)
        assert s.is_running()
        p = fpga_sim(s, n, 64, faults="drop=0.01,dup=0.01,reorder=0.01", wait=False)
        for i in range(n):
            f = s.poll(timeout=60)
            assert f is not None, f"frame {i} did not arrive"
            with f:
                assert rocev2.pattern_check(f.data) == i
                assert f.channel == i % 3
                assert f.ring_position == i
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        st = s.stats()
        assert st["frames"] == n and st["bytes"] == n * 64
        assert st["duplicates"] > 0 and st["seq_naks_tx"] > 0
        assert st["loans_outstanding"] == 0
        assert st["payload_direct"] + st["payload_copied"] == n
        assert s.getFrameCount() == n


def test_callback_mode_zero_copy():
    n = 2000
    got, addrs, errors = [], set(), []
    with soft_server(depth=32) as s:
        base, mr_len = s.getMrAddr(), s.get_host_params().mrLen

        def on_frame(frame):
            try:
                got.append((rocev2.pattern_check(frame.data), frame.channel))
                addrs.add(frame.address)
                assert base <= frame.address < base + mr_len
            except Exception as e:  # reported below, not lost in ctypes
                errors.append(e)

        s.set_frame_callback(on_frame)
        s.complete_connection(FPGA_QPN)
        fpga_sim(s, n, 1000, channels="4")
        deadline = time.time() + 30
        while len(got) < n and time.time() < deadline:
            time.sleep(0.01)
        assert not errors, errors[0]
        assert got == [(i, 4) for i in range(n)]
        assert len(addrs) <= 32, "frames land in the 32 slab slots"
        with pytest.raises(Rocev2Error, match="callback is registered"):
            s.poll(timeout=0)


def test_held_frames_stall_the_sender_and_releases_resume_it():
    with soft_server(depth=4) as s:
        s.complete_connection(FPGA_QPN, transport=rocev2.TransportCfg(minRnrTimer=1))
        p = fpga_sim(s, 40, 4096, channels="0", wait=False)
        held = [s.poll(timeout=30) for _ in range(4)]
        assert all(held)
        time.sleep(0.2)
        assert s.poll(timeout=0) is None, "no slot: nothing more arrives"
        assert s.stats()["rnr_naks_tx"] > 0
        for f in held:
            f.release()
        for i in range(4, 40):
            f = s.poll(timeout=30)
            assert rocev2.pattern_check(f.data) == i
            f.release()
        p.communicate(timeout=60)
        assert p.returncode == 0


def test_channel_views():
    with soft_server(depth=64) as s:
        s.complete_connection(FPGA_QPN)
        fpga_sim(s, 30, 64, channels="1,2,3")
        ch2 = s.channel(2)

        def seq(frame):
            with frame:  # the frame (and its memoryview) ends here
                return rocev2.pattern_check(frame.data)

        seqs = [seq(ch2.poll(timeout=10)) for _ in range(10)]
        assert seqs == list(range(1, 30, 3))
        rest = [seq(s.poll(timeout=10)) for _ in range(20)]
        assert sorted(rest) == [i for i in range(30) if i % 3 != 1]
        with pytest.raises(Rocev2Error, match="0..255"):
            s.channel(256)


def test_a_dropped_frame_releases_its_slot_and_its_view():
    with soft_server(depth=2) as s:
        s.complete_connection(FPGA_QPN)
        fpga_sim(s, 1, 64)
        f = s.poll(timeout=10)
        view = f.data
        del f  # garbage collected: released, and the view with it
        with pytest.raises(ValueError):
            bytes(view)
        assert s.stats()["loans_outstanding"] == 0


def test_misuse_is_refused():
    with soft_server(depth=4) as s:
        with pytest.raises(Rocev2Error, match=r"pmtu must be in the range 1..5 .*got 9"):
            s.completeConnection(FPGA_QPN, pmtu=9)
        with pytest.raises(Rocev2Error, match="GID must be 16 bytes"):
            s.setFpgaGid(b"short")
        s.complete_connection(FPGA_QPN)
        with pytest.raises(Rocev2Error, match="completeConnection already invoked") as e:
            s.complete_connection(FPGA_QPN)
        assert e.value.status_name == "STATE"
        s.stop()
        s.stop()
        with pytest.raises(Rocev2Error) as e:
            s.poll(timeout=0)
        assert e.value.status_name == "STOPPED"
    with pytest.raises(Rocev2Error, match="closed"):
        s.getQpn()


def test_frames_stay_valid_after_close():
    s = soft_server(depth=4)
    s.complete_connection(FPGA_QPN)
    fpga_sim(s, 2, 256)
    frames = [s.poll(timeout=10) for _ in range(2)]
    s.close()
    assert [rocev2.pattern_check(f.data) for f in frames] == [0, 1]
    for f in frames:
        f.release()


@pytest.mark.parametrize("mode", ["off", "auto"])
def test_icrc_check_modes(mode):
    n = 500
    with soft_server(depth=32, icrc_check=mode) as s:
        s.complete_connection(FPGA_QPN)
        p = fpga_sim(s, n, 256, wait=False)
        for i in range(n):
            f = s.poll(timeout=60)
            assert f is not None, f"frame {i} did not arrive"
            with f:
                assert rocev2.pattern_check(f.data) == i
        p.communicate(timeout=120)
        st = s.stats()
        assert st["icrc_errors"] == 0
        assert st["icrc_checked"] + st["icrc_unchecked"] == st["packets_rx"]
        if mode == "off":
            assert st["icrc_checked"] == 0
        elif os.geteuid() == 0:
            assert st["icrc_unchecked"] == 0 and st["icrc_checked"] >= n


def test_the_obvious_call_on_one_host_streams():
    """ServerCfg(ip="127.0.0.1", deviceName="soft") keeps rogue's defaults:
    UDP port 4791 and peer port 4791, i.e. the FPGA's address is the server's
    own socket. The library ACKs each packet's source port then, so
    `rocev2 fpga-sim` with its defaults (to 127.0.0.1:4791) completes."""
    try:
        s = rocev2.Server(rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft"))
    except Rocev2Error as e:
        if "in use" in str(e):
            pytest.skip(f"127.0.0.1:4791 is taken on this host: {e}")
        raise
    with s:
        assert s.udp_port == 4791
        s.complete_connection(FPGA_QPN)
        p = subprocess.Popen([cli(), "fpga-sim", "--host-qpn", str(s.getQpn()), "--psn", str(s.getSqPsn()),
                              "--qpn", str(FPGA_QPN), "--frames", "500", "--size", "1024"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(500):
            f = s.poll(timeout=30)
            assert f is not None, f"frame {i} did not arrive"
            with f:
                assert rocev2.pattern_check(f.data) == i
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert '"timeouts": 0' in out, out


def _roce(opcode, qpn, psn, payload=b"", imm=None):
    """One RoCEv2 request packet (BTH [ImmDt] payload pad ICRC); the ICRC is
    not checked by a server with icrcCheck="off"."""
    import struct
    pad = (4 - len(payload) % 4) % 4
    bth = struct.pack(">BBHBBHBBH", opcode, pad << 4, 0xFFFF, 0,
                      (qpn >> 16) & 0xFF, qpn & 0xFFFF, 0x80,
                      (psn >> 16) & 0xFF, psn & 0xFFFF)
    ext = struct.pack(">I", imm) if imm is not None else b""
    return bth + ext + payload + b"\0" * pad + b"\0\0\0\0"


def test_empty_and_immediate_less_messages_are_delivered():
    """What an RC sender sees ACKed reaches Python: a 0-byte SEND with
    immediate and a SEND without one (has_immediate False)."""
    import socket
    with soft_server(depth=4, max_payload=1024, icrc_check="off") as s:
        s.complete_connection(FPGA_QPN)
        psn = s.getSqPsn()
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tx.bind(("127.0.0.1", 0))
        body = bytes(range(100))
        tx.sendto(_roce(0x05, s.getQpn(), psn, b"", imm=0x1207), ("127.0.0.1", s.udp_port))
        tx.sendto(_roce(0x04, s.getQpn(), (psn + 1) & 0xFFFFFF, body), ("127.0.0.1", s.udp_port))
        f = s.poll(timeout=10)
        assert f is not None and len(f.data) == 0
        assert f.has_immediate and f.immediate == 0x1207 and f.channel == 7
        f.release()
        f = s.poll(timeout=10)
        assert f is not None and bytes(f.data) == body and not f.has_immediate
        f.release()
        tx.close()


def test_link_health_and_a_restarted_fpga():
    with soft_server(depth=64) as s:
        h = s.health()
        assert h["state"] is rocev2.LinkState.CREATED
        assert (h["since_last_packet_s"], h["since_last_frame_s"], h["end_cause"]) == (None, None, None)
        s.complete_connection(FPGA_QPN)
        assert s.health()["state"] is rocev2.LinkState.CONNECTED
        # An FPGA re-programmed after a reload, with the same params: twice the same stream.
        got = []

        def consume():
            for f in s.frames(timeout=30):
                with f:
                    got.append(rocev2.pattern_check(f))
                if len(got) == 1000:
                    return
        t = threading.Thread(target=consume)
        t.start()
        fpga_sim(s, 500, 2048)
        fpga_sim(s, 500, 2048)
        t.join(60)
        assert got == list(range(500)) * 2
        h = s.health()
        assert h["peer_restarts"] == 1 and h["state"] is rocev2.LinkState.CONNECTED
        assert 0 <= h["since_last_packet_s"] < 30 and 0 <= h["since_last_frame_s"] < 30
        st = s.stats()
        assert st["peer_restarts"] == 1 and st["link_state"] == rocev2.LinkState.CONNECTED
        s.stop()
        h = s.health()
        assert (h["state"], h["end_cause"]) == (rocev2.LinkState.STOPPED, "stopped")


def test_batch_pull_and_release_in_one_call_each():
    n = 3000
    with soft_server(depth=64) as s:
        s.complete_connection(FPGA_QPN)
        p = fpga_sim(s, n, 256, wait=False)
        seen, calls = [], 0
        while len(seen) < n:
            batch = s.poll_frames(32, timeout=30)
            assert 1 <= len(batch) <= 32
            calls += 1
            seen += [rocev2.pattern_check(f) for f in batch]
            s.release_frames(batch)
            assert all(len(f) == 0 for f in batch), "released frames are empty"
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert seen == list(range(n))
        assert calls <= n, calls
        assert s.poll_frames(8, timeout=0.05) == []
        st = s.stats()
        assert st["loans_outstanding"] == 0 and st["releases"] == n
        with pytest.raises(Rocev2Error, match="max_frames must be >= 1"):
            s.poll_frames(0)
        s.release_frames(batch)  # already released: nothing to do
        s.stop()
        with pytest.raises(Rocev2Error) as e:
            s.poll_frames(4, timeout=0.1)
        assert e.value.status is rocev2.Status.STOPPED


def test_batch_frames_are_views_of_their_bytes_and_threads_polling_at_once_share_none():
    n, size = 2000, 700
    with soft_server(depth=64, max_payload=1024) as s:
        s.complete_connection(FPGA_QPN)
        p = fpga_sim(s, n, size, wait=False)
        seen, lock = [], threading.Lock()

        def consume():
            while True:
                with lock:
                    if len(seen) >= n:
                        return
                batch = s.poll_frames(16, timeout=0.5)
                for f in batch:
                    assert len(f) == size and len(f.data) == size
                    assert f.data.readonly and f.data.format == "B"
                    # The view holds the frame's bytes: what the library's in-place check reads.
                    assert rocev2.pattern_check(f.data) == rocev2.pattern_check(f)
                    assert f.has_immediate and f.channel in (0, 1, 2)
                with lock:
                    seen.extend(rocev2.pattern_check(f) for f in batch)
                s.release_frames(batch)
                for f in batch:
                    with pytest.raises(ValueError):
                        f.data[0]  # released: the view is gone
        threads = [threading.Thread(target=consume) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert p.wait(timeout=120) == 0
        assert sorted(seen) == list(range(n)), "every frame once, to one thread"
        assert s.stats()["loans_outstanding"] == 0


def test_recreate_gives_a_fresh_link_and_old_loans_stay_valid():
    with soft_server(depth=16) as s:
        s.complete_connection(FPGA_QPN)
        p = fpga_sim(s, 20, 512, wait=False)
        held = s.poll(timeout=30)
        data = held.tobytes()
        for _ in range(19):
            s.poll(timeout=30).release()
        assert p.wait(timeout=120) == 0
        old = s.get_host_params()
        hp = s.recreate()  # as after an FPGA reload the host cannot follow
        assert (hp.hostQpn, hp.hostSqPsn) != (old.hostQpn, old.hostSqPsn)
        assert s.health()["state"] is rocev2.LinkState.CREATED
        assert held.tobytes() == data, "a loan of the old server stays valid"
        s.complete_connection(FPGA_QPN)
        p = fpga_sim(s, 30, 512, wait=False)  # the FPGA programmed with the new params
        seqs, batch = [], []
        while len(seqs) < 30:
            s.release_frames(batch)
            batch = s.poll_frames(8, timeout=30)
            assert batch, f"{len(seqs)} of 30 frames"
            seqs += [rocev2.pattern_check(f) for f in batch]
        assert p.wait(timeout=120) == 0
        assert seqs == list(range(30))
        s.release_frames(batch + [held])  # loans of two servers in one call
        assert len(held) == 0 and s.stats()["loans_outstanding"] == 0


def test_a_held_export_of_frame_data_keeps_the_loan_until_it_is_dropped():
    """A consumer holding frame.data's buffer (numpy.frombuffer(frame.data)
    does; here struct.iter_unpack) keeps the slot: release() says so and keeps
    the loan, release() after the consumer drops it releases, and a frame
    garbage collected meanwhile releases once the consumer drops it. With
    depth 2 a lost loan would stall the stream."""
    import struct
    with soft_server(depth=2) as s:
        s.complete_connection(FPGA_QPN, transport=rocev2.TransportCfg(minRnrTimer=1))
        p = fpga_sim(s, 8, 64, channels="0", wait=False)
        f = s.poll(timeout=30)
        held = struct.iter_unpack("<Q", f.data)  # exports f.data's buffer
        with pytest.raises(BufferError, match=r"frame.data is held .* stays on loan"):
            f.release()
        assert len(f) == 64 and rocev2.pattern_check(f) == 0, "still on loan, still readable"
        assert next(held) == (0,)
        del held
        f.release()  # the retry releases
        assert len(f) == 0 and s.stats()["releases"] == 1

        f = s.poll(timeout=30)
        held = struct.iter_unpack("<Q", f.data)
        del f  # garbage collected with the export held: the loan stays with the export
        assert s.stats()["releases"] == 1
        assert next(held) == (1,), "the consumer still reads its frame"
        del held
        assert s.stats()["releases"] == 2

        frames = [s.poll(timeout=30) for _ in range(2)]
        held = struct.iter_unpack("<Q", frames[1].data)
        with pytest.raises(BufferError, match=r"1 of 2 frames"):
            s.release_frames(frames)  # releases the others, keeps the held one
        assert len(frames[0]) == 0 and len(frames[1]) == 64
        del held
        s.release_frames(frames)
        for i in range(4, 8):
            f = s.poll(timeout=30)
            assert f is not None, f"frame {i} did not arrive: a slot leaked"
            f.release()
        assert p.wait(timeout=120) == 0
        assert s.stats()["loans_outstanding"] == 0


def script_env():
    """The environment of a Python script run by a test: it imports the
    rocev2 this process tests (the installed package, or python/ of this
    checkout) with the same library (conftest sets ROCEV2_LIBRARY)."""
    env = dict(os.environ)
    if os.environ.get("ROCEV2_TEST_INSTALLED") != "1":
        env["PYTHONPATH"] = os.pathsep.join(p for p in [os.path.join(ROOT, "python"),
                                                        env.get("PYTHONPATH")] if p)
    return env


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_servers_dropped_without_close_free_their_port_and_threads():
    """The garbage collector closes a server nobody closed: its UDP port is
    free again (a new server binds it) and its receive thread is gone, also
    for one whose frame callback refers to the server."""
    import gc
    before = _threads()
    ports = []
    for i in range(6):
        s = soft_server(depth=16)
        if i % 2:
            s.set_frame_callback(lambda frame, s=s: s.stats())  # a cycle through the callback
        s.complete_connection(FPGA_QPN)
        assert s.is_running()
        ports.append(s.udp_port)
        del s
    gc.collect()
    for port in ports:
        cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=port, peerUdpPort=0,
                               maxPayload=1024, rxQueueDepth=4)
        rocev2.Server(cfg).close()  # Rocev2Error "in use" while a dropped server holds it
    deadline = time.monotonic() + 30  # a bound against hanging, not a speed requirement
    while _threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads() <= before, "the dropped servers' receive threads are gone"


EXIT_WHILE_RECEIVING = """
import subprocess, sys, time
import rocev2
cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=0, peerUdpPort=0,
                       maxPayload=1024, rxQueueDepth=64, spinUs=0)
s = rocev2.Server(cfg)
got = []

def on_frame(frame):
    got.append(frame.channel)
    time.sleep(0.0005)  # the receive thread spends its time in Python

s.set_frame_callback(on_frame)
s.complete_connection(0x4242)
p = subprocess.Popen([sys.argv[1], "fpga-sim", "--host", f"127.0.0.1:{s.udp_port}", "--host-qpn",
                      str(s.getQpn()), "--psn", str(s.getSqPsn()), "--qpn", "0x4242",
                      "--frames", "100000000", "--size", "1024"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(p.pid, flush=True)
while len(got) < 200:
    time.sleep(0.01)
if sys.argv[2] == "del":
    del s  # dropped without close while its callback receives
# and the interpreter exits, the callback still receiving
"""


@pytest.mark.parametrize("how", ["exit", "del"])
def test_exiting_while_a_frame_callback_receives_is_clean(tmp_path, how):
    script = tmp_path / "exit_while_receiving.py"
    script.write_text(EXIT_WHILE_RECEIVING)
    for _ in range(3):
        p = subprocess.Popen([sys.executable, str(script), cli(), how], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=script_env())
        try:
            out, err = p.communicate(timeout=120)
        finally:
            p.kill()
        sim = int(out.split()[0]) if out.split() else None
        if sim:
            try:
                os.kill(sim, 9)
                os.waitpid(sim, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        assert p.returncode == 0, f"rc {p.returncode}: {err[-2000:]}"


def test_a_server_closed_in_its_own_frame_callback_is_destroyed_by_the_next_close():
    """close() inside the frame callback (or the callback dropping the last
    reference) runs on the receive thread, where the library's destroy must
    not: the server stops there and is destroyed by the next server created
    or closed on another thread (its port is free again)."""
    closed = threading.Event()
    s = soft_server(depth=16)
    port = s.udp_port

    def on_frame(frame):
        s.close()
        closed.set()

    s.set_frame_callback(on_frame)
    s.complete_connection(FPGA_QPN)
    p = fpga_sim(s, 3, 64, wait=False)
    try:
        assert closed.wait(30), "no frame arrived"
    finally:
        p.kill()
        p.wait()
    with pytest.raises(Rocev2Error, match="closed"):
        s.getQpn()
    assert len(rocev2._deferred) == 1, "stopped on the receive thread, the destroy deferred"
    cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=port, peerUdpPort=0,
                           maxPayload=1024, rxQueueDepth=4)
    deadline = time.monotonic() + 30  # the receive thread frees the socket as it ends
    while True:
        try:
            rocev2.Server(cfg).close()  # this thread destroys the deferred one
            break
        except Rocev2Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert rocev2._deferred == []


BLOCKED_WAIT = """
import signal
import sys
import rocev2
# Ctrl-C as a terminal delivers it: a runner started in the background (a
# shell's `&`, nohup, some CI agents) passes SIGINT on ignored, and Python
# then installs no KeyboardInterrupt handler.
signal.signal(signal.SIGINT, signal.default_int_handler)
cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=0, peerUdpPort=0,
                       maxPayload=1024, rxQueueDepth=4, spinUs=0)
s = rocev2.Server(cfg)
s.complete_connection(0x4242)
print("waiting", flush=True)
try:
    {call}
    print("returned", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def _sleeping(pid):
    """The process's main thread is asleep (blocked in a wait)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "S"


@pytest.mark.parametrize("call", ["s.poll()", "s.poll(timeout=3600)", "s.poll_frames()",
                                  "s.poll_frames(8, timeout=3600)", "next(iter(s))", "s.channel(1).poll()"])
def test_ctrl_c_interrupts_a_blocked_wait(tmp_path, call):
    """SIGINT (Ctrl-C) raises KeyboardInterrupt in a thread blocked waiting
    for a frame, with or without a timeout: the binding waits in slices and
    Python runs its signal handlers between them."""
    import signal
    script = tmp_path / "blocked_wait.py"
    script.write_text(BLOCKED_WAIT.format(call=call))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=script_env())
    try:
        assert p.stdout.readline() == "waiting\n", p.stderr.read()
        deadline = time.monotonic() + 30  # bounds against hanging, not speed requirements
        while not _sleeping(p.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        p.send_signal(signal.SIGINT)
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{call}: SIGINT did not interrupt the wait (still blocked after 60 s)")
        assert out == "interrupted\n", err
    finally:
        p.kill()
        p.wait()


def test_reading_one_channel_of_several_does_not_stall_the_link():
    """poll(channel=...) and channel views keep the other channels' frames for
    their readers, at most half the receive queue of them: beyond that the
    oldest kept is released, counted in server.channel_drops. Reading only
    channel 0 of a 4-channel stream goes on to the end."""
    n, depth = 400, 16
    with soft_server(depth=depth) as s:
        s.complete_connection(FPGA_QPN, transport=rocev2.TransportCfg(minRnrTimer=1))
        p = fpga_sim(s, n, 64, channels="0,1,2,3", wait=False)
        try:
            ch0 = s.channel(0)
            for i in range(0, n, 4):
                f = ch0.poll(timeout=30)
                assert f is not None, f"frame {i} (channel 0) did not arrive: the link stalled"
                with f:
                    assert rocev2.pattern_check(f) == i
            assert p.wait(timeout=120) == 0
        finally:
            p.kill()
            p.wait()
        kept = []
        while True:
            f = s.poll(timeout=0)
            if f is None:
                break
            with f:
                kept.append(rocev2.pattern_check(f))
        others = [i for i in range(n) if i % 4]
        assert 0 < len(kept) <= depth // 2 + 3  # + the last three, never polled for channel 0
        assert sorted(kept) == others[-len(kept):], "the newest are kept"
        assert kept == sorted(kept), "kept frames come in arrival order"
        assert s.channel_drops == len(others) - len(kept)
        assert s.stats()["loans_outstanding"] == 0


def test_measured_latency_and_busy_polling():
    """measureLatency: one ACK turnaround sample per packet that asked for
    an ACK (one per 1000-byte message) and one delivery sample per frame
    polled, quantiles in order; busyPollUs is accepted on loopback (where it
    does nothing); off, nothing is measured."""
    n = 3000
    for measure in (True, False):
        cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=0,
                               peerUdpPort=0, maxPayload=1000, rxQueueDepth=64, spinUs=0,
                               measureLatency=measure, busyPollUs=20 if measure else 0)
        with rocev2.Server(cfg) as s:
            s.complete_connection(FPGA_QPN)
            take_all(s, n, fpga_sim(s, n, 1000, wait=False))
            st = s.stats()
            if not measure:
                assert all(st[k] == 0 for k in st if k.startswith(("ack_turnaround_", "delivery_")))
                continue
            assert st["delivery_count"] == n and st["ack_turnaround_count"] == n, st
            for h in ("ack_turnaround", "delivery"):
                assert 0 < st[f"{h}_p50_ns"] <= st[f"{h}_p99_ns"] <= st[f"{h}_p999_ns"], st
                assert st[f"{h}_max_ns"] > 0
    with pytest.raises(Rocev2Error, match="busyPollUs"):
        rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", busyPollUs=-1)


def test_the_fpga_counter_is_checked_when_asked():
    """counterWrap: the numbers fpga-sim skipped (--faults skip) come back as
    counter gaps, each of one frame; every frame still arrives. 0: unchecked."""
    n = 4000
    for wrap in (256, 0):
        cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=0,
                               peerUdpPort=0, maxPayload=256, rxQueueDepth=64, spinUs=0,
                               counterWrap=wrap)
        with rocev2.Server(cfg) as s:
            s.complete_connection(FPGA_QPN)
            p = fpga_sim(s, n, 256, faults="skip=0.01", wait=False, extra=("--counter-wrap", "256"))
            out = take_all(s, n, p)
            skipped = json.loads(out)["skipped_numbers"]
            assert skipped > 0, out
            st = s.stats()
            want = (skipped, skipped, 0) if wrap else (0, 0, 0)
            assert (st["counter_gaps"], st["counter_gap_frames"], st["counter_resets"]) == want, st
            # (A slow Python consumer may make an RNR storm; no duplicating peer.)
            h = s.health()
            assert h["duplicating_peer"] is False and isinstance(h["rnr_storm"], bool), h
            assert st["duplicating_peers"] == 0, st
    with pytest.raises(Rocev2Error, match="counterWrap"):
        rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", counterWrap=1 << 25)


def test_every_frame_carries_the_kernels_receive_time():
    """Frame.rx_time_ns: the kernel's receive stamp of the frame's last
    packet (rx_time_source "kernel" on soft), after the emulator started and
    before the frame was polled, on poll() and on poll_frames() alike."""
    n = 400
    with soft_server(depth=64, max_payload=1024) as s:
        s.complete_connection(FPGA_QPN)
        before = time.time_ns()
        p = fpga_sim(s, n, 1000, wait=False)
        seen = []
        while len(seen) < n:
            batch = [s.poll(timeout=60)] if len(seen) % 2 else s.poll_frames(16, timeout=60)
            now = time.time_ns()
            assert batch and batch[0] is not None, f"frame {len(seen)} did not arrive"
            for f in batch:
                with f:
                    assert f.rx_time_source == "kernel", f
                    assert before <= f.rx_time_ns <= now, (before, f.rx_time_ns, now)
                    seen.append(f.rx_time_ns)
        assert seen == sorted(seen)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
