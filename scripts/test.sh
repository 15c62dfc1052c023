#!/usr/bin/env bash
# The test suite: Rust unit and integration tests, then the pytest suites
# (guest reference boot under QEMU, guest reproducibility, and end-to-end
# boots of our VMM over a pty). Needs scripts/setup.sh and guest/build.sh.
# Arguments go to the last pytest run (scripts/tests), e.g. -m "not e2e".
set -euo pipefail
cd "$(dirname "$0")/.."

pip_install() {
    python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}

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
pip_install ./snapshot-store/python
# Editable, from this checkout: the tests find the package only through this
# install (and through it, this checkout's binaries and guest).
echo "[test] pip install -e ./scripts (the ignition package)"
pip_install -e ./scripts
echo "[test] pytest snapshot-store/python/tests (the module on stores it writes)"
python3 -m pytest -q -p no:cacheprovider snapshot-store/python/tests
echo "[test] pytest"
python3 -m pytest -q scripts/tests "$@"
