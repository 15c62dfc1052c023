"""Benchmark (not a test): what a restore costs its disk.

For each disk (the guest's rootfs, and one grown to --disk-mib with --data-mib of random bytes
added on the host with debugfs, so that the layer's disk.img holds that much data):

1. a fresh boot with `--name golden`, `sync` in the guest, Ctrl-A s (a full layer), Ctrl-A x;
2. --runs restores of golden (`--track-dirty --name dN`), one after the other, each: spawn ->
   `Restore-time` logged (to running) and -> the shell answering an Enter (to prompt); at the
   prompt, the bytes the restore wrote to disk: the store's `.tmp-run-*` work directory's
   allocated bytes (its private disk: with FICLONE they include the blocks it shares with the
   layer) and `boot`'s `write_bytes` (/proc/PID/io); then a guest workload (1 MiB in 4 KiB
   blocks to a new file, 64 files of 4 KiB, `sync`) and both again (what the guest's first
   writes cost); then Ctrl-A s, a diff layer dN: the allocated bytes of its disk files
   (`disk.img` or `disk.diff`, and `disk.chunks`) and `Snapshot-write-time`; and Ctrl-A x.

Any `boot` can be measured (--boot): a build that copies the disk at restore logs
`Restore-disk-copy` (the copy runs on its own thread; the guest's first disk request waits for
it), this one `Restore-disk` (the overlay, opened during resolve). The store goes under --dir
(default: a temporary directory in /tmp, this machine's file system); point it at an XFS mount
(scripts/reflink-scratch.sh) for FICLONE.

Prints a table and writes bench-results/restore_disk.json.

    python3 -m ignition.bench.restore_disk --runs 5
    python3 -m ignition.bench.restore_disk --boot /path/to/older/boot --dir /mnt/xfs
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ignition import console, loglines, paths
from ignition.stats import stats, write_report
from ignition.vm import CTRL_A, Vm, VmConfig

MEM = 512
WORKLOAD = (
    "dd if=/dev/urandom of=/root/w.bin bs=4k count=256 2>/dev/null && "
    "for i in $(seq 64); do head -c 4096 /dev/urandom > /root/f$i; done && sync"
)
COPY_LINE = r"Restore-disk-copy = (\d+) us \(([^)]+)\); ready (\d+) us after restore start"


def grown_image(src: Path, dst: Path, disk_mib: int, data_mib: int) -> None:
    """dst: src's ext4 image grown to disk_mib MiB, with a data_mib MiB file of random bytes."""
    shutil.copyfile(src, dst)
    subprocess.run(["truncate", "-s", f"{disk_mib}M", str(dst)], check=True)
    subprocess.run(["e2fsck", "-fy", str(dst)], check=False, capture_output=True)
    subprocess.run(["resize2fs", str(dst)], check=True, capture_output=True)
    rand = dst.with_suffix(".rand")
    with open(rand, "wb") as f, open("/dev/urandom", "rb") as r:
        for _ in range(data_mib):
            f.write(r.read(1 << 20))
    subprocess.run(["debugfs", "-w", "-R", f"write {rand} /root/big.bin", str(dst)], check=True, capture_output=True)
    rand.unlink()


def work_bytes(store: Path) -> int:
    """Allocated bytes of the store's `.tmp-run-*` work directories (a restored VM's private disk)."""
    return sum(f.stat().st_blocks * 512 for d in store.glob(".tmp-run-*") for f in d.rglob("*") if f.is_file())


def write_bytes(pid: int) -> int:
    """`write_bytes` of /proc/PID/io: bytes the process caused to be written to storage."""
    m = re.search(r"^write_bytes: (\d+)$", Path(f"/proc/{pid}/io").read_text(), re.M)
    return int(m.group(1)) if m else 0


def golden(cfg: VmConfig, disk: Path, store: Path, log: Path) -> None:
    with Vm.boot(cfg, disk=disk, mem=MEM, store=store, name="golden", log_path=log) as vm:
        vm.login()
        vm.sh("sync")
        vm.snapshot("golden", "full")
        if vm.quit() != 0:
            raise RuntimeError("boot did not exit 0")


