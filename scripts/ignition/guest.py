"""The guest that guest/build.sh builds: its files, private disk copies, in-guest probes."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


def missing(kernel: Path, disk: Path) -> str | None:
    """An error message if the kernel or the disk is not a file, else None."""
    for f in (kernel, disk):
        if not f.is_file():
            return f"{f} not found; build the guest first: guest/build.sh"
    return None


@contextlib.contextmanager
def disk_copy(disk: os.PathLike[str] | str) -> Iterator[Path]:
    """A temporary copy of disk, removed afterwards (the guest writes its root disk)."""
    with tempfile.TemporaryDirectory(prefix="ignition-qemu-") as tmp:
        copy = Path(tmp) / Path(disk).name
        shutil.copyfile(disk, copy)
        yield copy


def cpu_busy_ticks(run: Callable[[str], str]) -> dict[str, int]:
    """user+nice+system ticks (USER_HZ) per CPU from the guest's /proc/stat: {"cpu0": N, ...};
    `run` runs a guest shell command and returns its output (Vm.sh, Vm.run)."""
    ticks = {}
    for line in run("grep '^cpu[0-9]' /proc/stat").splitlines():
        name, user, nice, system, *_ = line.split()
        ticks[name] = int(user) + int(nice) + int(system)
    return ticks
