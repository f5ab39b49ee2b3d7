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


def c_consumer():
    out = subprocess.run([C_CONSUMER, CLI, str(N), str(SIZE)] + SIM_ARGS, capture_output=True, text=True,
                         check=True).stdout
    return float(out)


# Runs interleaved (C, then each Python API, RUNS times), each ratio against the C run
# beside it: a 2-CPU host's scheduling swings single runs by 30% either way.
RUNS = int(os.environ.get("RUNS", "5"))
ratios = {"pull": [], "batch": [], "callback": []}
c_rates = []
for _ in range(RUNS):
    c = c_consumer()
    c_rates.append(c)
    for name, fn in (("pull", pull), ("batch", batch), ("callback", callback)):
        ratios[name].append((fn() / c, c))


def row(label, runs):
    runs = sorted(runs)
    lo, mid, hi = runs[0][0], runs[len(runs) // 2][0], runs[-1][0]
    rate = runs[len(runs) // 2][0] * runs[len(runs) // 2][1]
    ref = "C consumer: %.0f f/s" % runs[len(runs) // 2][1]
    print(f"{label:<50} {rate:>10.0f} f/s {ref:>30}  {lo:.2f}/{mid:.2f}/{hi:.2f}")


sender = " ".join(SIM_ARGS) or "fpga-sim defaults: surf's window of 4, one packet per datagram"
print(f"Python vs C, {SIZE} B frames, {N} per run, {RUNS} interleaved runs, min/median/max of "
      f"Python/C per run (sender: {sender})")
row("Python pull API (poll + release)", ratios["pull"])
row("Python batch pull (poll_frames + release_frames)", ratios["batch"])
row("Python callback API", ratios["callback"])
