"""Debian's stock arm64 cloud kernel as an Ignition guest: its Image, and an initramfs with
the modules Ignition's devices need, made on the host without running anything arm64.

    python3 -m ignition.debian_guest --out guest/out/debian

writes, in the output directory:

    Image              the kernel of linux-image-cloud-arm64's current version (4 KiB pages)
    initrd.cpio        busybox, the modules (virtio_mmio, virtio_blk, virtio_net,
                       vmw_vsock_virtio_transport and what they depend on) and an /init that
                       loads them, mounts /dev/vda and switches to its /sbin/init
    debian-guest.json  the package and version, the kernel release, the page size, the modules
                       in load order, and each file's sha256

Boot it on the project's root disk (its init, getty and guest agent), with boot's default
command line (`root=` is the initramfs's business; its init writes the boot timer):

    boot --kernel guest/out/debian/Image --initrd guest/out/debian/initrd.cpio

The packages come from apt (`apt-get download`, arm64 a dpkg foreign architecture: run
`dpkg --add-architecture arm64 && apt-get update` once), kept in the cache directory
($XDG_CACHE_HOME/ignition-guest/debian).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from . import initrd

METAPACKAGE = "linux-image-cloud-arm64"
BUSYBOX = "busybox-static"
MODULES = ("virtio_mmio", "virtio_blk", "virtio_net", "vmw_vsock_virtio_transport")
"""The modules Ignition's devices need (Debian builds them as modules); their dependencies too."""

INIT = """\
for m in {modules}; do
    insmod /lib/modules/$m.ko || echo "initrd: insmod $m failed"
done
mount -t devtmpfs devtmpfs /dev
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
mkdir -p /newroot
mount -t ext4 -o rw /dev/vda /newroot || {{ echo "initrd: cannot mount /dev/vda"; poweroff -f; }}
umount /proc /sys
mount --move /dev /newroot/dev
exec switch_root /newroot /sbin/init
"""


class DebianGuestError(Exception):
    """Something the host lacks (apt's arm64 packages) or a package that is not as expected."""


def cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "ignition-guest" / "debian"


