"""Initramfs archives for `boot --initrd`: the cpio "newc" format the Linux
kernel unpacks (Documentation/driver-api/early-userspace/buffer-format.rst),
written from Python, and a busybox initramfs made from the guest's root disk.

    write_busybox_initrd(paths.ROOTFS, "out.cpio", "echo hello; poweroff -f")
"""

from __future__ import annotations

import os
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

NEWC_MAGIC = b"070701"
TRAILER = "TRAILER!!!"


@dataclass(frozen=True)
class Entry:
    """One archive member: `name` relative to / (no leading slash), its mode (type and
    permission bits), its contents (regular files and symbolic links' targets), and for
    device nodes their major and minor number."""

    name: str
    mode: int
    data: bytes = b""
    rdev: tuple[int, int] = (0, 0)


def directory(name: str, perm: int = 0o755) -> Entry:
    return Entry(name, stat.S_IFDIR | perm)


def file(name: str, data: bytes, perm: int = 0o644) -> Entry:
    return Entry(name, stat.S_IFREG | perm, data)


def symlink(name: str, target: str) -> Entry:
    return Entry(name, stat.S_IFLNK | 0o777, target.encode())


def char_device(name: str, major: int, minor: int, perm: int = 0o600) -> Entry:
    return Entry(name, stat.S_IFCHR | perm, rdev=(major, minor))


def _pad4(n: int) -> bytes:
    return b"\0" * (-n % 4)


def newc(entries: Iterable[Entry]) -> bytes:
    """The entries as a newc cpio archive (owner root, mtime 0, one link each), ended by the
    trailer. Directories must come before what they hold (the kernel creates as it reads)."""
    out = bytearray()
    members = [*entries, Entry(TRAILER, 0)]
    for ino, e in enumerate(members, start=1):
        name = e.name.encode() + b"\0"
        fields = [
            ino if e.name != TRAILER else 0,
            e.mode,
            0,  # uid
            0,  # gid
            2 if stat.S_ISDIR(e.mode) else 1,  # nlink
            0,  # mtime
            len(e.data),
            0,  # devmajor
            0,  # devminor
            e.rdev[0],
            e.rdev[1],
            len(name),
            0,  # check (newc has no checksum)
        ]
        header = NEWC_MAGIC + b"".join(b"%08X" % f for f in fields)
        out += header + name + _pad4(len(header) + len(name))
        out += e.data + _pad4(len(e.data))
    return bytes(out)


def busybox_from_rootfs(rootfs: os.PathLike[str] | str) -> bytes:
    """The guest's static aarch64 busybox, read from its ext4 root disk with e2fsprogs'
    debugfs (no mount)."""
    with tempfile.TemporaryDirectory(prefix="ignition-initrd-") as d:
        out = Path(d) / "busybox"
        r = subprocess.run(["debugfs", "-R", f"dump /bin/busybox {out}", str(rootfs)], capture_output=True, text=True)
        if r.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
            raise RuntimeError(f"cannot read /bin/busybox from {rootfs} with debugfs: {r.stderr.strip()}")
        return out.read_bytes()


def busybox_initrd(busybox: bytes, script: str, extra: Iterable[Entry] = ()) -> bytes:
    """An initramfs whose /init is `script` run by busybox sh (with every applet linked into
    /bin first, and /proc and /sys mounted), with /dev/console, and `extra` members."""
    init = (
        "#!/bin/busybox sh\n"
        "/bin/busybox --install -s /bin\n"
        "export PATH=/bin\n"
        "mount -t proc proc /proc\n"
        "mount -t sysfs sysfs /sys\n"
        f"{script}\n"
    )
    return newc(
        [
            directory("bin"),
            file("bin/busybox", busybox, 0o755),
            directory("dev"),
            char_device("dev/console", 5, 1),
            directory("proc"),
            directory("sys"),
            file("init", init.encode(), 0o755),
            *extra,
        ]
    )
