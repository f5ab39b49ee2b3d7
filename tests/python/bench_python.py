"""Frames/s through the ctypes binding (pull API, batch pull, callback API) against the
same consumer in C (examples/c/consume.c), same emulator, same run.
    python3 bench_python.py <rocev2 CLI> <C consumer binary> [frames] [size] [fpga-sim options...]"""
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
import rocev2  # noqa: E402

CLI, C_CONSUMER = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 100_000
SIZE = int(sys.argv[4]) if len(sys.argv) > 4 else 1024
SIM_ARGS = sys.argv[5:]  # e.g. --window 256 --gso: the same for every consumer


def server():
    return rocev2.Server(rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", gidIndex=0, udpPort=0,
                                          peerUdpPort=0, maxPayload=SIZE))


def sim(s):
    return subprocess.Popen([CLI, "fpga-sim", "--host", f"127.0.0.1:{s.udp_port}", "--host-qpn", str(s.getQpn()),
                             "--psn", str(s.getSqPsn()), "--qpn", "0x4242", "--frames", str(N),
                             "--size", str(SIZE)] + SIM_ARGS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pull():
    with server() as s:
        s.completeConnection(0x4242, minRnrTimer=1)
        p = sim(s)
        f = s.poll(timeout=10)
        t0 = time.perf_counter()
        f.release()
        for _ in range(N - 1):
            s.poll(timeout=10).release()
        rate = (N - 1) / (time.perf_counter() - t0)
        p.wait()
        return rate


def batch():
    with server() as s:
        s.completeConnection(0x4242, minRnrTimer=1)
        p = sim(s)
        first = s.poll(timeout=10)
        t0 = time.perf_counter()
        first.release()
        got = 1
        while got < N:
            frames = s.poll_frames(64, timeout=10)
            got += len(frames)
            s.release_frames(frames)
        rate = (N - 1) / (time.perf_counter() - t0)
        p.wait()
        return rate


def callback():
    done = threading.Event()
    count = [0, 0.0]

    def on_frame(frame):
        if count[0] == 0:
            count[1] = time.perf_counter()
        count[0] += 1
        frame.release()
        if count[0] == N:
            done.set()

    with server() as s:
        s.set_frame_callback(on_frame)
        s.completeConnection(0x4242, minRnrTimer=1)
        p = sim(s)
        done.wait(120)
        rate = (count[0] - 1) / (time.perf_counter() - count[1])
        p.wait()
        return rate


c = float(subprocess.run([C_CONSUMER, CLI, str(N), str(SIZE)] + SIM_ARGS, capture_output=True, text=True, check=True).stdout)
py_pull, py_batch, py_cb = pull(), batch(), callback()
print(f"{'Python pull API (poll + release)':<44} {py_pull:>14.0f} f/s {'C consumer: %.0f f/s' % c:>34} {py_pull / c:>7.2f}")
print(f"{'Python batch pull (poll_frames + release_frames)':<44} {py_batch:>14.0f} f/s {'C consumer: %.0f f/s' % c:>34} {py_batch / c:>7.2f}")
print(f"{'Python callback API':<44} {py_cb:>14.0f} f/s {'C consumer: %.0f f/s' % c:>34} {py_cb / c:>7.2f}")