def _apt(*args: str) -> str:
    r = subprocess.run(["apt-cache", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise DebianGuestError(f"apt-cache {' '.join(args)}: {r.stderr.strip()}")
    return r.stdout


def resolve() -> tuple[str, str]:
    """The versioned kernel package the metapackage depends on now, and its version."""
    deps = re.findall(r"Depends: (linux-image-[^\s:]+)", _apt("depends", f"{METAPACKAGE}:arm64"))
    if not deps:
        raise DebianGuestError(
            f"apt knows no {METAPACKAGE}:arm64: run `dpkg --add-architecture arm64 && apt-get update`"
        )
    return deps[0], package_version(deps[0])


def package_version(package: str) -> str:
    m = re.search(r"^Version: (\S+)", _apt("show", "--no-all-versions", f"{package}:arm64"), re.M)
    if not m:
        raise DebianGuestError(f"apt-cache show {package}:arm64 gives no version")
    return m.group(1)


def download(package: str, version: str, cache: Path) -> Path:
    """The package's .deb in the cache, fetched with apt-get download if missing."""
    cache.mkdir(parents=True, exist_ok=True)
    quoted = version.replace(":", "%3a")
    for deb in cache.glob(f"{package}_*_arm64.deb"):
        if deb.name == f"{package}_{quoted}_arm64.deb":
            return deb
    r = subprocess.run(["apt-get", "download", f"{package}:arm64={version}"], cwd=cache, capture_output=True, text=True)
    debs = list(cache.glob(f"{package}_{quoted}_arm64.deb"))
    if r.returncode != 0 or not debs:
        raise DebianGuestError(f"apt-get download {package}:arm64={version} failed: {r.stderr.strip()}")
    return debs[0]


def modinfo(ko: bytes) -> dict[str, str]:
    """A kernel module's .modinfo section (key=value strings, NUL-separated), read from its
    ELF64 little-endian section table."""
    if ko[:6] != b"\x7fELF\x02\x01":
        raise DebianGuestError("a module is not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", ko, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", ko, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", ko, shoff + i * shentsize)
        return name, offset, size

    _, stroff, _ = section(shstrndx)
    for i in range(shnum):
        name, offset, size = section(i)
        end = ko.index(b"\0", stroff + name)
        if ko[stroff + name : end] == b".modinfo":
            info: dict[str, str] = {}
            for entry in ko[offset : offset + size].split(b"\0"):
                key, sep, value = entry.decode(errors="replace").partition("=")
                if sep:
                    info.setdefault(key, value)
            return info
    raise DebianGuestError("a module has no .modinfo section")


def module_closure(root: Path, names: tuple[str, ...]) -> list[tuple[str, Path]]:
    """`names` and their dependencies (modinfo `depends`), each after what it depends on, as
    (name, path of its .ko under root/lib/modules)."""
    paths = {p.name.removesuffix(".ko").replace("-", "_"): p for p in (root / "lib" / "modules").rglob("*.ko")}
    order: list[tuple[str, Path]] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        if name not in paths:
            raise DebianGuestError(f"module {name} is not in the kernel package")
        for dep in filter(None, modinfo(paths[name].read_bytes()).get("depends", "").split(",")):
            visit(dep)
        order.append((name, paths[name]))

    for n in names:
        visit(n)
    return order


def page_size(image: bytes) -> int | None:
    """The page size an arm64 Image header's flags (bits 1-2) give."""
    flags = struct.unpack_from("<Q", image, 0x18)[0]
    return {1: 4096, 2: 16384, 3: 65536}.get((flags >> 1) & 3)


def build(out: Path, cache: Path) -> dict[str, object]:
    """Writes Image, initrd.cpio and debian-guest.json into out; returns the record."""
    package, version = resolve()
    kernel_deb = download(package, version, cache)
    busybox_deb = download(BUSYBOX, package_version(BUSYBOX), cache)
    with tempfile.TemporaryDirectory(prefix="ignition-debian-") as d:
        kroot, broot = Path(d) / "kernel", Path(d) / "busybox"
        for deb, root in ((kernel_deb, kroot), (busybox_deb, broot)):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
        vmlinuz = sorted((kroot / "boot").glob("vmlinuz-*"))
        if len(vmlinuz) != 1:
            raise DebianGuestError(f"{kernel_deb.name} has {len(vmlinuz)} kernels in /boot, not one")
        release = vmlinuz[0].name.removeprefix("vmlinuz-")
        modules = module_closure(kroot, MODULES)
        busybox = (broot / "bin" / "busybox").read_bytes()
        image = vmlinuz[0].read_bytes()
        script = INIT.format(modules=" ".join(name for name, _ in modules))
        cpio = initrd.busybox_initrd(
            busybox,
            script,
            [
                initrd.directory("lib"),
                initrd.directory("lib/modules"),
                *(initrd.file(f"lib/modules/{name}.ko", path.read_bytes()) for name, path in modules),
            ],
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "Image").write_bytes(image)
    (out / "initrd.cpio").write_bytes(cpio)
    record: dict[str, object] = {
        "package": package,
        "version": version,
        "kernel_release": release,
        "page_size_bytes": page_size(image),
        "modules": [name for name, _ in modules],
        "busybox": package_version(BUSYBOX),
        "files": {
            name: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in (("Image", image), ("initrd.cpio", cpio))
        },
    }
    (out / "debian-guest.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ignition.debian_guest", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--cache", type=Path, default=None, help="where the .deb files are kept")
    args = p.parse_args(argv)
    if shutil.which("apt-get") is None:
        print("debian_guest: needs Debian's apt-get and dpkg-deb", file=sys.stderr)
        return 1
    try:
        record = build(args.out, args.cache or cache_dir())
    except DebianGuestError as e:
        print(f"debian_guest: {e}", file=sys.stderr)
        return 1
    print(f"{args.out}: {record['package']} {record['version']} ({record['kernel_release']})")
    modules = record["modules"]
    assert isinstance(modules, list)
    print(f"modules: {' '.join(modules)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
