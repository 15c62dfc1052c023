#!/usr/bin/env bash
# The first-run check of a host, for the first run on a Mac (it runs on Linux
# too, on the emu backend): installs the Python packages it needs, then runs
# python3 -m ignition.mac_check, which builds Ignition, signs boot on macOS,
# runs the whole end-to-end suite, the conformance groups (lost wake-ups
# reported) and the benchmarks in a short mode on --backend hvf (userspace
# GIC, then --gic hvf on macOS 15 or later) or emu, beside emu and QEMU, and
# ends with one Markdown table to paste into an issue
# (target/mac-check/summary.md, or $MAC_CHECK_OUT).
#
#   scripts/mac-check.sh [ARGS...] [-- PYTEST ARGS...]   # ARGS: python3 -m ignition.mac_check --help
#
# Needs the guest in guest/out (guest/build.sh on Linux, or guest/fetch.sh
# REF), QEMU, Rust; the README's Mac section lists the steps. Exits 0 only if
# everything ran and passed.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_args=(-e ./scripts -r scripts/requirements-dev.txt ./snapshot-store/python)
echo "[mac-check] pip install ${pip_args[*]} (the ignition package, pinned test tools, the vmstore module)"
python3 -m pip install -q "${pip_args[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${pip_args[@]}"
exec python3 -m ignition.mac_check "$@"
