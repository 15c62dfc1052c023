"""Benchmark (not a test): boot to ready for each kind of guest, on Ignition and on QEMU TCG.

Each guest boots --runs times on each VMM, a run of one then a run of the other (so load falls
on both alike), each on a fresh copy of its disk, with --mem MiB and one vCPU. Every time is
from the VMM's spawn to a line on the guest's console:

- **ready** (both VMMs): the guest's readiness marker, the same line on both: `login:` on the
  project's root disk (its busybox init has run rcS and started getty and the guest agent), and
  `init: ready` (image.READY_LINE) on the Debian and OCI root disks (ignition.image's init
  prints it once it has mounted, configured the network, written the boot timer and started
  the agent, just before the image's command runs);
- **guest boot** (Ignition): the init's boot-timer write (`Guest-boot-time`);
- **agent** (Ignition): the guest agent answered (`Agent-ready-time`; QEMU's machine has no
  vsock device here, so its agent never does);
- **first exec** (Ignition): a first command through the agent has returned (`true`, or
  `python3 -c pass` where the guest has Python).

QEMU is `qemu-system-aarch64 -M virt,gic-version=3 -cpu max` (TCG) with the same kernel,
initramfs and disk (a virtio-mmio block device), the same memory and `boot`'s command line
but `boottimer=off` (nothing is mapped at the boot-timer address there); no vsock, no network.
`--qemu-cpu` (repeatable) gives other CPU models, one QEMU column each: `max` has pointer
authentication with the QARMA5 algorithm, slow in TCG, which Debian's kernel uses and
Ignition's emu CPU (a Cortex-A72) lacks; `max,pauth=off` leaves it out.

The guests:

- `project`: guest/out's kernel (16 KiB pages, everything built in) and busybox root disk;
- `debian-kernel`: Debian's stock cloud kernel (4 KiB pages) and the initramfs of
  ignition.debian_guest, on the project's root disk;
- `debian`: the same kernel and initramfs on ignition.debian_rootfs's Debian root disk;
- `oci` (with --image REF): the project's kernel on the root file system ignition.image builds
  of REF, whose build is also timed cold (an empty cache, the blobs pulled) and cached.

The host's load (os.getloadavg()) is printed and recorded at the start and the end: a figure
taken on a loaded machine says so. Prints a table and writes bench-results/guests.json.

    python3 -m ignition.bench.guests --runs 5 --image localhost:5000/test/python:v1 --plain-http
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ignition import console, debian_guest, debian_rootfs, host, image, loglines, paths, qemu, timeouts
from ignition.stats import stats, write_report
from ignition.vm import Vm, VmConfig

QEMU_APPEND = "console=ttyAMA0 earlycon=pl011,mmio32,0x9000000 root=/dev/vda rw rootwait boottimer=off"
"""`boot`'s default command line with the boot timer off."""


@dataclasses.dataclass
class Guest:
    """One row: a kernel, an initramfs or none, a root disk and its readiness marker."""

    name: str
    kernel: Path
    initrd: Path | None
    disk: Path
    marker: str
    """A regular expression for the console line that means ready."""
    probe: list[str]
    """The first command through the agent."""


def ignition_once(cfg: VmConfig, g: Guest, mem: int, work: Path, log: Path) -> dict[str, float]:
    """One boot on Ignition: ms from spawn to each console line, and to the first exec."""
    copy = work / "disk.ext4"
    shutil.copyfile(g.disk, copy)
    extra = [] if g.initrd is None else ["--initrd", str(g.initrd)]
    cfg = dataclasses.replace(cfg, kernel=g.kernel)
    with Vm.boot(cfg, disk=copy, mem=mem, cpus=1, agent=True, extra=extra, log_path=log) as vm:
        # The three lines in whatever order they come, each timed as it is matched.
        wanted = {
            "guest_boot_ms": loglines.GUEST_BOOT_TIME,
            "ready_ms": g.marker,
            "agent_ms": loglines.AGENT_READY_TIME,
        }
        seen: dict[str, float] = {}
        while len(seen) < len(wanted):
            left = [k for k in wanted if k not in seen]
            i = vm.expect([wanted[k] for k in left], f"{', '.join(left)} of {g.name}", vm.timeouts.boot)
            seen[left[i]] = (time.perf_counter() - vm.t_spawn) * 1000
        vm.wait_ready()
        vm.exec(g.probe).check()
        seen["first_exec_ms"] = (time.perf_counter() - vm.t_spawn) * 1000
        vm.quit()
    copy.unlink()
    return seen


def qemu_once(g: Guest, cpu: str, mem: int, work: Path, log: Path, timeout: float) -> float:
    """One boot on QEMU TCG with CPU model `cpu`: ms from spawn to the readiness marker."""
    copy = work / "disk.ext4"
    shutil.copyfile(g.disk, copy)
    argv = qemu.qemu_argv(g.kernel, copy, 1, mem, QEMU_APPEND, cpu=cpu, initrd=g.initrd)
    t = console.time_to_login(argv, timeout=timeout, pattern=g.marker, log_path=log)
    copy.unlink()
    return t * 1000


