#!/usr/bin/env bash
# The Mac acceptance check: on an Apple Silicon Mac, builds Ignition, signs
# boot with the hypervisor entitlement, and runs the end-to-end suites on the
# hvf backend, first with the userspace GIC, then (macOS 15 or later) with
# Hypervisor.framework's in-kernel GIC. Ends with one Markdown summary (macOS
# version, chip, pass/fail counts per suite and GIC) to paste into an issue.
#
#   scripts/mac-check.sh [PYTEST ARGS...]     # e.g. -x, or -k snapshot
#
# Needs Rust, python3 with pytest (python3 -m pip install pytest; this script
# installs the ignition package, pip install -e ./scripts, which brings
# pexpect, and scripts/requirements-dev.txt), and the guest in guest/out
# (built on Linux: see README.md). Logs,
# JUnit XML and the summary go to target/mac-check/ (or $MAC_CHECK_OUT).
# Exits 0 only if every suite ran and passed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(uname -s)" != Darwin ] || [ "$(uname -m)" != arm64 ]; then
    echo "mac-check.sh: needs macOS on Apple Silicon (the hvf backend); this is $(uname -s) $(uname -m)" >&2
    exit 1
fi

say() { printf '[mac-check] %s\n' "$*"; }
die() { printf '[mac-check] error: %s\n' "$*" >&2; exit 1; }

suites=(test_boot_e2e test_snapshot_e2e test_crash_consistency test_kvm_unit_tests_e2e)
out=${MAC_CHECK_OUT:-target/mac-check}

for f in Image rootfs.ext4 guest.json; do
    [ -f "guest/out/$f" ] || die "guest/out/$f missing: build the guest on Linux (guest/build.sh, or in Docker: see README.md) and copy guest/out here"
done
python3 -c 'import pytest' 2>/dev/null || die "python3 lacks pytest: python3 -m pip install pytest"
say "pip install -e ./scripts -r scripts/requirements-dev.txt (the ignition package, pinned test tools)"
pip_args=(-e ./scripts -r scripts/requirements-dev.txt)
python3 -m pip install -q "${pip_args[@]}" 2>/dev/null || python3 -m pip install -q --break-system-packages "${pip_args[@]}"

mkdir -p "$out"
rm -f "$out"/*.xml "$out"/*.log "$out/summary.md"

say "cargo build --release --workspace --bins"
cargo build --release --workspace --bins
# After the last build: cargo's output has no signature, and HVF answers
# HV_DENIED to an unsigned boot.
say "sign boot"
scripts/sign.sh target/release/boot

macos=$(sw_vers -productVersion)
build=$(sw_vers -buildVersion 2>/dev/null || echo "?")
chip=$(sysctl -n machdep.cpu.brand_string 2>/dev/null || echo "unknown")
major=${macos%%.*}
gics=(userspace)
if [ "$major" -ge 15 ]; then
    gics+=(hvf)
fi

paths=()
for s in "${suites[@]}"; do
    paths+=("scripts/tests/$s.py")
done
status=0
for gic in "${gics[@]}"; do
    say "pytest --backend hvf --gic $gic: ${suites[*]} (log: $out/gic-$gic.log)"
    rc=0
    python3 -m pytest -q "${paths[@]}" --backend hvf --gic "$gic" --junitxml="$out/gic-$gic.xml" "$@" \
        2>&1 | tee "$out/gic-$gic.log" || rc=$?
    if [ "$rc" -ne 0 ]; then
        status=1
    fi
done

# One table from the JUnit files: a row per suite and GIC.
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
changes=$(git status --porcelain --untracked-files=no 2>/dev/null || true)
python3 - "$out" "$macos" "$build" "$chip" "$commit" "${changes:+dirty}" "$major" "${suites[@]}" \
    >"$out/summary.md" <<'PY'
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

out, macos, build, chip, commit, dirty, major, *suites = sys.argv[1:]
rows = []
for gic, label in (("userspace", "userspace"), ("hvf", "hvf (in-kernel)")):
    xml = Path(out) / f"gic-{gic}.xml"
    if gic == "hvf" and int(major) < 15:
        rows.append(f"| all | {label} | not run: needs macOS 15 | | | |")
        continue
    counts = {s: [0, 0, 0, 0] for s in suites}  # passed, failed, errors, skipped
    if not xml.is_file():
        rows.append(f"| all | {label} | no results (pytest did not run; see gic-{gic}.log) | | | |")
        continue
    for case in ET.parse(xml).iter("testcase"):
        parts = case.get("classname", "").split(".")
        suite = next((p for p in parts if p in counts), None)
        if suite is None:
            continue
        kinds = {child.tag for child in case}
        i = 1 if "failure" in kinds else 2 if "error" in kinds else 3 if "skipped" in kinds else 0
        counts[suite][i] += 1
    for s in suites:
        p, f, e, k = counts[s]
        mark = "" if f + e == 0 and p > 0 else " ✗"
        rows.append(f"| {s}{mark} | {label} | {p} | {f} | {e} | {k} |")
print("### Ignition Mac check (`scripts/mac-check.sh`)")
print()
print(f"macOS {macos} ({build}), {chip}; commit {commit}{' + local changes' if dirty else ''}; "
      f"{time.strftime('%Y-%m-%d %H:%M %Z')}; backend hvf.")
print()
print("| suite | GIC | passed | failed | errors | skipped |")
print("|---|---|---|---|---|---|")
print("\n".join(rows))
PY
echo
cat "$out/summary.md"
echo
say "summary in $out/summary.md; logs and JUnit XML beside it"
exit "$status"
