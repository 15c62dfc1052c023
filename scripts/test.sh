#!/usr/bin/env bash
# The test suite: Rust unit and integration tests, then the pytest suites
# (guest reference boot under QEMU, guest reproducibility, and end-to-end
# boots of our VMM over a pty). Needs scripts/setup.sh and guest/build.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "[test] cargo build --release"
cargo build --release --workspace --bins
echo "[test] cargo test"
cargo test --workspace --release
# The device models and the store's parsers again with overflow checks (a
# debug build), where a guest- or file-controlled value that overflows
# panics instead of wrapping; without the emu backend, whose C build is slow.
echo "[test] cargo test (debug: overflow checks) of devices and parsers"
cargo test -p ignition-vmm --no-default-features --lib devices::
cargo test -p snapshot-store --lib
# Every cargo build above may have replaced boot, which drops its signature;
# Hypervisor.framework answers HV_DENIED to an unsigned boot.
if [ "$(uname -s)" = Darwin ]; then
    echo "[test] sign boot (hypervisor entitlement)"
    scripts/sign.sh target/release/boot
fi
echo "[test] pip install ./snapshot-store/python (the vmstore Python module)"
python3 -m pip install -q ./snapshot-store/python 2>/dev/null \
    || python3 -m pip install -q --break-system-packages ./snapshot-store/python
echo "[test] pytest snapshot-store/python/tests (the module on stores it writes)"
python3 -m pytest -q -p no:cacheprovider snapshot-store/python/tests
echo "[test] pytest"
python3 -m pytest -q scripts/tests "$@"
