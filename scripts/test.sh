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
echo "[test] pytest"
python3 -m pytest -q scripts/tests "$@"
