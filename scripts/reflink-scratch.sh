#!/usr/bin/env bash
# Mounts a small XFS file system with reflinks on a loop device, so tests can
# exercise the FICLONE clone path (ext4, the usual CI file system, has none).
#   scripts/reflink-scratch.sh up DIR     # prints DIR on success
#   scripts/reflink-scratch.sh down DIR
# Needs root, a loop device and mkfs.xfs (xfsprogs); when any is missing it
# says why on stderr and exits 3, and the FICLONE tests report themselves
# skipped.
set -euo pipefail
cmd=${1:?usage: reflink-scratch.sh up|down DIR}
dir=${2:?usage: reflink-scratch.sh up|down DIR}
img="$dir.img"
case "$cmd" in
up)
    if [ "$(id -u)" -ne 0 ]; then echo "reflink scratch: not root" >&2; exit 3; fi
    if ! command -v mkfs.xfs >/dev/null; then echo "reflink scratch: no mkfs.xfs" >&2; exit 3; fi
    mkdir -p "$dir"
    truncate -s 512M "$img"
    mkfs.xfs -q -f -m reflink=1 "$img"
    if ! mount -o loop "$img" "$dir" 2>/dev/null; then
        rm -f "$img"
        echo "reflink scratch: cannot mount a loop device here" >&2
        exit 3
    fi
    echo "$dir"
    ;;
down)
    umount "$dir" 2>/dev/null || true
    rm -f "$img"
    rmdir "$dir" 2>/dev/null || true
    ;;
*) echo "usage: reflink-scratch.sh up|down DIR" >&2; exit 2 ;;
esac
