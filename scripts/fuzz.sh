#!/usr/bin/env bash
# Fuzz each snapshot-store parser (the five cargo-fuzz targets) for
# SECONDS_PER_TARGET seconds (default 30), starting from a copy of the
# checked-in seeds (fuzz/seeds/<target>/; the copy grows, the seeds do not).
# Prints one line per target, "fuzz TARGET: N execs in S s", and exits 1 if
# any target found a crash, a panic or a hang (the input is kept under
# fuzz/artifacts/TARGET/). Installs the nightly toolchain and cargo-fuzz
# (pinned) if they are missing.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.2
TARGETS=(manifest diff state verified disk_chunks)

secs=${1:-30}
if ! [[ $secs =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS_PER_TARGET]" >&2
    exit 2
fi
cd "$(dirname "$0")/../snapshot-store"

if ! rustup toolchain list | grep -q '^nightly-'; then
    rustup toolchain install nightly --profile minimal
fi
if [[ "$(cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
    cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi

# Inputs up to the size that reaches each parser's limits: diffs and chunk
# lists of a few pages, and verified.json past its 64 KiB cap.
max_len() {
    case $1 in
        diff | disk_chunks) echo 20000 ;;
        verified) echo 70000 ;;
        *) echo 8192 ;;
    esac
}

start=$SECONDS
cargo +nightly fuzz build
echo "fuzz: targets built in $((SECONDS - start)) s"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=()
for t in "${TARGETS[@]}"; do
    mkdir -p "$work/corpus/$t"
    cp fuzz/seeds/"$t"/* "$work/corpus/$t/"
    log="$work/$t.log"
    if cargo +nightly fuzz run "$t" "$work/corpus/$t" -- \
        -max_total_time="$secs" -max_len="$(max_len "$t")" -timeout=10 \
        -print_final_stats=1 >"$log" 2>&1; then
        done_line=$(grep -E '^Done [0-9]+ runs in [0-9]+ second' "$log" | tail -n 1)
        read -r _ runs _ _ took _ <<<"$done_line"
        echo "fuzz $t: $runs execs in $took s"
    else
        echo "fuzz $t: FAILED:"
        grep -E -A3 'panicked at|==ERROR|^SUMMARY|ERROR: libFuzzer|Failing input' "$log" |
            head -n 40 || tail -n 40 "$log"
        failed+=("$t")
    fi
done
if ((${#failed[@]})); then
    echo "fuzz: failed: ${failed[*]} (inputs under snapshot-store/fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets, $secs s each, no crash ($((SECONDS - start)) s in all)"
