#!/bin/bash
# Inside the rxe VM (TCG, comparison only): rocev2's verbs server on rxe0
# receiving 4096-byte SENDs from an rxe1 requester, against perftest's
# ib_send_bw between the same two devices with the same message size, in the
# same run, both senders with 16 sends in flight (surf's window; ib_send_bw -t 16)
# and neither filling its buffers per message (verbs-fpga --fill none).
# Prints one table row. Needs ROCEV2_CLI.
set -euo pipefail
N=${ROCEV2_BENCH_FRAMES:-3000}
SIZE=4096
# Reference: perftest.
ib_send_bw -d rxe0 -x "$RXE0_GID_IDX" -s $SIZE -n "$N" -t 16 -F > /tmp/ibsrv.txt 2>&1 &
srv=$!
sleep 1
ib_send_bw -d rxe1 -x "$RXE1_GID_IDX" -s $SIZE -n "$N" -t 16 -F 10.77.0.1 > /tmp/ibcli.txt 2>&1 || { cat /tmp/ibcli.txt; exit 1; }
wait $srv || true
# "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]"
line=$(awk -v s=$SIZE '$1 == s && NF >= 5 {print}' /tmp/ibcli.txt | tail -1)
read -r _ _ _ ib_mbs ib_mpps <<<"$line"
# rocev2: recv (verbs, rxe0) <- verbs-fpga (rxe1), two-way bring-up over pipes.
coproc RECV { "$ROCEV2_CLI" recv --device rxe0 --gid-index "$RXE0_GID_IDX" --fpga-ip 10.77.0.2 \
    --fpga-qpn - --frames "$N" --max-payload $SIZE --idle-timeout 60 --rnr 1; }
read -r params <&"${RECV[0]}"
qpn=$(sed -n 's/.*"qpn": \([0-9]*\).*/\1/p' <<<"$params")
psn=$(sed -n 's/.*"sq_psn": \([0-9]*\).*/\1/p' <<<"$params")
gid=$(sed -n 's/.*"gid": "\([0-9a-f:]*\)".*/\1/p' <<<"$params")
coproc FPGA { "$ROCEV2_CLI" verbs-fpga --device rxe1 --gid-index "$RXE1_GID_IDX" --host-qpn "$qpn" \
    --host-gid "$gid" --psn "$psn" --frames "$N" --size $SIZE --channels 0 --fill none; }
read -r hello <&"${FPGA[0]}"
echo "$(sed -n 's/.*"qpn": \([0-9]*\).*/\1/p' <<<"$hello")" >&"${RECV[1]}"
sleep 0.5
echo go >&"${FPGA[1]}"
read -r summary <&"${FPGA[0]}"
rate=$(sed -n 's/.*"frames_per_s": \([0-9.]*\).*/\1/p' <<<"$summary")
wait
python3 - "$rate" "$ib_mpps" "$ib_mbs" <<'PY'
import sys
rate, ib_mpps, ib_mbs = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
ib = ib_mpps * 1e6
print(f"{'verbs on rxe (TCG), 4096 B SENDs rxe1->rxe0':<44} {rate:>14.0f} f/s "
      f"{'ib_send_bw: %.0f msg/s %.0f MB/s' % (ib, ib_mbs):>34} {rate / ib:>7.2f} {'>=0.9':>7}")
PY
