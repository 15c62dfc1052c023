#!/usr/bin/env bash
# Build the Ignition aarch64 guest: out/Image, out/rootfs.ext4, out/guest.json
# (and the conformance test images, out/conformance/).
# See guest/README.md. Run `guest/build.sh --help` for options.
set -euo pipefail

GUEST_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# Pinned values that make the outputs byte-identical between builds.
EPOCH=1704067200                                  # 2024-01-01T00:00:00Z
ROOTFS_UUID=5f1b7c3e-2a4d-4e8f-9b60-1c2d3e4f5a6b
ROOTFS_HASH_SEED=0c0ffee0-1a2b-4c3d-8e4f-5a6b7c8d9e0f
ROOTFS_SIZE=64M
ROOTFS_LABEL=ignition-root
KERNEL_SRC_PKG=linux-source-6.12
BUSYBOX_PKG=busybox-static

usage() {
    cat <<EOF
Usage: guest/build.sh [options]

Builds the Ignition guest into the output directory:
  Image        arm64 Linux kernel, everything built in
  rootfs.ext4  busybox root filesystem (root logs in without a password)
  guest.json   sha256/size of both, kernel version, page size, package versions
  conformance/ the bare-metal conformance test images (guest/conformance/)

Options:
  --page-size 4k|16k   kernel page size (default: 16k)
  --out DIR            output directory (default: guest/out)
  --cache DIR          cache directory (default: \${XDG_CACHE_HOME:-\$HOME/.cache}/ignition-guest)
  -j, --jobs N         parallel make jobs for the kernel (default: nproc)
  --rootfs-only        build only rootfs.ext4 (no kernel, no guest.json)
  --no-install         never run apt-get; report missing packages instead
  -h, --help           show this help

Needs Debian-based Linux (x86_64 or arm64); installs missing packages with
apt-get when run as root or with passwordless sudo. On macOS, run it in a
Debian container (see guest/README.md).
EOF
}

usage_error() {
    echo "guest/build.sh: $1" >&2
    echo "Try 'guest/build.sh --help'." >&2
    exit 2
}

say() { echo "[guest] $*"; }
die() { echo "[guest] error: $*" >&2; exit 1; }

# ---------------------------------------------------------------- options
PAGE_SIZE=16k
OUT_DIR=$GUEST_DIR/out
CACHE_DIR=${XDG_CACHE_HOME:-$HOME/.cache}/ignition-guest
JOBS=
ROOTFS_ONLY=0
NO_INSTALL=0

need_value() { [[ $# -ge 2 && -n $2 ]] || usage_error "option $1 needs a value"; }
while [[ $# -gt 0 ]]; do
    opt=$1
    case $opt in
        --*=*) set -- "${opt%%=*}" "${opt#*=}" "${@:2}"; continue ;;
    esac
    case $opt in
        -h|--help) usage; exit 0 ;;
        --page-size) need_value "$@"; PAGE_SIZE=$2; shift 2 ;;
        --out) need_value "$@"; OUT_DIR=$2; shift 2 ;;
        --cache) need_value "$@"; CACHE_DIR=$2; shift 2 ;;
        -j|--jobs) need_value "$@"; JOBS=$2; shift 2 ;;
        --rootfs-only) ROOTFS_ONLY=1; shift ;;
        --no-install) NO_INSTALL=1; shift ;;
        *) usage_error "unknown option: $opt" ;;
    esac
done
case $PAGE_SIZE in
    4k) PAGE_BYTES=4096 ;;
    16k) PAGE_BYTES=16384 ;;
    *) usage_error "invalid --page-size '$PAGE_SIZE' (expected 4k or 16k)" ;;
esac
if [[ -n $JOBS ]]; then
    [[ $JOBS =~ ^[1-9][0-9]*$ ]] || usage_error "invalid --jobs '$JOBS' (expected a positive integer)"
fi

