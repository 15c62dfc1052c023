#!/usr/bin/env bash
# check-config.sh FRAGMENT DOTCONFIG SRCDIR
# Fails, naming the options, if the kernel's .config lost anything the fragment asked for:
# an option Kconfig does not define, a value that differs, or an "is not set" that got set.
set -euo pipefail
[[ $# -eq 3 ]] || { echo "usage: check-config.sh FRAGMENT DOTCONFIG SRCDIR" >&2; exit 2; }
fragment=$1 dotconfig=$2 src=$3

# Every symbol any Kconfig file defines.
known=$(mktemp)
trap 'rm -f "$known"' EXIT
find "$src" -name 'Kconfig*' -type f -print0 \
    | xargs -0 grep -hoE '^[[:space:]]*(menu)?config[[:space:]]+[A-Za-z0-9_]+' \
    | awk '{ print $2 }' | sort -u >"$known"

LC_ALL=C awk -v known="$known" -v dotconfig="$dotconfig" '
BEGIN {
    while ((getline s < known) > 0) defined[s] = 1
    while ((getline line < dotconfig) > 0) {
        if (match(line, /^CONFIG_[A-Za-z0-9_]+=/)) {
            name = substr(line, 8, RLENGTH - 8); have[name] = substr(line, RLENGTH + 1)
        }
    }
}
/^[[:space:]]*$/ { next }
/^# CONFIG_[A-Za-z0-9_]+ is not set$/ { name = $2; sub(/^CONFIG_/, "", name); want = ""; off = 1; check(); next }
/^#/ { next }
/^CONFIG_[A-Za-z0-9_]+=/ {
    eq = index($0, "="); name = substr($0, 8, eq - 8); want = substr($0, eq + 1); off = 0; check(); next
}
{ printf "kernel.fragment:%d: cannot parse: %s\n", NR, $0; bad++ }
function check() {
    n++
    if (!(name in defined)) { printf "CONFIG_%s: no Kconfig defines it (misspelt?)\n", name; bad++; return }
    if (off) {
        if (name in have && have[name] != "n") { printf "CONFIG_%s: wanted not set, got %s\n", name, have[name]; bad++ }
    } else if (!(name in have)) {
        printf "CONFIG_%s: wanted %s, dropped by Kconfig (unmet dependency?)\n", name, want; bad++
    } else if (have[name] != want) {
        printf "CONFIG_%s: wanted %s, got %s\n", name, want, have[name]; bad++
    }
}
END {
    if (bad) { printf "kernel config check FAILED: %d of %d fragment options not as requested\n", bad, n; exit 1 }
    printf "kernel config check: all %d fragment options as requested\n", n
}' "$fragment"
