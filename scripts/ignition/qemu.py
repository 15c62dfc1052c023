"""The reference boot: the same guest under qemu-system-aarch64 (TCG), not our VMM."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from . import guest

QEMU = "qemu-system-aarch64"
ACCELS = ("tcg", "hvf")
"""QEMU's accelerators the harness runs the reference with: TCG anywhere, Hypervisor.framework on a Mac."""
# Nothing is mapped at the boot-timer address under QEMU, so the poke is off.
DEFAULT_APPEND = "console=ttyAMA0 root=/dev/vda rw boottimer=off"


def qemu_argv(
    kernel: os.PathLike[str] | str,
    disk: os.PathLike[str] | str,
    cpus: int = 1,
    mem_mib: int = 512,
    append: str = DEFAULT_APPEND,
    cpu: str = "max",
    qemu: str = QEMU,
    net_socket: os.PathLike[str] | str | None = None,
    accel: str = "tcg",
    initrd: os.PathLike[str] | str | None = None,
) -> list[str]:
    """QEMU command line: virt + GICv3, PL011 on stdio, virtio-mmio v2 block device, with
    `initrd` that initramfs, and with `net_socket` a virtio-mmio network device on that stream
    socket (passt), in the second transport as in Ignition. `accel` "hvf" runs it on Hypervisor.framework (a Mac:
    the host's CPU, `cpu` ignored; no high memory map, which needs more IPA bits than
    Apple's cores give a VM); "tcg" is QEMU's software CPU."""
    if accel not in ACCELS:
        raise ValueError(f"accel {accel!r} is not one of {', '.join(ACCELS)}")
    machine = "virt,gic-version=3" + (",highmem=off" if accel == "hvf" else "")
    cpu_args = ["-accel", "hvf", "-cpu", "host"] if accel == "hvf" else ["-cpu", cpu]
    net = (
        []
        if net_socket is None
        else [
            "-netdev",
            f"stream,id=n0,server=off,addr.type=unix,addr.path={net_socket}",
            "-device",
            "virtio-net-device,netdev=n0,bus=virtio-mmio-bus.1",
        ]
    )
    return [
        qemu,
        "-M",
        machine,
        *cpu_args,
        "-smp",
        str(cpus),
        "-m",
        str(mem_mib),
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(kernel),
        "-append",
        append,
        *([] if initrd is None else ["-initrd", str(initrd)]),
        "-global",
        "virtio-mmio.force-legacy=false",
        "-drive",
        f"if=none,file={disk},format=raw,id=hd0",
        # bus 0 = the first transport, 0x0a000000 (unqualified: the last one).
        "-device",
        "virtio-blk-device,drive=hd0,bus=virtio-mmio-bus.0",
        *net,
    ]


def default_accel() -> str:
    """The accelerator the harness compares against: hvf on macOS/aarch64, else TCG."""
    from . import timeouts

    return "hvf" if timeouts.default_backend() == "hvf" else "tcg"


def check_inputs(kernel: Path, disk: Path, qemu: str = QEMU) -> str | None:
    """An error message if QEMU or the guest files are missing, else None."""
    if shutil.which(qemu) is None:
        return f"{qemu} not found (Debian package qemu-system-arm; on a Mac: brew install qemu)"
    return guest.missing(kernel, disk)
