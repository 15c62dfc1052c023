#!/usr/bin/env bash
# Build the conformance test images: OUT/<group>.Image for every group, each
# a bare-metal Linux arm64 Image (see book/src/conformance.md). The same
# sources and toolchain give byte-identical images (no timestamps or paths
# reach the flat binaries).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NAMES=(sgi active vtimer debug pmu idregs snapshot gic-minimal)
CROSS=${CROSS_COMPILE:-aarch64-linux-gnu-}
OUT=$HERE/../out/conformance

usage() {
    cat <<EOF2
Usage: guest/conformance/build.sh [--out DIR] [--list]

Builds ${NAMES[*]} as DIR/<group>.Image (default: guest/out/conformance)
with ${CROSS}gcc (Debian package gcc-aarch64-linux-gnu). --list prints the
group names and exits.
EOF2
}

while [[ $# -gt 0 ]]; do
    case $1 in
        --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; OUT=$2; shift 2 ;;
        --out=*) OUT=${1#--out=}; shift ;;
        --list) printf '%s\n' "${NAMES[@]}"; exit 0 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "guest/conformance/build.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done

for tool in gcc ld objcopy; do
    command -v "$CROSS$tool" >/dev/null || {
        echo "guest/conformance/build.sh: $CROSS$tool not found (Debian package gcc-aarch64-linux-gnu)" >&2
        exit 1
    }
done

CFLAGS=(-std=gnu11 -O2 -Wall -Wextra -Werror -ffreestanding -nostdlib -march=armv8-a
    -mgeneral-regs-only -mstrict-align -fno-pic -fno-pie -mcmodel=small -fno-stack-protector
    -fno-asynchronous-unwind-tables -fno-tree-loop-distribute-patterns -fno-common -g0)
# Feature probes (idregs) assemble instructions beyond Armv8.0.
ASFLAGS=(-march=armv8.5-a+crypto+sve+rng+memtag)

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ignition-conformance.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

cd "$HERE"
"${CROSS}gcc" "${CFLAGS[@]}" -c start.S -o "$WORK/start.o"
"${CROSS}gcc" "${CFLAGS[@]}" -c rt.c -o "$WORK/rt.o"
for g in "${NAMES[@]}"; do
    objs=("$WORK/start.o" "$WORK/rt.o")
    "${CROSS}gcc" "${CFLAGS[@]}" -c "$g.c" -o "$WORK/$g.o"
    objs+=("$WORK/$g.o")
    if [[ -f ${g}_asm.S ]]; then
        "${CROSS}gcc" "${CFLAGS[@]}" "${ASFLAGS[@]}" -c "${g}_asm.S" -o "$WORK/${g}_asm.o"
        objs+=("$WORK/${g}_asm.o")
    fi
    "${CROSS}ld" -nostdlib -static --build-id=none -T link.ld -o "$WORK/$g.elf" "${objs[@]}"
    "${CROSS}objcopy" -O binary "$WORK/$g.elf" "$WORK/$g.Image"
    mv "$WORK/$g.Image" "$OUT/$g.Image"
done
echo "conformance: ${NAMES[*]} -> $OUT"
