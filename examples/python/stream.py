#!/usr/bin/env python3
"""A complete Python consumer: a soft-backend server pulls frames while
`rocev2 fpga-sim` (the FPGA emulator) streams to it over loopback; every
frame's sequence number and channel are checked (rocev2.pattern_check(data)
checks every byte too, in pure Python: slow).

    pip install ./python            # builds and bundles librocev2
    python3 examples/python/stream.py [frames] [size]

The emulator is the `rocev2` CLI: on PATH (`cargo install --path .`, or the
CMake install's bin/), or named by $ROCEV2_CLI.
"""
import os
import subprocess
import sys

import rocev2


def main(frames: int = 10000, size: int = 4096) -> int:
    cli = os.environ.get("ROCEV2_CLI", "rocev2")
    # The soft backend; udpPort=0: any free port (srv.udp_port), peerUdpPort=0:
    # ACKs to each packet's source port (the emulator's).
    cfg = rocev2.ServerCfg(ip="127.0.0.1", deviceName="soft", udpPort=0, peerUdpPort=0,
                           maxPayload=4096, rxQueueDepth=64)
    with rocev2.Server(cfg) as srv:
        hp = srv.get_host_params()          # HostParams(hostQpn, hostRqPsn, hostSqPsn, mrAddr, mrLen)
        fpga_qpn = 0x4242                   # read back from the FPGA
        srv.complete_connection(fpga_qpn, transport=rocev2.TransportCfg())   # pmtu 4096, RNR 0.64 ms
        try:
            emu = subprocess.Popen([cli, "fpga-sim", "--host", f"127.0.0.1:{srv.udp_port}",
                                    "--host-qpn", str(hp.hostQpn), "--psn", str(hp.hostSqPsn),
                                    "--qpn", str(fpga_qpn), "--frames", str(frames), "--size", str(size),
                                    "--channels", "0,1,2,3"], stdout=subprocess.DEVNULL)
        except FileNotFoundError:
            print(f"stream.py: the rocev2 CLI ({cli}) is not on PATH: `cargo install --path .` "
                  f"in a rocev2 checkout, or set ROCEV2_CLI", file=sys.stderr)
            return 2
        got = bad = 0
        for frame in srv.frames(timeout=10):     # or srv.channel(3), or srv.set_frame_callback(fn)
            with frame:                          # frame.data: a memoryview into the slab
                seq = int.from_bytes(frame.data[:8], "little")   # the emulator's sequence number
                bad += seq != got or frame.channel != seq % 4
            got += 1
            if got == frames:
                break
        status = emu.wait(timeout=60)
        print(f"stream (Python): {got} of {frames} frames, {srv.getByteCount()} bytes, "
              f"{bad} out of order; emulator exit {status}")
    return 0 if status == 0 and got == frames and bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main(*(int(a) for a in sys.argv[1:3])))