def one_restore(cfg: VmConfig, store: Path, log: Path, name: str) -> dict[str, Any]:
    vm = Vm.restore(cfg, "golden", store=store, name=name, track_dirty=True, log_path=log, wait=False)
    seen = ""

    def expect(pat: str | list[str], what: str) -> None:
        nonlocal seen
        vm.expect(pat, what, vm.timeouts.boot)
        seen += console.before(vm.child) + console.after(vm.child)

    try:
        expect(loglines.RESTORE_TIME, "Restore-time")
        r: dict[str, Any] = {"running_ms": int(vm.match.group(1))}
        expect(loglines.RESTORE_STAGES, "Restore-stages")
        vm.type("\n")
        expect(console.PROMPT, "the prompt")
        r["prompt_s"] = round(time.perf_counter() - vm.t_spawn, 4)
        # A copy on its own thread may still be going: wait for its line.
        if not re.search(COPY_LINE, seen) and not re.search(loglines.RESTORE_DISK, seen):
            expect([COPY_LINE, loglines.RESTORE_DISK], "the disk's line")
        r["work_bytes_at_prompt"] = work_bytes(store)
        r["write_bytes_at_prompt"] = write_bytes(vm.pid)
        vm.sh(WORKLOAD, timeout=vm.timeouts.boot)
        r["work_bytes_after_workload"] = work_bytes(store)
        r["write_bytes_after_workload"] = write_bytes(vm.pid)
        snap = vm.snapshot(name, "diff")
        r["diff_write_ms"] = snap.write_ms
        r["diff_disk_bytes"] = sum(
            f.stat().st_blocks * 512 for f in (store / name).iterdir() if f.name.startswith("disk.")
        )
        vm.send(CTRL_A + "x")
        if vm.wait_exit() != 0:
            raise RuntimeError("boot did not exit 0")
    finally:
        vm.terminate()
    if m := re.search(COPY_LINE, seen):
        r.update(method=m.group(2), disk_us=int(m.group(1)), disk_ready_us=int(m.group(3)))
    elif m := re.search(loglines.RESTORE_DISK, seen):
        r.update(method="overlay", disk_us=int(m.group(1)), disk_ready_us=None)
    return r


def measure(cfg: VmConfig, disk: Path, work: Path, runs: int, tag: str) -> dict[str, Any]:
    store = work / f"store-{tag}"
    shutil.rmtree(store, ignore_errors=True)
    golden(cfg, disk, store, work / f"{tag}-golden.log")
    mib = 1 << 20
    image = store / "golden" / "disk.img"
    data_mib = round(image.stat().st_blocks * 512 / mib, 1)
    rows = [one_restore(cfg, store, work / f"{tag}-r{i}.log", f"d{i}") for i in range(runs)]
    shutil.rmtree(store, ignore_errors=True)

    def med(k: str) -> float:
        return float(statistics.median(r[k] for r in rows))

    return {
        "disk_mib": disk.stat().st_size // mib,
        "layer_disk_allocated_mib": data_mib,
        "method": rows[0].get("method"),
        "running_ms": stats([r["running_ms"] for r in rows], 0),
        "prompt_ms": stats([r["prompt_s"] * 1000 for r in rows], 0),
        "disk_us": stats([r.get("disk_us") or 0 for r in rows], 0),
        "disk_ready_ms": stats([(r.get("disk_ready_us") or 0) / 1000 for r in rows], 1),
        "work_mib_at_prompt": round(med("work_bytes_at_prompt") / mib, 2),
        "write_mib_at_prompt": round(med("write_bytes_at_prompt") / mib, 2),
        "work_mib_after_workload": round(med("work_bytes_after_workload") / mib, 2),
        "write_mib_after_workload": round(med("write_bytes_after_workload") / mib, 2),
        "diff_disk_mib": round(med("diff_disk_bytes") / mib, 2),
        "diff_write_ms": stats([r["diff_write_ms"] for r in rows], 0),
        "runs": rows,
    }


def table(results: dict[str, Any]) -> str:
    lines = [
        "| disk | data (MiB) | method | to running (ms) | to prompt (ms) | disk ready (ms) | written by the restore "
        "(MiB: private disk / write_bytes) | after the workload (MiB: private disk / write_bytes) | diff layer's "
        "disk (MiB) | diff write (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for tag, x in results.items():
        ready = f"{x['disk_ready_ms']['median']}" if x["method"] != "overlay" else f"{x['disk_us']['median'] / 1000}"
        lines.append(
            f"| {x['disk_mib']} MiB ({tag}) | {x['layer_disk_allocated_mib']} | {x['method']} | "
            f"{x['running_ms']['median']:.0f} | "
            f"{x['prompt_ms']['median']:.0f} | {ready} | {x['work_mib_at_prompt']} / {x['write_mib_at_prompt']} | "
            f"{x['work_mib_after_workload']} / {x['write_mib_after_workload']} | {x['diff_disk_mib']} | "
            f"{x['diff_write_ms']['median']:.0f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.restore_disk",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--boot", type=Path, default=paths.boot_bin(), help="the boot binary [default: %(default)s]")
    p.add_argument("--dir", type=Path, default=None, help="where the stores go [default: a directory in /tmp]")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--disk-mib", type=int, default=1024, help="the grown disk's size")
    p.add_argument("--data-mib", type=int, default=512, help="random bytes added to the grown disk")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "restore_disk.json")
    a = p.parse_args(argv)
    cfg = VmConfig(boot=a.boot)
    with tempfile.TemporaryDirectory(prefix="ignition-restore-disk-", dir=a.dir) as tmp:
        work = Path(tmp)
        rootfs = work / "rootfs.ext4"
        shutil.copyfile(paths.ROOTFS, rootfs)
        grown = work / "grown.ext4"
        grown_image(paths.ROOTFS, grown, a.disk_mib, a.data_mib)
        results = {
            "rootfs": measure(cfg, rootfs, work, a.runs, "rootfs"),
            f"+{a.data_mib} MiB": measure(cfg, grown, work, a.runs, "grown"),
        }
    write_report(a.out, {"boot": str(a.boot), "dir": str(a.dir), "results": results}, [table(results)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
