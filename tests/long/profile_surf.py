#!/usr/bin/env python3
"""Where the receive thread's time goes in surf's regime (issue 24): `rocev2
recv` (soft; its receive thread pinned to CPU 1 with --cpu 1) fed by `rocev2
fpga-sim --busy-wait --window W` (pinned to CPU 0), one packet per datagram,
recorded with `perf record -g`; prints the thread's samples by what they were
doing: the ACK's send, receives that returned data, receives otherwise
(syscall entry, msghdr import, empty polls), sched_yield, waking the pull
consumer, and user space. Needs perf (linux-perf) and permission to use it.

  tests/long/profile_surf.py [--window 4] [--size 4096] [--frames 300000] CLI
"""
import argparse
import collections
import json
import os
import subprocess
import tempfile


def run(cli, window, size, frames, data):
    recv = subprocess.Popen(
        ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4999", "-g", "-o", data, "--",
         cli, "recv", "--device", "soft", "--bind", "127.0.0.1", "--port", "0",
         "--peer-port", "0", "--fpga-ip", "127.0.0.1", "--fpga-qpn", "-", "--cpu", "1",
         "--frames", str(frames), "--idle-timeout", "5", "--icrc-check", "off",
         "--max-payload", str(size)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    hp = json.loads(recv.stdout.readline())
    recv.stdin.write("1193046\n")
    recv.stdin.flush()
    sim = subprocess.run(
        ["taskset", "-c", "0", cli, "fpga-sim", "--host", f"127.0.0.1:{hp['udp_port']}",
         "--host-qpn", str(hp["qpn"]), "--psn", str(hp["sq_psn"]), "--qpn", "1193046",
         "--frames", str(frames), "--size", str(size), "--window", str(window),
         "--busy-wait"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    out, _ = recv.communicate(timeout=120)
    last = json.loads(out.strip().splitlines()[-1])
    if sim.returncode != 0 or last["frames"] != frames:
        raise SystemExit(f"run failed: fpga-sim exit {sim.returncode}, recv {last}")
    return last


def classify(data):
    script = subprocess.run(["perf", "script", "-i", data, "--comm", "RoCEv2Server",
                             "-F", "ip,sym"], capture_output=True, text=True, check=True).stdout
    kinds = collections.Counter()
    for sample in script.split("\n\n"):
        stack = sample.split()
        if not stack:
            continue
        text = " ".join(stack)
        if "sendmmsg" in text or "sendmsg" in text:
            kind = "the ACK's send (sendmmsg; on loopback it runs the peer's receive path too)"
        elif "recvmmsg" in text:
            kind = ("recvmmsg that returned data (the payload's copy)" if "_copy_to_iter" in text
                    else "recvmmsg otherwise (syscall entry, msghdr import, empty polls)")
        elif "sched_yield" in text:
            kind = "sched_yield (a consumer on this CPU gets its turn)"
        elif "futex" in text:
            kind = "futex (waking the pull consumer)"
        elif "entry_SYSCALL" in text or "do_syscall" in text:
            kind = "other syscalls"
        else:
            kind = "user space (parse, responder, placing, the ACK, dispatch, the loop)"
        kinds[kind] += 1
    return kinds


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=int, default=4)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--frames", type=int, default=300000)
    ap.add_argument("cli")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        last = run(a.cli, a.window, a.size, a.frames, data)
        kinds = classify(data)
    total = sum(kinds.values())
    print(f"surf window {a.window}, {a.size} B: {last['frames_per_s']:.0f} f/s "
          f"(recv's pull consumer; perf's sampling slows both threads)")
    for kind, n in kinds.most_common():
        print(f"{100 * n / max(total, 1):5.1f}%  {kind}")
    print(f"({total} samples of the RoCEv2Server thread)")


if __name__ == "__main__":
    main()
