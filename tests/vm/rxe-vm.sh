#!/bin/bash
# rxe-vm.sh — run a command inside a throwaway qemu VM whose kernel has the
# Linux Soft-RoCE driver (rdma_rxe), over this host's root filesystem.
#
#   tests/vm/rxe-vm.sh [--] COMMAND [ARGS...]
#
# This host's kernel has no RDMA support, so the VM boots Debian's stock
# kernel (downloaded as a package and unpacked, never installed) under qemu's
# TCG emulator (the host's /dev/kvm cannot run a stock kernel). The guest sees
# the host's root filesystem read-only over 9p with a tmpfs overlay, so
# host-built binaries (cargo test binaries, the rocev2 CLI, python3) run
# unchanged. COMMAND runs as root in the caller's directory and environment.
#
# Network inside the guest:
#   rxe0  on veth0 10.77.0.1  <-veth->  rxe1 on veth1 10.77.0.2   (root netns;
#         policy routing makes rxe0<->rxe1 traffic really cross the pair)
#   rxe2  on vethp0 10.78.0.1 <-veth->  vethp1 10.78.0.2 in netns "peer" (no
#         rxe there: a userspace RoCEv2 peer runs there, since rxe's UDP socket
#         lives in the root netns only)
# COMMAND sees RXE0_IP RXE1_IP RXE2_IP PEER_IP and RXE{0,1,2}_GID_IDX (the
# index of each device's IPv4-mapped RoCE v2 GID), ROCEV2_IN_RXE_VM=1.
#
# Exit status: COMMAND's; 124 timeout; 125 VM or rxe setup failure (logs are
# printed); 126 the VM cannot run on this host (no root, no qemu, no kernel
# package reachable) — callers treat 126 as "skipped, with the reason printed".
#
# Knobs: ROCEV2_VM_CACHE (~/.cache/rocev2-vm), ROCEV2_VM_TIMEOUT (900 s),
# ROCEV2_VM_SMP (2), ROCEV2_VM_MEM (2048 MiB), ROCEV2_VM_VERBOSE=1 (print the
# guest console and setup log).
set -euo pipefail

CACHE=${ROCEV2_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rocev2-vm}
TIMEOUT=${ROCEV2_VM_TIMEOUT:-900}
SMP=${ROCEV2_VM_SMP:-2}
MEM=${ROCEV2_VM_MEM:-2048}
VERBOSE=${ROCEV2_VM_VERBOSE:-0}

say() { echo "rxe-vm: $*" >&2; }
cannot() { say "cannot run the VM here: $*"; exit 126; }
broken() { say "$*"; exit 125; }

[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 [--] COMMAND [ARGS...]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || cannot "must run as root (9p passthrough of /, apt-get)"

# One setup at a time (apt, the unpacked qemu, the guest build in the cache).
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

# What the VM needs from apt, and why. Nothing already installed is removed or
# replaced: apt-get runs with --no-remove on the missing packages only. What
# they depend on may be upgraded (rdma-core pulls in udev, which upgrades
# systemd's libraries on a fresh Debian 12 machine): docs/install.md, the set-up table.
NEED="busybox-static cpio kmod xz-utils binutils iproute2 rdma-core ibverbs-providers"
QEMU_DEBS="qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu"
missing_of() {
    local p
    for p; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || printf ' %s' "$p"; done
}
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    local inst=(apt-get install -y -q --no-install-recommends --no-remove)
    { "${inst[@]}" "$@" || { apt-get update -q && "${inst[@]}" "$@"; }; } >&2 \
        || cannot "apt-get install $* failed (it removes nothing: install them by hand)"
}
missing=$(missing_of $NEED)
if [ -n "$missing" ]; then
    say "installing$missing with apt-get: busybox-static, cpio, kmod, xz-utils and binutils build the" \
        "guest's initramfs from Debian's stock kernel (this host's kernel has no rdma_rxe); iproute2," \
        "rdma-core and ibverbs-providers set up the rxe devices inside it"
    apt_install $missing
