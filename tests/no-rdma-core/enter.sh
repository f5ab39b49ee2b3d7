#!/bin/bash
# Runs CMD in a mount namespace where rdma-core is not installed, as on a
# stock Debian/Ubuntu host: libibverbs.so* and librdmacm.so* (and the
# providers, and /etc/libibverbs.d) are hidden, so dlopen("libibverbs.so.1")
# fails. The rest of the filesystem is the host's. Needs root (unshare -m,
# mount); the host's mounts are not changed.
#
#   tests/no-rdma-core/enter.sh CMD [ARGS...]     exit status: CMD's
#
# How: in the namespace, each directory that holds them (from `ldconfig -p`,
# LD_LIBRARY_PATH, $CONDA_PREFIX/lib, the usual lib dirs) gets an overlay with
# a whiteout per name, so they are absent ("No such file or directory"). Where
# overlayfs is refused, an empty file is bind-mounted over each instead (then
# dlopen says "file too short"; ROCEV2_NO_RDMA_CORE_BIND=1 forces this way).
# Before running CMD, dlopen of each must fail.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 CMD [ARGS...]: run CMD where libibverbs and librdmacm cannot be loaded" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then
    echo "$0: needs root (a mount namespace: unshare -m, mount); run it as root or under sudo" >&2
    exit 2
fi
if [ "${ROCEV2_NO_RDMA_CORE:-}" != 1 ]; then
    exec unshare --mount --propagation private env ROCEV2_NO_RDMA_CORE=1 "$0" "$@"
fi

# --- inside the namespace ---------------------------------------------------
names_re='^(libibverbs\.so.*|librdmacm\.so.*|libibverbs|librdmacm)$'
dirs=()
while read -r d; do dirs+=("$d"); done < <(
    {
        ldconfig -p 2>/dev/null | awk '/lib(ibverbs|rdmacm)\.so/ {print $NF}' | xargs -r -n1 dirname
        tr ':' '\n' <<<"${LD_LIBRARY_PATH:-}"
        [ -z "${CONDA_PREFIX:-}" ] || echo "$CONDA_PREFIX/lib"
        ls -d /lib /lib64 /usr/lib /usr/lib64 /usr/local/lib /lib/*-linux-gnu* /usr/lib/*-linux-gnu* 2>/dev/null
    } | while read -r d; do [ -n "$d" ] && [ -d "$d" ] && readlink -f "$d"; done | sort -u)

tmp=$(mktemp -d /tmp/no-rdma-core.XXXXXX)
mount -t tmpfs none "$tmp"
hidden=0
for d in "${dirs[@]}"; do
    mapfile -t found < <(ls -A "$d" 2>/dev/null | grep -E "$names_re" || true)
    [ ${#found[@]} -gt 0 ] || continue
    key=$(echo "$d" | tr '/' '_')
    mkdir -p "$tmp/$key/up" "$tmp/$key/work"
    for n in "${found[@]}"; do mknod "$tmp/$key/up/$n" c 0 0; done
    if [ "${ROCEV2_NO_RDMA_CORE_BIND:-0}" != 1 ] &&
        mount -t overlay overlay -o "lowerdir=$d,upperdir=$tmp/$key/up,workdir=$tmp/$key/work" "$d" 2>/dev/null; then
        echo "no-rdma-core: hidden in $d: ${found[*]}" >&2
    else
        : >"$tmp/empty"
        mkdir -p "$tmp/emptydir"
        for n in "${found[@]}"; do
            if [ -d "$d/$n" ] && [ ! -L "$d/$n" ]; then
                mount --bind "$tmp/emptydir" "$d/$n"
            elif [ -e "$d/$n" ]; then
                mount --bind "$tmp/empty" "$(readlink -f "$d/$n")"
            fi
        done
        echo "no-rdma-core: no overlay on $d; empty files bound over: ${found[*]}" >&2
    fi
    hidden=$((hidden + ${#found[@]}))
done
if [ -d /etc/libibverbs.d ]; then
    mount -t tmpfs none /etc/libibverbs.d
fi
echo "no-rdma-core: $hidden libibverbs/librdmacm files and provider directories hidden" >&2

# The namespace is only worth something if the libraries really cannot load.
if command -v python3 >/dev/null; then
    python3 - <<'EOF'
import ctypes, sys
for name in ("libibverbs.so.1", "librdmacm.so.1"):
    try:
        ctypes.CDLL(name)
    except OSError as e:
        print(f"no-rdma-core: dlopen({name}) fails: {e}", file=sys.stderr)
    else:
        sys.exit(f"no-rdma-core: {name} still loads inside the namespace; refusing to run")
EOF
else
    echo "no-rdma-core: python3 not found, dlopen not checked" >&2
fi

exec "$@"
