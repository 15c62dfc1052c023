#!/usr/bin/env bash
# Push the built guest (guest/out: Image, rootfs.ext4, guest.json and
# conformance/*.Image) to a registry as one OCI artifact, with vmstore's
# registry client (vmstore push-files), for guest/fetch.sh on a machine that
# cannot build it (a Mac).
#
#   guest/build.sh && guest/push.sh REGISTRY/REPOSITORY:TAG [--plain-http] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { echo "usage: guest/push.sh REGISTRY/REPOSITORY:TAG [--plain-http] [--out DIR]" >&2; exit 2; }
[ $# -ge 1 ] || usage
ref=$1
shift
out=guest/out
extra=()
while [ $# -gt 0 ]; do
    case $1 in
        --plain-http) extra+=(--plain-http) ;;
        --out) [ $# -ge 2 ] || usage; out=$2; shift ;;
        *) usage ;;
    esac
    shift
done
files=(Image rootfs.ext4 guest.json)
for f in "${files[@]}"; do
    [ -f "$out/$f" ] || { echo "[guest] error: $out/$f missing: run guest/build.sh" >&2; exit 1; }
done
for f in "$out"/conformance/*.Image; do
    [ -f "$f" ] && files+=("conformance/$(basename "$f")")
done
vmstore=${VMSTORE:-target/release/vmstore}
if [ ! -x "$vmstore" ]; then
    echo "[guest] cargo build --release --bin vmstore"
    cargo build --release --bin vmstore
fi
echo "[guest] vmstore push-files $out $ref (${#files[@]} files)"
"$vmstore" push-files "$out" "$ref" "${files[@]}" ${extra[@]+"${extra[@]}"}