fi
# qemu: the host's own qemu-system-x86_64 if there is one; else Debian's
# package when installing it removes nothing; else (e.g. a newer qemu-utils
# that Breaks this release's qemu-system-common) its packages are unpacked
# into the cache, never installed, and only their missing libraries installed.
QEMU=qemu-system-x86_64
QEMU_L=()
if ! command -v "$QEMU" >/dev/null; then
    removes=$(apt-get install -s --no-install-recommends qemu-system-x86 2>/dev/null | awk '/^Remv/{print $2}' | sort -u | tr '\n' ' ')
    if [ -z "$removes" ] && apt-get install -s --no-install-recommends qemu-system-x86 >/dev/null 2>&1; then
        say "installing qemu-system-x86 with apt-get: the emulator the VM runs in"
        apt_install qemu-system-x86
    else
        Q="$CACHE/qemu"
        if [ ! -x "$Q/usr/bin/$QEMU" ]; then
            say "installing qemu-system-x86 would remove ${removes:-packages} here: unpacking" \
                "$QEMU_DEBS into $Q instead (never installed)"
            rm -rf "$Q" && mkdir -p "$Q/deb" && chmod 777 "$Q/deb"
            (cd "$Q/deb" && apt-get download -q $QEMU_DEBS >&2) || cannot "downloading $QEMU_DEBS failed"
            for d in "$Q"/deb/*.deb; do dpkg-deb -x "$d" "$Q"; done
            rm -rf "$Q/deb"
            # The firmware links point at /usr/share/...: point them into the cache.
            find "$Q/usr/share" -type l -lname '/usr/*' | while read -r l; do
                ln -sfn "$Q$(readlink "$l")" "$l"
            done
        fi
        libs=$(apt-cache depends qemu-system-x86 qemu-system-common 2>/dev/null \
            | awk '/^ *Depends:/{print $2}' | grep -v '^<' | grep -Ev '^(qemu-|seabios$|ipxe-qemu$)' | sort -u)
        missing=$(missing_of $libs)
        if [ -n "$missing" ]; then
            say "installing the libraries the unpacked qemu needs:$missing"
            apt_install $missing
        fi
        QEMU="$Q/usr/bin/$QEMU"
        QEMU_L=(-L "$Q/usr/share/qemu" -L "$Q/usr/share/seabios")
    fi
fi

# ---------------------------------------------------------------- the guest --
# Modules /init loads to reach the host filesystem, and the ones the guest's
# modprobe may load later (dependencies are resolved below).
INIT_MODS="virtio_pci 9pnet_virtio 9p overlay"
MORE_MODS="rdma_rxe ib_uverbs rdma_ucm ib_umad veth crc32_generic"

read -r -d '' INIT <<'SH' || true
#!/bin/sh
# PID 1 of the guest (busybox): host root (9p, read-only) + tmpfs overlay,
# then chroot into it and run /job/guest.sh; power off when it returns.
export PATH=/bin:/sbin
mount -t proc none /proc; mount -t sysfs none /sys; mount -t devtmpfs none /dev
KV=$(cat /etc/kv)
for m in $(cat /etc/init-mods); do insmod /lib/modules/$KV/$m 2>/dev/null; done
o=trans=virtio,version=9p2000.L,msize=512000
halt() { echo "guest-init: $*"; sync; poweroff -f; }
mount -t 9p -o $o,ro,cache=loose root /lower || halt "9p root"
mount -t 9p -o $o,cache=none job /job || halt "9p job"
mount -t tmpfs none /upper; mkdir -p /upper/u /upper/w
# The overlay makes every host path writable in the guest, /tmp included, and
# keeps what the host has there: a checkout under /tmp stays visible. Only
# without overlayfs (read-only root) does /tmp become an empty tmpfs.
if ! mount -t overlay none -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w /new; then
    echo "guest-init: no overlayfs: read-only root, empty tmpfs on /tmp"
    mount --bind /lower /new; mount -t tmpfs none /new/tmp
fi
for d in proc sys dev; do mount --move /$d /new/$d; done
mount -t tmpfs none /new/run
mkdir -p /new/run/job /new/run/netns /new/dev/pts /new/dev/shm
mount -t devpts none /new/dev/pts; mount -t tmpfs none /new/dev/shm
ln -sf /proc/self/fd /new/dev/fd; ln -sf /proc/self/fd/0 /new/dev/stdin
ln -sf /proc/self/fd/1 /new/dev/stdout; ln -sf /proc/self/fd/2 /new/dev/stderr
mount --move /job /new/run/job
mkdir -p /new/lib/modules/$KV && mount --bind /lib/modules/$KV /new/lib/modules/$KV
# bash reads its script in pieces and seeks, which 9p without a cache does
# not keep straight: run a copy from tmpfs.
cp /new/run/job/guest.sh /new/run/guest.sh
chroot /new /bin/bash /run/guest.sh </new/dev/null >/new/run/job/stdout 2>/new/run/job/stderr
echo $? > /new/run/job/rc.raw
sync; poweroff -f
SH

KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
if [ -z "$KPKG" ]; then
    apt-get update -q >&2 || true
    KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
fi
[ -n "$KPKG" ] || cannot "no Debian kernel package (linux-image-amd64) is known to apt"
KV=${KPKG#linux-image-}
KEY=$(printf '%s\n' "$INIT" "$INIT_MODS" "$MORE_MODS" | sha256sum | cut -c1-10)
G="$CACHE/$KV-$KEY"

build_guest() {
    say "building the guest in $G: downloading $KPKG (about 70 MB; unpacked there, never installed)"
    rm -rf "$CACHE/$KV"-* && mkdir -p "$G/deb" "$G/ir" && chmod 777 "$G/deb"
    (cd "$G/deb" && apt-get download -q "$KPKG" >&2) || cannot "downloading $KPKG failed"
    dpkg-deb -x "$G"/deb/*.deb "$G/k"
    local mods="$G/k/lib/modules/$KV" ir="$G/ir"
    depmod -b "$G/k" "$KV"
    # The kernel decompressing itself is slow under TCG: boot the embedded
    # uncompressed vmlinux when it has a PVH entry note, else the bzImage.
    local bz="$G/k/boot/vmlinuz-$KV" at
    at=$(grep -abo $'\xfd7zXZ\x00' "$bz" | head -1 | cut -d: -f1 || true)
    if [ -n "$at" ] && tail -c +$((at + 1)) "$bz" 2>/dev/null | xz -dc --single-stream > "$G/vmlinux" 2>/dev/null \
        && readelf -n "$G/vmlinux" 2>/dev/null | grep -q '0x00000012'; then
        echo vmlinux > "$G/boot"
    else
        cp "$bz" "$G/vmlinuz"; echo vmlinuz > "$G/boot"; rm -f "$G/vmlinux"
    fi
    mkdir -p "$ir"/{bin,sbin,etc,proc,sys,dev,lower,upper,new,job} "$ir/lib/modules/$KV"
    cp /bin/busybox "$ir/bin/"
    for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -sf busybox "$ir/bin/$a"; done
    ln -sf ../bin/busybox "$ir/sbin/modprobe"
    local f
    for m in $INIT_MODS $MORE_MODS; do
        modprobe -d "$G/k" -S "$KV" --show-depends "$m" || cannot "module $m missing from $KPKG"
    done | awk '$1 == "insmod" {print $2}' | sort -u | while read -r f; do
        mkdir -p "$ir/lib/modules/$KV/$(dirname "${f#"$mods"/}")"
        cp "$f" "$ir/lib/modules/$KV/${f#"$mods"/}"
    done
    cp "$mods"/modules.builtin* "$mods"/modules.order "$ir/lib/modules/$KV/"
    depmod -b "$ir" "$KV"
    for m in $INIT_MODS; do modprobe -d "$G/k" -S "$KV" --show-depends "$m"; done \
        | awk '$1 == "insmod" {sub(".*/lib/modules/[^/]*/", "", $2); if (!seen[$2]++) print $2}' \
        > "$ir/etc/init-mods"
    echo "$KV" > "$ir/etc/kv"
    printf '%s\n' "$INIT" > "$ir/init" && chmod 755 "$ir/init"
    (cd "$ir" && find . | cpio -o -H newc --quiet) > "$G/initrd"
    rm -rf "$G/deb" "$G/k" "$ir"
    touch "$G/ready"
}
[ -f "$G/ready" ] || build_guest
flock -u 9