def measure(g: Guest, runs: int, cfg: VmConfig, mem: int, work: Path, qemu_cpus: list[str]) -> dict[str, Any]:
    """--runs boots of `g` on Ignition and on QEMU with each CPU model, alternating; medians,
    minima and maxima in ms."""
    logs = paths.RESULTS_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    qemu_timeout = timeouts.for_backend("qemu").boot
    ign: list[dict[str, float]] = []
    qem: dict[str, list[float]] = {cpu: [] for cpu in qemu_cpus}
    load_start = os.getloadavg()
    for i in range(runs):
        ign.append(ignition_once(cfg, g, mem, work, logs / f"guests-{g.name}-ignition-{i + 1}.log"))
        line = f"{g.name} run {i + 1}/{runs}: ignition ready {ign[-1]['ready_ms']:.0f} ms"
        for cpu, times in qem.items():
            log = logs / f"guests-{g.name}-qemu-{cpu.replace(',', '-').replace('=', '-')}-{i + 1}.log"
            times.append(qemu_once(g, cpu, mem, work, log, qemu_timeout))
            line += f", qemu -cpu {cpu} ready {times[-1]:.0f} ms"
        print(line, flush=True)
    row: dict[str, Any] = {
        "guest": g.name,
        "marker": g.marker,
        "ignition": {k: stats([s[k] for s in ign], 0) for k in ign[0]},
        "loadavg_start": load_start,
        "loadavg_end": os.getloadavg(),
    }
    ready = statistics.median(s["ready_ms"] for s in ign)
    row["qemu_tcg"] = {
        cpu: {"ready_ms": stats(times, 0), "ratio_ready_ignition_to_qemu": round(ready / statistics.median(times), 2)}
        for cpu, times in qem.items()
    }
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.guests",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=5, help="boots per guest and VMM (default: 5)")
    p.add_argument("--mem", type=int, default=256, help="guest RAM, MiB (default: 256)")
    p.add_argument("--boot", type=Path, default=paths.DEFAULT_BOOT, help="the boot binary")
    p.add_argument("--backend", choices=["emu", "hvf"], help="Ignition's backend (default: boot's)")
    p.add_argument("--image", help="an OCI image reference with python3 (REGISTRY/REPOSITORY:TAG) for the oci row")
    p.add_argument("--plain-http", action="store_true", help="the image's registry speaks plain HTTP")
    p.add_argument("--no-debian", action="store_true", help="skip the Debian rows (no apt)")
    p.add_argument("--no-qemu", action="store_true", help="Ignition only")
    p.add_argument(
        "--qemu-cpu",
        action="append",
        metavar="MODEL",
        help="QEMU's -cpu, repeatable: a column each (default: max)",
    )
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "guests.json")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error("--runs must be >= 1")
    qemu_cpus = [] if a.no_qemu else (a.qemu_cpu or ["max"])
    if qemu_cpus and shutil.which(qemu.QEMU) is None:
        print(f"bench.guests: {qemu.QEMU} not found (or --no-qemu)", file=sys.stderr)
        return 1
    cfg = VmConfig(boot=a.boot, backend=a.backend)
    load_start = os.getloadavg()
    login, ready = console.LOGIN, re.escape(image.READY_LINE)
    rows = []
    extra: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ignition-bench-guests-") as d:
        work = Path(d)
        guests = [Guest("project", paths.KERNEL, None, paths.ROOTFS, login, ["true"])]
        if not a.no_debian:
            deb = work / "debian"
            record = debian_guest.build(deb, debian_guest.cache_dir())
            debian_rootfs.build(deb, debian_guest.cache_dir())
            extra["debian_kernel_release"] = record["kernel_release"]
            kernel, initrd = deb / "Image", deb / "initrd.cpio"
            guests.append(Guest("debian-kernel", kernel, initrd, paths.ROOTFS, login, ["true"]))
            guests.append(Guest("debian", kernel, initrd, deb / "rootfs.ext4", ready, ["true"]))
        if a.image:
            disk = work / "oci.ext4"
            t0 = time.perf_counter()
            image.build(a.image, disk, plain_http=a.plain_http, cache=work / "cache")
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            assert image.build(a.image, disk, plain_http=a.plain_http, cache=work / "cache").cached
            cached = time.perf_counter() - t0
            extra["oci_build_cold_ms"], extra["oci_build_cached_ms"] = round(cold * 1000), round(cached * 1000)
            extra["oci_disk_mib"] = disk.stat().st_size >> 20
            guests.append(Guest("oci", paths.KERNEL, None, disk, ready, ["python3", "-c", "pass"]))
        for g in guests:
            rows.append(measure(g, a.runs, cfg, a.mem, work, qemu_cpus))
    load_end = os.getloadavg()
    head = f"{'guest':<14} {'ignition ready':>14} "
    head += "".join(f"{'qemu ' + cpu:>20} {'ratio':>6} " for cpu in qemu_cpus)
    lines = [head + f"{'guest boot':>10} {'agent':>7} {'first exec':>10}   (ready, ms, medians of {a.runs})"]
    for r in rows:
        ig = r["ignition"]
        line = f"{r['guest']:<14} {ig['ready_ms']['median']:>14.0f} "
        for q in r["qemu_tcg"].values():
            line += f"{q['ready_ms']['median']:>20.0f} {q['ratio_ready_ignition_to_qemu']:>6.2f} "
        line += f"{ig['guest_boot_ms']['median']:>10.0f} {ig['agent_ms']['median']:>7.0f} "
        lines.append(line + f"{ig['first_exec_ms']['median']:>10.0f}")
    if "oci_build_cold_ms" in extra:
        lines.append(f"oci image build: cold {extra['oci_build_cold_ms']} ms, cached {extra['oci_build_cached_ms']} ms")
    lines.append(f"load average (1, 5, 15 min): start {load_start}, end {load_end}")
    result = {
        "benchmark": "guests_boot_to_ready",
        "host": host.summary(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": load_start,
        "loadavg_end": load_end,
        "mem_mib": a.mem,
        "runs": a.runs,
        "qemu_append": QEMU_APPEND,
        "qemu_cpus": qemu_cpus,
        "rows": rows,
        **extra,
    }
    write_report(a.out, result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
