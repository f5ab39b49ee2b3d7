#!/usr/bin/env python3
"""Builds surf's RoCEv2 engine (Verilog top mkAxiSTransportLayer + blue-lib)
from a surf checkout with Icarus Verilog and runs the firmware-in-the-loop
scenarios (test_engine.py) under cocotb against a rocev2 soft server.

    tests/firmware/run.py SURF_DIR [SCENARIO ...]

Needs ROCEV2_LIBRARY (a built librocev2.so), iverilog and cocotb. Prints one
line per scenario and `firmware: P/N scenarios passed`; exits 1 unless all pass.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = "mkAxiSTransportLayer"
SCENARIOS = ["stream", "dropped_data_packet", "dropped_ack", "rnr", "coalesced_acks",
             "duplicated_packet", "psn_wrap", "more_than_16_queued", "restart", "stale", "large"]


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    surf = os.path.abspath(sys.argv[1])
    chosen = sys.argv[2:] or SCENARIOS
    # Opt-in scenarios (known engine bugs) run only when named.
    os.environ["FW_OPT_IN"] = ",".join(c for c in chosen if c not in SCENARIOS)
    rtl = os.path.join(surf, "ethernet", "RoCEv2")
    sources = sorted(glob.glob(os.path.join(rtl, "blue-rdma", "*.v"))
                     + glob.glob(os.path.join(rtl, "blue-lib", "*.v")))
    top_file = os.path.join(rtl, "blue-rdma", "mkAxisTransportLayer.v")
    if not os.path.exists(top_file):
        print(f"firmware: {top_file} not found: SURF_DIR must be a slaclab/surf checkout "
              f"with the Verilog engine in ethernet/RoCEv2/blue-rdma (got {surf})", file=sys.stderr)
        return 2
    if not os.environ.get("ROCEV2_LIBRARY"):
        print("firmware: set ROCEV2_LIBRARY to a built librocev2.so", file=sys.stderr)
        return 2
    try:
        commit = subprocess.run(["git", "-C", surf, "log", "-1", "--format=%h %cs"],
                                capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "(not a git checkout)"
    print(f"firmware: surf {commit} ({surf}), top {TOP}, {len(sources)} Verilog files", flush=True)

    # The runner hands sys.path to the simulator's Python as PYTHONPATH.
    sys.path[:0] = [HERE, os.path.normpath(os.path.join(HERE, "..", "..", "python"))]
    from cocotb_tools.runner import get_runner
    build = os.path.join(os.environ.get("ROCEV2_BUILD_DIR", os.path.join(HERE, "..", "..", "build")),
                         "firmware")
    runner = get_runner("icarus")
    t0 = time.time()
    runner.build(sources=sources, hdl_toplevel=TOP, build_dir=build, always=True,
                 timescale=("1ns", "1ps"), log_file=os.path.join(build, "build.log"))
    print(f"firmware: built with Icarus in {time.time() - t0:.1f} s", flush=True)

    results = os.path.join(build, "scenarios.jsonl")
    if os.path.exists(results):
        os.remove(results)
    passed = 0
    t_all = time.time()
    for name in chosen:
        xml = os.path.join(build, f"{name}.xml")
        t1 = time.time()
        try:
            runner.test(test_module="test_engine", hdl_toplevel=TOP, testcase=name,
                        build_dir=build, test_dir=build, results_xml=xml,
                        extra_env={"FW_RESULTS": results, "FW_OPT_IN": os.environ["FW_OPT_IN"]},
                        log_file=os.path.join(build, f"{name}.log"))
        except SystemExit:
            pass
        ok, why = False, "no result (see the log)"
        if os.path.exists(xml):
            case = ET.parse(xml).getroot().find(".//testcase")
            fail = None if case is None else case.find("failure")
            ok = case is not None and fail is None
            why = "" if ok else (fail.get("message") or fail.text or "failed").strip().splitlines()[-1]
        rec = {}
        if ok and os.path.exists(results):
            for line in open(results):
                r = json.loads(line)
                if r.get("test") == name or r["name"].replace(" ", "_").lower() == name:
                    rec = r
        wall = time.time() - t1
        if ok:
            passed += 1
            detail = ", ".join(f"{k} {v}" for k, v in rec.items()
                               if k not in ("name", "wall_s", "test"))
            print(f"firmware: {name:22} PASS {wall:6.1f} s  {detail}", flush=True)
        else:
            print(f"firmware: {name:22} FAIL {wall:6.1f} s  {why} "
                  f"(log: {os.path.join(build, name + '.log')})", flush=True)
    print(f"firmware: total {time.time() - t_all:.0f} s")
    print(f"firmware: {passed}/{len(chosen)} scenarios passed")
    return 0 if passed == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
