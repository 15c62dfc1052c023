#!/usr/bin/env bash
# Installs what building and testing Ignition needs on a Debian-based Linux
# host: the C toolchain for unicorn-engine (cmake, libclang for bindgen),
# QEMU (the reference boot; qemu-user and the aarch64 cross compiler for the
# hvf ABI probe), Python test tools and maturin, the Rust targets and
# components CI checks with, and mdBook for the book. Idempotent; fast when everything is present.
# The guest image's own packages are installed by guest/build.sh.
set -euo pipefail

say() { printf '[setup] %s\n' "$*"; }

if [ "$(uname -s)" != Linux ] || ! command -v apt-get >/dev/null; then
    say "this script supports Debian-based Linux hosts; on macOS see README.md (Mac users)" >&2
    exit 1
fi

SUDO=
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi

# docker-registry (CNCF distribution), skopeo and openssl: the registry
# push/pull tests and python3 -m ignition.bench.oci run throwaway local registries
# (one over HTTPS with a throwaway CA).
apt_pkgs=(build-essential cmake pkg-config clang libclang-dev qemu-system-arm python3-pip device-tree-compiler e2fsprogs xfsprogs passt docker-registry skopeo openssl)
# The hvf ABI probe (.ci/run) builds for aarch64-unknown-linux-gnu: on other
# hosts with the cross C toolchain, and runs under qemu-user.
if [ "$(uname -m)" != aarch64 ]; then
    apt_pkgs+=(qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
fi
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt: installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

py_missing=()
python3 -c 'import pytest' 2>/dev/null || py_missing+=(pytest)
python3 -c 'import pexpect' 2>/dev/null || py_missing+=(pexpect)
# bcrypt: the htpasswd line of the basic-auth registry in test_oci_e2e.py.
python3 -c 'import bcrypt' 2>/dev/null || py_missing+=(bcrypt)
# maturin builds the vmstore Python module (snapshot-store/python); pip's
# isolated build fetches its own copy, this one is for `maturin develop`.
command -v maturin >/dev/null || py_missing+=("maturin>=1.9,<2")
pip_install() {
    python3 -m pip install -q "$@" 2>/dev/null || python3 -m pip install -q --break-system-packages "$@"
}
if [ ${#py_missing[@]} -gt 0 ]; then
    say "pip: installing ${py_missing[*]}"
    pip_install "${py_missing[@]}"
fi
# Pinned tools (pytest-timeout, CI's Python linters); pip does nothing when they are present.
pip_install -r "$(dirname "$0")/requirements-dev.txt"
# The ignition package (scripts/ignition: the harness, benchmarks and other
# front-ends), editable from this checkout: the only way the tests and
# `python3 -m ignition.<module>` find it.
scripts_dir=$(cd "$(dirname "$0")" && pwd -P)
if [ "$(cd / && python3 -c 'import ignition.paths as p; print(p.SCRIPTS)' 2>/dev/null)" != "$scripts_dir" ]; then
    say "pip: installing the ignition package (pip install -e ./scripts)"
    pip_install -e "$scripts_dir"
fi

if ! command -v cargo >/dev/null; then
    say "Rust is missing: install it with rustup (https://rustup.rs), then re-run" >&2
    exit 1
fi
if command -v rustup >/dev/null; then
    installed=$(rustup target list --installed)
    grep -qx aarch64-apple-darwin <<<"$installed" || { say "rustup: adding target aarch64-apple-darwin"; rustup target add aarch64-apple-darwin >/dev/null; }
    grep -qx aarch64-unknown-linux-gnu <<<"$installed" || { say "rustup: adding target aarch64-unknown-linux-gnu (the hvf ABI probe)"; rustup target add aarch64-unknown-linux-gnu >/dev/null; }
    comps=$(rustup component list --installed)
    for c in clippy rustfmt; do
        grep -q "^$c" <<<"$comps" || { say "rustup: adding component $c"; rustup component add "$c" >/dev/null; }
    done
fi

# mdBook, pinned, for building the book (scripts/tests/test_book.py); built
# without its server and watcher, which the build does not need.
MDBOOK_VERSION=0.4.52
if [ "$(mdbook --version 2>/dev/null)" != "mdbook v$MDBOOK_VERSION" ]; then
    say "cargo: installing mdbook $MDBOOK_VERSION (a few minutes, once)"
    cargo install --quiet --locked --no-default-features mdbook --version "$MDBOOK_VERSION"
fi
say "ok"
