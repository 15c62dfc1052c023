#!/usr/bin/env bash
# Push the built guest (guest/out: Image, rootfs.ext4, guest.json and
# conformance/*.Image) to a registry as one OCI artifact, with vmstore's
# registry client (vmstore push-files), for guest/fetch.sh on a machine that
# cannot build it (a Mac).
#
#   guest/build.sh && guest/push.sh REGISTRY/REPOSITORY:TAG [--plain-http] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
. guest/registry-common.sh
registry_args guest/push.sh "$@"
files=(Image rootfs.ext4 guest.json)
for f in "${files[@]}"; do
    [ -f "$out/$f" ] || { echo "[guest] error: $out/$f missing: run guest/build.sh" >&2; exit 1; }
done
for f in "$out"/conformance/*.Image; do
    [ -f "$f" ] && files+=("conformance/$(basename "$f")")
done
find_vmstore
echo "[guest] vmstore push-files $out $ref (${#files[@]} files)"
"$vmstore" push-files "$out" "$ref" "${files[@]}" ${extra[@]+"${extra[@]}"}