# ------------------------------------------------------------------ the job --
JOB=$(mktemp -d /tmp/rocev2-vm.XXXXXX)
trap 'rm -rf "$JOB"' EXIT
export -p | grep -Ev '^declare -x (BASHOPTS|SHELLOPTS|SHLVL|PWD|OLDPWD|_)=' \
    | sed 's/^declare -x /declare -gx /' > "$JOB/env"
{
    echo '#!/bin/bash'
    printf 'CWD=%q\n' "$PWD"
    printf 'CMD=('; printf '%q ' "$@"; echo ')'
    cat <<'GUEST'
exec 5>/run/job/setup.log
fail() { echo "setup: $*" >&5; echo 125 > /run/job/rc; exit 125; }
sys() { echo "$2" > "/proc/sys/${1//.//}"; }
modprobe -a rdma_rxe veth >&5 2>&5 || fail "modprobe rdma_rxe veth"
ip netns add peer || fail "netns"
ip -batch - >&5 2>&5 <<EOF || fail "ip"
link set lo up
link add veth0 mtu 9000 type veth peer name veth1 mtu 9000
addr add 10.77.0.1/24 dev veth0
addr add 10.77.0.2/24 dev veth1
link set veth0 up
link set veth1 up
rule add pref 100 iif lo from 10.77.0.1 to 10.77.0.2 lookup 100
rule add pref 101 iif lo from 10.77.0.2 to 10.77.0.1 lookup 101
route add 10.77.0.2 dev veth0 src 10.77.0.1 table 100
route add 10.77.0.1 dev veth1 src 10.77.0.2 table 101
rule add pref 1000 lookup local
rule del pref 0
link add vethp0 mtu 9000 type veth peer name vethp1 mtu 9000 netns peer
addr add 10.78.0.1/24 dev vethp0
link set vethp0 up
EOF
ip -n peer -batch - >&5 2>&5 <<EOF || fail "ip -n peer"
link set lo up
addr add 10.78.0.2/24 dev vethp1
link set vethp1 up
EOF
for i in all default veth0 veth1; do
    sys net.ipv4.conf.$i.accept_local 1; sys net.ipv4.conf.$i.rp_filter 0
done
rdma -b - >&5 2>&5 <<EOF || fail "rdma link add"
link add rxe0 type rxe netdev veth0
link add rxe1 type rxe netdev veth1
link add rxe2 type rxe netdev vethp0
EOF
# The RoCE v2 GID index of DEV's IPv4 address: look it up, never assume it.
gid_of() {
    local p=/sys/class/infiniband/$1/ports/1 want n g t s v
    want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' ${2//./ })
    for ((n = 0; n < 400; n++)); do
        s=$(cat $p/state 2>/dev/null)
        if [ "$s" = "4: ACTIVE" ]; then
            for ((g = 0; g < 32; g++)); do
                read -r v < $p/gids/$g 2>/dev/null || continue
                [ "$v" = "$want" ] || continue
                read -r t < $p/gid_attrs/types/$g 2>/dev/null || continue
                [ "$t" = "RoCE v2" ] && { echo $g; return 0; }
            done
        fi
        sleep 0.025
    done
    return 1
}
export RXE0_IP=10.77.0.1 RXE1_IP=10.77.0.2 RXE2_IP=10.78.0.1 PEER_IP=10.78.0.2
RXE0_GID_IDX=$(gid_of rxe0 $RXE0_IP) || fail "rxe0 has no RoCE v2 GID"
RXE1_GID_IDX=$(gid_of rxe1 $RXE1_IP) || fail "rxe1 has no RoCE v2 GID"
RXE2_GID_IDX=$(gid_of rxe2 $RXE2_IP) || fail "rxe2 has no RoCE v2 GID"
echo "rxe ready: gid idx $RXE0_GID_IDX $RXE1_GID_IDX $RXE2_GID_IDX" >&5
. /run/job/env
export RXE0_GID_IDX RXE1_GID_IDX RXE2_GID_IDX RXE0_IP RXE1_IP RXE2_IP PEER_IP ROCEV2_IN_RXE_VM=1
cd "$CWD" || fail "cannot enter the caller's directory $CWD in the guest (is it on a filesystem the guest does not see?)"
"${CMD[@]}"
rc=$?
echo $rc > /run/job/rc
exit $rc
GUEST
} > "$JOB/guest.sh"

