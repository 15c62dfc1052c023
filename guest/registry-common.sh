# Sourced by guest/fetch.sh and guest/push.sh: their shared arguments
# (REGISTRY/REPOSITORY:TAG [--plain-http] [--out DIR]) and the vmstore they
# run. Expects the working directory to be the repository's root.

# Sets ref, out (default guest/out) and extra (vmstore's flags).
registry_args() {
    local script=$1
    shift
    usage() { echo "usage: $script REGISTRY/REPOSITORY:TAG [--plain-http] [--out DIR]" >&2; exit 2; }
    [ $# -ge 1 ] || usage
    ref=$1
    shift
    out=guest/out
    extra=()
    while [ $# -gt 0 ]; do
        case $1 in
            --plain-http) extra+=(--plain-http) ;;
            --out) [ $# -ge 2 ] || usage; out=$2; shift ;;
            *) usage ;;
        esac
        shift
    done
}

# Sets vmstore: $VMSTORE, else target/release/vmstore (built if missing).
find_vmstore() {
    vmstore=${VMSTORE:-target/release/vmstore}
    if [ ! -x "$vmstore" ]; then
        echo "[guest] cargo build --release --bin vmstore"
        cargo build --release --bin vmstore
    fi
}