# ---------------------------------------------------------------- host
host_os=$(uname -s)
if [[ $host_os != Linux ]]; then
    echo "[guest] error: guest/build.sh needs Debian-based Linux; this host is $host_os." >&2
    if [[ $host_os == Darwin ]]; then
        cat >&2 <<'EOF'
[guest] On macOS, build inside a Debian container from the repository root:
[guest]   docker run --rm -v "$PWD":/src -w /src debian:bookworm guest/build.sh
[guest] or copy guest/out/ (Image, rootfs.ext4, guest.json) from a Linux build.
EOF
    fi
    exit 1
fi
if [[ ! -r /etc/debian_version ]] || ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    die "guest/build.sh needs a Debian-based Linux with apt and dpkg (no /etc/debian_version or apt-get here)."
fi
HOST_ARCH=$(uname -m)
case $HOST_ARCH in
    x86_64) CC_PKG=gcc-aarch64-linux-gnu; LIBC_PKG=libc6-dev-arm64-cross ;;
    aarch64) CC_PKG=gcc; LIBC_PKG=libc6-dev ;;   # native gcc provides aarch64-linux-gnu-gcc
    *) die "unsupported host architecture $HOST_ARCH (need x86_64 or aarch64)" ;;
esac
CROSS_COMPILE=aarch64-linux-gnu-
export LC_ALL=C TZ=UTC
export PATH=$PATH:/usr/sbin:/sbin    # mkfs.ext4, debugfs: not on a normal user's PATH

JOBS=${JOBS:-$(nproc)}
mkdir -p "$OUT_DIR" "$CACHE_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
CACHE_DIR=$(cd "$CACHE_DIR" && pwd)
LOG_DIR=$OUT_DIR/logs
mkdir -p "$LOG_DIR"

# One build per cache at a time.
exec 9>"$CACHE_DIR/.lock"
if ! flock -n 9; then
    say "waiting for another build using $CACHE_DIR"
    flock 9
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ignition-guest.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
trap 'echo "[guest] error: command failed at build.sh line $LINENO: $BASH_COMMAND" >&2' ERR

# run_stage NAME MESSAGE FUNCTION...: one progress line, output to a log,
# and on failure the stage name, the log path and its tail.
run_stage() {
    local name=$1 msg=$2 log=$LOG_DIR/$1.log rc
    shift 2
    say "$name: $msg (log: $log)"
    set +e
    (set -e; "$@") >"$log" 2>&1
    rc=$?
    set -e
    if [[ $rc -ne 0 ]]; then
        echo "[guest] error: stage '$name' failed (exit $rc); log: $log" >&2
        tail -n 25 "$log" | sed 's/^/[guest]   | /' >&2
        exit 1
    fi
}

pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null; }
pkg_installed() {
    [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# ---------------------------------------------------------------- packages
# The compiler and C library build the rootfs's tools (guest/tools/) too.
PKGS=(e2fsprogs "$CC_PKG" "$LIBC_PKG")
if [[ $ROOTFS_ONLY == 0 ]]; then
    PKGS+=("$KERNEL_SRC_PKG" make gcc libc6-dev bc bison flex libssl-dev libelf-dev xz-utils)
fi
missing=()
for p in "${PKGS[@]}"; do
    pkg_installed "$p" || missing+=("$p")
done
need_arch=0
if [[ $HOST_ARCH == x86_64 ]] && ! dpkg --print-foreign-architectures | grep -qx arm64; then
    need_arch=1
fi
bb_candidate() {
    { apt-cache policy "$BUSYBOX_PKG:arm64" 2>/dev/null || true; } \
        | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }'
}
BB_VERSION=
[[ $need_arch == 1 ]] || BB_VERSION=$(bb_candidate)

if [[ ${#missing[@]} -gt 0 || $need_arch == 1 || -z $BB_VERSION ]]; then
    SUDO=
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then SUDO=sudo; else SUDO=none; fi
    fi
    if [[ $NO_INSTALL == 1 || $SUDO == none ]]; then
        [[ $need_arch == 0 ]] || die "arm64 is not a dpkg architecture; run: sudo dpkg --add-architecture arm64 && sudo apt-get update"
        [[ ${#missing[@]} -eq 0 ]] || die "missing package(s): ${missing[*]}; install with: sudo apt-get install ${missing[*]}"
        die "apt knows no $BUSYBOX_PKG:arm64; run: sudo apt-get update"
    fi
    install_packages() {
        if [[ $need_arch == 1 ]]; then $SUDO dpkg --add-architecture arm64; fi
        $SUDO apt-get update
        if [[ ${#missing[@]} -gt 0 ]]; then
            $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
        fi
    }
    run_stage packages "apt-get update; installing: ${missing[*]:-(none)}" install_packages
    for p in "${PKGS[@]}"; do
        pkg_installed "$p" || die "missing package $p (apt-get install did not install it)"
    done
    BB_VERSION=$(bb_candidate)
    [[ -n $BB_VERSION ]] || die "apt has no $BUSYBOX_PKG:arm64 (is a Debian main arm64 source configured?)"
else
    say "packages: all present"
fi
for tool_pkg in mkfs.ext4:e2fsprogs debugfs:e2fsprogs e2fsck:e2fsprogs dpkg-deb:dpkg apt-get:apt \
    flock:util-linux sha256sum:coreutils; do
    command -v "${tool_pkg%%:*}" >/dev/null || die "missing tool ${tool_pkg%%:*} (package ${tool_pkg#*:})"
done

# ---------------------------------------------------------------- busybox .deb
DEB_DIR=$CACHE_DIR/debs
BB_DEB=$DEB_DIR/${BUSYBOX_PKG}_${BB_VERSION//:/%3a}_arm64.deb
if [[ -f $BB_DEB ]]; then
    say "busybox: cached $(basename "$BB_DEB")"
else
    fetch_busybox() {
        mkdir -p "$DEB_DIR" "$WORK/dl"
        chmod 0777 "$WORK/dl"    # lets apt's _apt user write when run as root
        cd "$WORK/dl"
        apt-get download "$BUSYBOX_PKG:arm64=$BB_VERSION"
        local got
        got=$(ls -- *.deb)
        [[ $(dpkg-deb -f "$got" Architecture) == arm64 ]]
        mv "$got" "$BB_DEB.tmp"
        mv "$BB_DEB.tmp" "$BB_DEB"
    }
    run_stage busybox "downloading $BUSYBOX_PKG:arm64 $BB_VERSION" fetch_busybox
fi

# ---------------------------------------------------------------- kernel
FRAGMENT=$GUEST_DIR/kernel.fragment
FRAGMENT_SHA=$(sha256sum "$FRAGMENT" | cut -d' ' -f1)
BUILD_TIMESTAMP=$(date -u -d "@$EPOCH")
# make's environment: everything besides inputs that shapes the Image.
MAKE_VARS=(ARCH=arm64 "CROSS_COMPILE=$CROSS_COMPILE" KBUILD_BUILD_USER=ignition
    KBUILD_BUILD_HOST=ignition KBUILD_BUILD_VERSION=1 "KBUILD_BUILD_TIMESTAMP=$BUILD_TIMESTAMP")

if [[ $ROOTFS_ONLY == 0 ]]; then
    command -v "${CROSS_COMPILE}gcc" >/dev/null || die "missing tool ${CROSS_COMPILE}gcc (package $CC_PKG)"
    [[ -f /usr/src/$KERNEL_SRC_PKG.tar.xz ]] || die "missing /usr/src/$KERNEL_SRC_PKG.tar.xz (package $KERNEL_SRC_PKG)"
    SRC_VERSION=$(pkg_version "$KERNEL_SRC_PKG")
    CC_VERSION=$("${CROSS_COMPILE}gcc" --version | head -n1)
    LD_VERSION=$("${CROSS_COMPILE}ld" --version | head -n1)

    # Effective fragment: the 16k page lines swapped for 4k when asked.
    EFF_FRAGMENT=$WORK/kernel.fragment
    if [[ $PAGE_SIZE == 4k ]]; then
        grep -qx 'CONFIG_ARM64_16K_PAGES=y' "$FRAGMENT" && grep -qx 'CONFIG_ARM64_VA_BITS_47=y' "$FRAGMENT" \
            || die "kernel.fragment lacks the CONFIG_ARM64_16K_PAGES=y / CONFIG_ARM64_VA_BITS_47=y lines to swap for 4k"
        sed -e 's/^CONFIG_ARM64_16K_PAGES=y$/CONFIG_ARM64_4K_PAGES=y/' \
            -e 's/^CONFIG_ARM64_VA_BITS_47=y$/CONFIG_ARM64_VA_BITS_48=y/' "$FRAGMENT" >"$EFF_FRAGMENT"
    else
        cp "$FRAGMENT" "$EFF_FRAGMENT"
    fi

    KERNEL_KEY=$({
        echo "fragment $(sha256sum "$EFF_FRAGMENT" | cut -d' ' -f1)"
        echo "page-size $PAGE_SIZE"
        echo "source $KERNEL_SRC_PKG $SRC_VERSION"
        echo "cc $CC_VERSION"
        echo "ld $LD_VERSION"
        echo "make ${MAKE_VARS[*]}"
    } | sha256sum | cut -d' ' -f1)
    KDIR=$CACHE_DIR/kernel-$PAGE_SIZE
    if [[ -f $KDIR/Image && -f $KDIR/kernel.release && $(cat "$KDIR/key" 2>/dev/null) == "$KERNEL_KEY" ]]; then
        say "kernel: cached (key ${KERNEL_KEY:0:12})"
    else
        # The source is needed only when building, so a cache of kernel-*/{Image,key,kernel.release} suffices.
        SRC_DIR=$CACHE_DIR/src/$KERNEL_SRC_PKG-${SRC_VERSION//:/_}   # no ':' in make paths
        if [[ -f $SRC_DIR/.ignition-unpacked ]]; then
            say "source: cached $SRC_DIR"
        else
            unpack_source() {
                rm -rf "$SRC_DIR" "$SRC_DIR.tmp"
                mkdir -p "$SRC_DIR.tmp"
                tar -xJf "/usr/src/$KERNEL_SRC_PKG.tar.xz" -C "$SRC_DIR.tmp" --strip-components=1
                [[ -f $SRC_DIR.tmp/Makefile && -d $SRC_DIR.tmp/arch/arm64 ]]
                touch "$SRC_DIR.tmp/.ignition-unpacked"
                mv "$SRC_DIR.tmp" "$SRC_DIR"
            }
            run_stage source "unpacking $KERNEL_SRC_PKG $SRC_VERSION into $SRC_DIR" unpack_source
        fi
        kmake() {
            env -u KCFLAGS -u KCPPFLAGS -u KAFLAGS -u KBUILD_OUTPUT -u KCONFIG_CONFIG -u LOCALVERSION \
                -u MAKEFLAGS -u MAKELEVEL -u MFLAGS SOURCE_DATE_EPOCH="$EPOCH" "${MAKE_VARS[@]}" \
                make -C "$SRC_DIR" O="$KDIR/build" "$@"
        }
        build_kernel() {
            mkdir -p "$KDIR/build"
            rm -f "$KDIR/key" "$KDIR/Image" "$KDIR/kernel.release"
            kmake KCONFIG_ALLCONFIG="$EFF_FRAGMENT" allnoconfig
            "$GUEST_DIR/check-config.sh" "$EFF_FRAGMENT" "$KDIR/build/.config" "$SRC_DIR"
            kmake -j"$JOBS" Image
            cp "$KDIR/build/arch/arm64/boot/Image" "$KDIR/Image"
            cp "$KDIR/build/include/config/kernel.release" "$KDIR/kernel.release"
            echo "$KERNEL_KEY" >"$KDIR/key"
        }
        run_stage kernel "building $KERNEL_SRC_PKG $SRC_VERSION, $PAGE_SIZE pages, -j$JOBS" build_kernel
    fi
    KERNEL_RELEASE=$(cat "$KDIR/kernel.release")
fi

# ---------------------------------------------------------------- rootfs
build_rootfs() {
    local deb=$WORK/deb root=$WORK/root img=$WORK/rootfs.ext4 bb
    dpkg-deb -x "$BB_DEB" "$deb"
    bb=$deb/bin/busybox
    [[ -f $bb ]] || { echo "no bin/busybox in $BB_DEB"; return 1; }
    # ELF, 64-bit, little-endian, e_machine 183 (aarch64).
    [[ $(od -An -tx1 -N6 "$bb" | tr -d ' \n') == 7f454c460201 ]] || { echo "busybox is not ELF64 LE"; return 1; }
    [[ $(od -An -tu2 -j18 -N2 "$bb" | tr -d ' ') == 183 ]] || { echo "busybox is not aarch64"; return 1; }

    install -d -m 0755 "$root" "$root"/{bin,dev,etc,etc/init.d,etc/udhcpc,mnt,proc,run,sys,usr,var}
    install -d -m 0700 "$root/root"
    install -d -m 1777 "$root/tmp"
    install -m 0755 "$bb" "$root/bin/busybox"
    ln -s bin "$root/sbin"
    ln -s ../bin "$root/usr/bin"
    ln -s ../bin "$root/usr/sbin"
    ln -s ../run "$root/var/run"

    # Applet names: busybox's own NUL-separated, sorted name table, which starts "[\0[[\0".
    local off
    off=$(grep -m1 -obUaP '\[\x00\[\[\x00' "$bb" | cut -d: -f1)
    [[ -n $off ]] || { echo "applet name table not found in busybox"; return 1; }
    dd if="$bb" iflag=skip_bytes,count_bytes skip="$off" count=65536 status=none \
        | tr '\0' '\n' | awk 'done { next } /^$/ { done = 1; next } { print }' >"$WORK/applets"
    grep -vqE '^[][a-z0-9_.-]+$' "$WORK/applets" && { echo "unexpected applet name in table"; return 1; }
    sort -c "$WORK/applets" || { echo "applet table not sorted: wrong table?"; return 1; }
    local a
    for a in init sh getty login mount devmem poweroff reboot hostname od ifconfig route udhcpc ip wget sha256sum httpd; do
        grep -qx -- "$a" "$WORK/applets" || { echo "busybox lacks applet $a"; return 1; }
    done
    echo "$(wc -l <"$WORK/applets") applets"
    while read -r a; do
        [[ $a == busybox ]] || ln -s busybox "$root/bin/$a"
    done <"$WORK/applets"

    # Our tools: static, stripped, with no build ID or build paths in them.
    local t
    for t in vsock ignition-agent; do
        "${CROSS_COMPILE}gcc" -static -O2 -Wall -Wextra -Werror -ffile-prefix-map="$GUEST_DIR"=. \
            -Wl,--build-id=none -o "$WORK/$t" "$GUEST_DIR/tools/$t.c"
        "${CROSS_COMPILE}strip" "$WORK/$t"
        install -m 0755 "$WORK/$t" "$root/bin/$t"
    done

    # Config files from guest/rootfs/, with explicit modes.
    local f mode
    while read -r f mode; do
        install -m "$mode" "$GUEST_DIR/rootfs/$f" "$root/$f"
    done <<'EOF'
bin/getconf 0755
etc/init.d/rcS 0755
etc/udhcpc/default.script 0755
etc/inittab 0644
etc/passwd 0644
etc/shadow 0600
etc/group 0644
etc/hostname 0644
etc/hosts 0644
etc/profile 0644
EOF
    find "$root" -exec touch -h -d "@$EPOCH" {} +

    # Sorted directory traversal in mkfs -d needs LC_ALL=C (set above).
    MKE2FS_CONFIG=$GUEST_DIR/mke2fs.conf E2FSPROGS_FAKE_TIME=$EPOCH SOURCE_DATE_EPOCH=$EPOCH \
        mkfs.ext4 -F -t ext4 -T default -L "$ROOTFS_LABEL" -U "$ROOTFS_UUID" \
        -E "hash_seed=$ROOTFS_HASH_SEED,root_owner=0:0" -d "$root" "$img" "$ROOTFS_SIZE"

    # mkfs copies the builder's uid/gid and the staging ctimes: pin every inode.
    {
        echo "/"
        echo "/lost+found"
        (cd "$root" && find . -mindepth 1 | sed 's|^\.||' | sort)
    } | while read -r f; do
        for field in uid gid; do echo "sif \"$f\" $field 0"; done
        for field in atime mtime ctime crtime; do
            echo "sif \"$f\" $field @$EPOCH"
            echo "sif \"$f\" ${field}_extra 0"
        done
    done >"$WORK/pin.debugfs"
    E2FSPROGS_FAKE_TIME=$EPOCH debugfs -w -f "$WORK/pin.debugfs" "$img" >"$WORK/debugfs.out" 2>&1
    if grep -vE '^(debugfs [0-9.]+ \(|debugfs: )' "$WORK/debugfs.out" | grep -q .; then
        echo "debugfs reported errors:"; grep -vE '^debugfs: ' "$WORK/debugfs.out"; return 1
    fi
    e2fsck -fn "$img"
    mv "$img" "$OUT_DIR/rootfs.ext4.tmp"
    mv "$OUT_DIR/rootfs.ext4.tmp" "$OUT_DIR/rootfs.ext4"
}
run_stage rootfs "building rootfs.ext4 from $BUSYBOX_PKG $BB_VERSION" build_rootfs

if [[ $ROOTFS_ONLY == 1 ]]; then
    say "done: $OUT_DIR/rootfs.ext4"
    exit 0
fi

# ---------------------------------------------------------------- conformance images
run_stage conformance "building the conformance test images into $OUT_DIR/conformance" \
    "$GUEST_DIR/conformance/build.sh" --out "$OUT_DIR/conformance"

# ---------------------------------------------------------------- outputs
install -m 0644 "$KDIR/Image" "$OUT_DIR/Image.tmp"
mv "$OUT_DIR/Image.tmp" "$OUT_DIR/Image"

sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
# Keys in sorted order at every level; all values are plain ASCII without quotes.
cat >"$OUT_DIR/guest.json.tmp" <<EOF
{
  "compiler": "$CC_VERSION",
  "files": {
    "Image": {
      "sha256": "$(sha "$OUT_DIR/Image")",
      "size": $(size "$OUT_DIR/Image")
    },
    "rootfs.ext4": {
      "sha256": "$(sha "$OUT_DIR/rootfs.ext4")",
      "size": $(size "$OUT_DIR/rootfs.ext4")
    }
  },
  "fragment_sha256": "$FRAGMENT_SHA",
  "kernel_version": "$KERNEL_RELEASE",
  "packages": {
    "$BUSYBOX_PKG": "$BB_VERSION",
    "e2fsprogs": "$(pkg_version e2fsprogs)",
    "$CC_PKG": "$(pkg_version "$CC_PKG")",
    "$LIBC_PKG": "$(pkg_version "$LIBC_PKG")",
    "$KERNEL_SRC_PKG": "$SRC_VERSION"
  },
  "page_size": "$PAGE_SIZE",
  "page_size_bytes": $PAGE_BYTES,
  "rootfs_uuid": "$ROOTFS_UUID",
  "source_date_epoch": $EPOCH
}
EOF
mv "$OUT_DIR/guest.json.tmp" "$OUT_DIR/guest.json"
say "done: $OUT_DIR/{Image,rootfs.ext4,guest.json} (kernel $KERNEL_RELEASE, $PAGE_SIZE pages)"
