"""Benchmark (not a test): boot to ready for each kind of guest Ignition runs.

Each guest boots --runs times (a fresh copy of its disk each time, --mem MiB, the guest agent on
vsock), timed from `boot`'s spawn to

- **guest boot**: the init's boot-timer write (`Guest-boot-time`, from boot's own clock);
- **ready**: the guest agent answered (Vm.wait_ready);
- **first exec**: a first command through the agent has returned (`true`, or `python3 -c pass`
  where the guest has Python).

The guests:

- `project`: guest/out's kernel (16 KiB pages, everything built in) and busybox root disk;
- `debian-kernel`: Debian's stock cloud kernel (4 KiB pages) and the initramfs of
  ignition.debian_guest, on the project's root disk;
- `debian`: the same kernel and initramfs on ignition.debian_rootfs's Debian root disk;
- `oci` (with --image REF): the project's kernel on the root file system ignition.image builds
  of REF, whose build is also timed cold (an empty cache, the blobs pulled) and cached.

Prints a table and writes bench-results/guests.json.

    python3 -m ignition.bench.guests --runs 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ignition import debian_guest, debian_rootfs, host, image, paths
from ignition.stats import stats
from ignition.vm import Vm, VmConfig


def boot_once(cfg: VmConfig, disk: Path, mem: int, extra: list[str], probe: list[str], work: Path) -> dict[str, float]:
    copy = work / "disk.ext4"
    shutil.copyfile(disk, copy)
    with Vm.boot(cfg, disk=copy, mem=mem, agent=True, extra=extra, log_path=work / "console.log") as vm:
        guest_ms = vm.guest_boot_time_ms()
        vm.wait_ready()
        ready = time.perf_counter() - vm.t_spawn
        vm.exec(probe).check()
        first = time.perf_counter() - vm.t_spawn
        vm.quit()
    copy.unlink()
    return {"guest_boot_ms": guest_ms, "ready_ms": ready * 1000, "first_exec_ms": first * 1000}


def measure(name: str, runs: int, *args: Any) -> dict[str, Any]:
    samples = [boot_once(*args) for _ in range(runs)]
    row: dict[str, Any] = {"guest": name}
    for k in samples[0]:
        row[k] = stats([s[k] for s in samples], 0)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ignition.bench.guests", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--mem", type=int, default=256, help="guest RAM, MiB")
    p.add_argument("--image", help="an OCI image reference with python3 (REGISTRY/REPOSITORY:TAG) for the oci row")
    p.add_argument("--plain-http", action="store_true", help="the image's registry speaks plain HTTP")
    p.add_argument("--no-debian", action="store_true", help="skip the Debian rows (no apt)")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "guests.json")
    a = p.parse_args(argv)
    cfg = VmConfig(boot=paths.boot_bin())
    rows = []
    with tempfile.TemporaryDirectory(prefix="ignition-bench-guests-") as d:
        work = Path(d)
        rows.append(measure("project", a.runs, cfg, paths.ROOTFS, a.mem, [], ["true"], work))
        if not a.no_debian:
            deb = work / "debian"
            record = debian_guest.build(deb, debian_guest.cache_dir())
            debian_rootfs.build(deb, debian_guest.cache_dir())
            dcfg = dataclasses.replace(cfg, kernel=deb / "Image")
            extra = ["--initrd", str(deb / "initrd.cpio")]
            rows.append(measure("debian-kernel", a.runs, dcfg, paths.ROOTFS, a.mem, extra, ["true"], work))
            rows.append(measure("debian", a.runs, dcfg, deb / "rootfs.ext4", a.mem, extra, ["true"], work))
            rows[-1]["kernel_release"] = rows[-2]["kernel_release"] = record["kernel_release"]
        if a.image:
            disk = work / "oci.ext4"
            t0 = time.perf_counter()
            image.build(a.image, disk, plain_http=a.plain_http, cache=work / "cache")
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            assert image.build(a.image, disk, plain_http=a.plain_http, cache=work / "cache").cached
            cached = time.perf_counter() - t0
            row = measure("oci", a.runs, cfg, disk, a.mem, [], ["python3", "-c", "pass"], work)
            row["build_cold_ms"], row["build_cached_ms"] = round(cold * 1000), round(cached * 1000)
            row["disk_mib"] = disk.stat().st_size >> 20
            rows.append(row)
    print(f"{'guest':<14} {'guest boot ms':>14} {'ready ms':>10} {'first exec ms':>14}")
    for r in rows:
        print(
            f"{r['guest']:<14} {r['guest_boot_ms']['median']:>14.0f} {r['ready_ms']['median']:>10.0f} "
            f"{r['first_exec_ms']['median']:>14.0f}"
        )
        if "build_cold_ms" in r:
            print(f"{'':<14} image build: cold {r['build_cold_ms']} ms, cached {r['build_cached_ms']} ms")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps({"host": host.summary(), "mem_mib": a.mem, "runs": a.runs, "rows": rows}, indent=2) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
