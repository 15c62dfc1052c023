#!/usr/bin/env bash
# Fuzz every cargo-fuzz target of the repository for SECONDS_PER_TARGET
# seconds (default 30), each starting from a copy of its crate's checked-in
# seeds (<crate>/fuzz/seeds/<target>/; the copy grows, the seeds do not):
# the snapshot store's six file parsers (snapshot-store/fuzz/) and the
# VMM's two parsers of host input, the control socket's request lines and
# the vsock host end's CONNECT lines (vmm/fuzz/), and the host's decoding of
# what the guest agent sends (agent-client/fuzz/). Prints one line per
# target, "fuzz TARGET: N execs in S s", and exits 1 if any target found a
# crash, a panic or a hang (the input is kept under
# <crate>/fuzz/artifacts/TARGET/). Installs the nightly toolchain and
# cargo-fuzz (pinned) if they are missing. The three crates build into one target
# directory, $IGNITION_FUZZ_TARGET_DIR (default target/fuzz), so what they
# share (the store, serde, ...) is built once.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
# CRATE:TARGET, in the order they run.
TARGETS=(
    snapshot-store:manifest snapshot-store:diff snapshot-store:state
    snapshot-store:verified snapshot-store:disk_chunks snapshot-store:disk_diff
    vmm:control_request vmm:vsock_connect
    agent-client:agent_responses
)

secs=${1:-30}
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 2
fi
cd "$(dirname "$0")/.."
root=$PWD
target_dir=${IGNITION_FUZZ_TARGET_DIR:-$root/target/fuzz}

if ! rustup toolchain list | grep -q '^nightly-'; then
    rustup toolchain install nightly --profile minimal
fi
if [[ "$(cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

# Inputs up to the size that reaches each parser's limits: diffs and chunk
# lists of a few pages, a disk diff's 64 KiB prefix and a little more,
# verified.json past its 64 KiB cap, a control request past its 64 KiB
# line, a CONNECT line past its 32 bytes, agent responses of a few frames.
max_len() {
    case $1 in
        diff | disk_chunks) echo 20000 ;;
        verified | control_request | disk_diff) echo 70000 ;;
        vsock_connect) echo 64 ;;
        agent_responses) echo 4096 ;;
        *) echo 8192 ;;
    esac
}

start=$SECONDS
for crate in snapshot-store vmm agent-client; do
    (cd "$root/$crate" && cargo +nightly fuzz build --target-dir "$target_dir")
done
echo "fuzz: targets built in $((SECONDS - start)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for ct in "${TARGETS[@]}"; do
    crate=${ct%%:*} t=${ct#*:}
    mkdir -p "$work/corpus/$t"
    cp "$root/$crate"/fuzz/seeds/"$t"/* "$work/corpus/$t/"
    log="$work/$t.log"
    if (cd "$root/$crate" && cargo +nightly fuzz run --target-dir "$target_dir" "$t" "$work/corpus/$t" -- \
        -max_total_time="$secs" -max_len="$(max_len "$t")" -timeout=10 \
        -print_final_stats=1) >"$log" 2>&1; then
        done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1)
        read -r _ runs _ _ took _ <<<"$done_line"
        echo "fuzz $t: $runs execs in $took s"
    else
        echo "fuzz $t: FAILED:"
        grep -E -A3 'panicked at|==ERROR|^SUMMARY|ERROR: libFuzzer|Failing input' "$log" |
            head -n 40 || tail -n 40 "$log"
        failed+=("$crate/fuzz/artifacts/$t")
    fi
done
if ((${#failed[@]})); then
    echo "fuzz: failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets, $secs s each, no crash ($((SECONDS - start)) s in all)"
