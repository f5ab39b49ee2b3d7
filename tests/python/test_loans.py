"""pytest: loans and views under hostile Python (issue 38, findings 1 and 2): a
slice of a frame's data outliving the frame and its server, and signal
handlers that raise in the middle of the pull and release paths."""
import subprocess
import sys

import pytest

from test_soft_e2e import script_env

SLICE_AFTER_CLOSE = """
import gc, sys
import rocev2
from test_soft_e2e import FPGA_QPN, fpga_sim, soft_server
# 64 slots of 4 KiB: a 256 KiB slab, which the allocator maps and unmaps on
# its own, so a read of it once freed faults instead of reading stale heap.
s = soft_server(depth=64, max_payload=4096)
s.complete_connection(FPGA_QPN)
fpga_sim(s, 1, 4096)
f = s.poll(timeout=10) if "{path}" == "poll" else s.poll_frames(timeout=10)[0]
tail = f.data[8:]
whole = memoryview(f.data)
assert bytes(tail) == f.tobytes()[8:]
f.release()
s.{end}()
del f
gc.collect()
# The slab's memory outlives the server's close while a view of it lives:
# the read gives bytes (whatever the slot holds), not a fault.
assert len(bytes(tail)) == 4088 and len(whole.tobytes()) == 4096
pending = len(rocev2._deferred)
del tail, whole
gc.collect()
print(pending, len(rocev2._deferred), flush=True)
s.close()
"""


@pytest.mark.parametrize("end", ["close", "recreate"])
@pytest.mark.parametrize("path", ["poll", "poll_frames"])
def test_a_slice_of_data_read_after_release_and_close_reads_live_memory(tmp_path, path, end):
    """Finding 1: a slice of frame.data read after release() and
    Server.close() (or recreate()) was a use-after-free (SIGSEGV). The slice
    keeps the slab's memory alive: the closed server is destroyed when the
    last view of its slab goes, not before."""
    script = tmp_path / "slice_after_close.py"
    script.write_text(SLICE_AFTER_CLOSE.format(path=path, end=end))
    env = script_env()
    env["PYTHONPATH"] = f"{__file__.rsplit('/', 1)[0]}:{env.get('PYTHONPATH', '')}"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode == 0, f"rc {p.returncode} (-11: SIGSEGV): {p.stderr}"
    # While the slice lived, the old server waited (stopped) for it; then went.
    assert p.stdout.split() == ["1", "0"], p.stdout


SIGNALS = """
import json, os, signal, sys, threading
import rocev2
from test_soft_e2e import FPGA_QPN, fpga_sim, soft_server

PACKAGE = os.path.dirname(rocev2.__file__)


class Tick(Exception):
    pass


def tick(_sig, frame):
    # Raised wherever the binding runs (its frames, or anything they
    # called): this script's own loop is not what is tested.
    while frame is not None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            raise Tick()
        frame = frame.f_back


def consume(s, how):
    if how == "batch":
        s.release_frames(s.poll_frames(64, timeout=0.05))
    elif how == "batch_each":
        for f in s.poll_frames(64, timeout=0.05):
            f.release()
    elif how == "poll":
        f = s.poll(timeout=0.05)
        if f is not None:
            f.release()
    elif how == "dropped":
        f = s.poll(timeout=0.05)
        del f  # garbage collected: Frame.__del__
    elif how == "batch_dropped":
        s.poll_frames(64, timeout=0.05)  # the list, dropped at once


n, how = int(sys.argv[1]), sys.argv[2]
with soft_server(depth=64, max_payload=1024) as s:
    s.complete_connection(FPGA_QPN, transport=rocev2.TransportCfg(minRnrTimer=1))
    p = fpga_sim(s, n, 256, wait=False)
    done = threading.Event()  # the emulator waited for on a thread of its own
    threading.Thread(target=lambda: (p.wait(), done.set()), daemon=True).start()
    ticks = 0
    signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
    while not done.is_set():
        try:
            consume(s, how)
        except Tick:
            ticks += 1
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    while True:  # what is still queued
        frames = s.poll_frames(64, timeout=0)
        if not frames:
            break
        s.release_frames(frames)
    del frames
    st = s.stats()
    print(json.dumps({"rc": p.returncode, "err": p.stderr.read(), "ticks": ticks,
                      **{k: st[k] for k in ("frames", "releases", "loans_outstanding",
                                            "invalid_releases")}}), flush=True)
"""


@pytest.mark.parametrize("how", ["batch", "batch_each", "poll", "dropped", "batch_dropped"])
def test_a_signal_handler_raising_anywhere_leaks_no_loan(tmp_path, how):
    """Finding 2: a signal handler that raises (SIGALRM every 2 ms here,
    raising wherever the binding's code runs; a Ctrl-C an application
    catches and carries on after does the same) in the pull and release
    paths left loans for good (64 of 64 slots after 3 s, the link
    stalled). Each loan ends exactly once: the stream completes (the
    emulator gives up if the slots stay on loan), nothing stays on loan, and
    no release is refused (none was tried twice). In a process of its own:
    pytest's hooks are no place for these exceptions."""
    import json
    n = 20000
    script = tmp_path / "signals.py"
    script.write_text(SIGNALS)
    env = script_env()
    env["PYTHONPATH"] = f"{__file__.rsplit('/', 1)[0]}:{env.get('PYTHONPATH', '')}"
    p = subprocess.run([sys.executable, str(script), str(n), how], capture_output=True, text=True,
                       env=env, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(p.stdout.splitlines()[-1])
    assert r["rc"] == 0, f"the emulator gave up ({r['ticks']} ticks): {r['err']}"
    assert r["ticks"] > 50, f"the handler raised only {r['ticks']} times"
    assert r["frames"] == n
    assert r["loans_outstanding"] == 0, f"{r['loans_outstanding']} loans leaked ({r['ticks']} ticks)"
    assert r["releases"] == n
    assert r["invalid_releases"] == 0, "a loan's release was tried twice"