KFILE=$(cat "$G/boot")
QARGS=(-accel tcg -M q35 -cpu max -smp "$SMP" -m "$MEM" -nodefaults -display none
       -no-reboot -nic none -kernel "$G/$KFILE" -initrd "$G/initrd"
       -append "console=ttyS0 panic=-1 quiet loglevel=3"
       -serial "file:$JOB/console.log"
       -virtfs "local,path=/,mount_tag=root,security_model=none,readonly=on,multidevs=remap"
       -virtfs "local,path=$JOB,mount_tag=job,security_model=none")
t0=$(date +%s%N)
set +e
timeout -k 10 "$TIMEOUT" "$QEMU" "${QEMU_L[@]}" "${QARGS[@]}" </dev/null
qrc=$?
set -e
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
cat "$JOB/stdout" 2>/dev/null || true
cat "$JOB/stderr" >&2 2>/dev/null || true
rc=$(cat "$JOB/rc" 2>/dev/null || cat "$JOB/rc.raw" 2>/dev/null || true)
if [ "$VERBOSE" = 1 ] || [ -z "$rc" ] || [ "$rc" = 125 ]; then
    { echo "----- guest console -----"; tr -d '\r' < "$JOB/console.log" 2>/dev/null || true
      echo "----- guest setup log -----"; cat "$JOB/setup.log" 2>/dev/null || true; } >&2
fi
say "VM wall time $((ms / 1000)).$(printf %03d $((ms % 1000))) s"
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then say "timed out after $TIMEOUT s"; exit 124; fi
[ -n "$rc" ] || broken "the guest produced no exit status (qemu exit $qrc)"
exit "$rc"
