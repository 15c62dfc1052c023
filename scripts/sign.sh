#!/bin/sh
# Ad-hoc code signature with the com.apple.security.hypervisor entitlement,
# which Hypervisor.framework requires (without it every call answers
# HV_DENIED). No Apple developer account is needed.
set -eu

usage() {
    cat <<USAGE
Usage: scripts/sign.sh BINARY...

Signs each BINARY ad hoc with the entitlements in
scripts/hypervisor.entitlements (com.apple.security.hypervisor), so it can
use Hypervisor.framework (the hvf backend). Re-run after every build: cargo
replaces the binary and drops the signature.

Example:
  cargo build --release && scripts/sign.sh target/release/boot
USAGE
}

case "${1:-}" in
    -h | --help)
        usage
        exit 0
        ;;
    "")
        usage >&2
        exit 2
        ;;
esac

if [ "$(uname -s)" != "Darwin" ]; then
    echo "sign.sh: codesign and Hypervisor.framework exist only on macOS;" \
        "this is $(uname -s). Sign the binary on the Mac that runs it." >&2
    exit 1
fi

entitlements="$(cd "$(dirname "$0")" && pwd)/hypervisor.entitlements"
for bin in "$@"; do
    if [ ! -f "$bin" ]; then
        echo "sign.sh: $bin: no such file (build it first)" >&2
        exit 1
    fi
    codesign --sign - --entitlements "$entitlements" --force "$bin"
    echo "signed $bin"
done
