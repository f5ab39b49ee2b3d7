#!/usr/bin/env python3
"""A/B of the host in surf's regime, whole commands as a user runs them:
`rocev2 recv` (soft, pinned to CPU 1) fed by `rocev2 fpga-sim --busy-wait
--window W` (pinned to CPU 0), one packet per datagram. Each server binary
named on the command line is fed by the same emulator binary (the first
one's, or --sim), in turn, RUNS times per (window, size); prints frames/s
min/median/max per binary and the B/A ratio of the medians. A binary may
carry recv flags after "::", comma-separated: the cost of a flag is
`A_CLI A_CLI::--measure-latency`.

  tests/long/window_ab.py [--runs 3] [--frames 200000] [--sim CLI] A_CLI [B_CLI ...]
"""
import argparse
import json
import statistics
import subprocess

CASES = [(4, 4096), (16, 4096), (4, 1024), (16, 1024), (4, 8192)]


def one(recv_cli, sim_cli, window, size, frames, extra):
    recv_cli, _, flags = recv_cli.partition("::")
    extra = extra + [f for f in flags.split(",") if f]
    recv = subprocess.Popen(
        ["taskset", "-c", "1", recv_cli, "recv", "--device", "soft", "--bind", "127.0.0.1",
         "--port", "0", "--peer-port", "0", "--fpga-ip", "127.0.0.1", "--fpga-qpn", "-",
         "--frames", str(frames), "--idle-timeout", "5", "--icrc-check", "off",
         "--max-payload", str(size), *extra],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    hp = json.loads(recv.stdout.readline())
    qpn = 0x123456
    recv.stdin.write(f"{qpn}\n")
    recv.stdin.flush()
    sim = subprocess.run(
        ["taskset", "-c", "0", sim_cli, "fpga-sim", "--host", f"127.0.0.1:{hp['udp_port']}",
         "--host-qpn", str(hp["qpn"]), "--psn", str(hp["sq_psn"]), "--qpn", str(qpn),
         "--frames", str(frames), "--size", str(size), "--window", str(window), "--busy-wait"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300)
    out, _ = recv.communicate(timeout=60)
    last = json.loads(out.strip().splitlines()[-1])
    if sim.returncode != 0 or last["frames"] != frames:
        raise SystemExit(f"run failed: sim rc {sim.returncode}, recv {last}")
    return last


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--frames", type=int, default=200000)
    ap.add_argument("--sim")
    ap.add_argument("--extra", default="", help="more recv flags for every binary")
    ap.add_argument("cli", nargs="+")
    a = ap.parse_args()
    sim = a.sim or a.cli[0].partition("::")[0]
    print(f"{'case':<22}" + "".join(f"{c[-40:]:>44}" for c in a.cli) + "   B/A")
    for window, size in CASES:
        rates = {c: [] for c in a.cli}
        for _ in range(a.runs):
            for c in a.cli:  # interleaved: drift hits both alike
                r = one(c, sim, window, size, a.frames, a.extra.split())
                rates[c].append(r["frames_per_s"])
        cells = []
        for c in a.cli:
            v = sorted(rates[c])
            cells.append(f"{v[0]/1e3:.0f}k/{statistics.median(v)/1e3:.0f}k/{v[-1]/1e3:.0f}k f/s")
        ratio = ""
        if len(a.cli) > 1:
            ratio = f"{statistics.median(rates[a.cli[1]]) / statistics.median(rates[a.cli[0]]):.2f}"
        print(f"surf window {window}, {size} B".ljust(22) + "".join(f"{x:>44}" for x in cells)
              + f"   {ratio}", flush=True)


if __name__ == "__main__":
    main()
