#!/bin/bash
# Long soak of the soft backend (not in CI; see docs/testing.md): one
# `rocev2 recv --verify` server process, fed for DURATION seconds by
# successive `rocev2 fpga-sim` runs of CHUNK frames with mixed faults
# (drop, duplicate, reorder, corrupt), each run a fresh emulator at the
# host SQ PSN: an FPGA reload, which the server must recognise. The pattern's
# sequence numbers go on across runs (--first-seq), so --verify checks that
# every frame arrived once, in order, intact. Every minute the server's RSS
# and open file descriptors are sampled into OUT.csv. The emulator's ACK
# timeout is 268 ms (code 16, surf: 67 ms) so a busy host does not make it
# give up.
#   tests/long/soak.sh [DURATION_S=3600] [CHUNK=200000] [OUT=soak]   (ROCEV2_CLI=path)
set -euo pipefail
dur=${1:-3600}; chunk=${2:-200000}; out=${3:-soak}
cli=${ROCEV2_CLI:-$(dirname "$0")/../../target/release/rocev2}
faults=drop=0.002,dup=0.002,reorder=0.002,corrupt=0.0005
coproc RECV { exec "$cli" recv --port 0 --peer-port 0 --fpga-ip 127.0.0.1 --fpga-qpn 0x4242 \
    --verify --depth 256 --max-payload 4096 --idle-timeout 60 2>"$out.recv.log"; }
read -r params <&"${RECV[0]}"
pid=$RECV_PID
read -r port qpn psn < <(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["udp_port"], d["qpn"], d["sq_psn"])' "$params")
echo "minute,rss_kib,fds,frames_sent" > "$out.csv"
t0=$(date +%s); sent=0; runs=0; next_sample=$t0
sample() {
    echo "$(( ($(date +%s) - t0) / 60 )),$(awk '/VmRSS/{print $2}' /proc/$pid/status),$(ls /proc/$pid/fd | wc -l),$sent" >> "$out.csv"
}
sample
while [ $(( $(date +%s) - t0 )) -lt "$dur" ]; do
    size=$(( (runs % 4 == 3) ? 9000 : 64 << (runs % 4 * 3) ))   # 64, 512, 4096, 9000 B (4096-B slots: 9000 -> 4096)
    [ "$size" -gt 4096 ] && size=4096
    "$cli" fpga-sim --host "127.0.0.1:$port" --host-qpn "$qpn" --psn "$psn" --qpn 0x4242 \
        --frames "$chunk" --size "$size" --channels 0,1,2,3 --first-seq "$sent" \
        --faults "$faults" --seed "$runs" --timeout-code 16 >> "$out.sim.log" 2>&1
    sent=$(( sent + chunk )); runs=$(( runs + 1 ))
    if [ "$(date +%s)" -ge "$next_sample" ]; then sample; next_sample=$(( next_sample + 60 )); fi
done
sample
summary=$(timeout 120 cat <&"${RECV[0]}" || true)
wait "$pid" || true
echo "runs $runs, frames sent $sent"
echo "$summary"
python3 - "$summary" "$sent" "$runs" "$out.csv" <<'PY'
import json, sys
s = json.loads(sys.argv[1]); sent = int(sys.argv[2]); runs = int(sys.argv[3])
rows = [l.split(",") for l in open(sys.argv[4]).read().split()[1:]]
rss = [int(r[1]) for r in rows]; fds = [int(r[2]) for r in rows]
print(f"RSS KiB min/max {min(rss)}/{max(rss)}, fds min/max {min(fds)}/{max(fds)} over {len(rows)} samples")
ok = (s["frames"] == sent and s["verify_errors"] == 0 and s["peer_restarts"] == runs - 1
      and max(fds) == min(fds))
print("soak", "OK" if ok else "FAILED", f"(frames {s['frames']} of {sent}, verify errors {s['verify_errors']}, "
      f"peer restarts {s['peer_restarts']} of {runs - 1}, icrc errors {s['icrc_errors']})")
sys.exit(0 if ok else 1)
PY
