"""Benchmark (not a test): saving a running VM, Ignition against QEMU TCG, in one run.

For each RAM size (default 512 MiB and 2 GiB) and each state (idle after
login; after dirtying 64 MiB of /dev/shm with random bytes), on the same
guest image:

- Ignition: `boot --track-dirty --name X` (a background full layer), Ctrl-A s:
  `Snapshot-pause-time` (guest stopped), `Snapshot-device-hold-time` (after
  the resume, devices that write guest RAM wait while the layer's pages are
  write-protected; QEMU: n/a), pause + `Snapshot-write-time` (total save
  time), the layer's memory.bin and state.bin as stored (allocated bytes:
  holes are not counted; the disk is not counted either, QEMU's migration
  stream does not hold it), then `boot --restore X`:
  `Restore-time` (to running) and spawn -> the shell answering (to prompt).
- QEMU: the same kernel and disk with a QMP socket; `migrate` to
  `exec:cat > FILE` while the guest runs (QEMU's live save): `downtime` and
  `total-time` from `query-migrate`, the file's size; then a second QEMU
  with `-incoming exec:cat FILE`: spawn -> `query-status` running, and
  spawn -> the shell answering.

Prints a table and writes bench-results/snapshot.json and
bench-results/snapshot.md. Every run uses throwaway copies of the disk in a
temporary directory.

    python3 -m ignition.bench.snapshot                 # 512 and 2048 MiB, both states
    python3 -m ignition.bench.snapshot --mem 512 --runs 3
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from ignition import console, host, paths, qemu, timeouts
from ignition.paths import RESULTS_DIR
from ignition.stats import stats
from ignition.vm import Vm, VmConfig

DIRTY_MIB = 64
STATES = ("idle", f"dirty-{DIRTY_MIB}MiB")


def allocated(path: Path) -> int:
    """Bytes a file takes on disk (st_blocks x 512)."""
    return path.stat().st_blocks * 512


DIRTY_CMD_TIMEOUTS = 4
"""The dirtying command's bound, in command timeouts: 64 MiB of urandom is minutes of a
software CPU's work on a loaded host (a bound on a hang, not a speed)."""


def dirty(sh: Callable[[str, float], object], cmd_timeout: float) -> None:
    sh(f"head -c {DIRTY_MIB * 1024 * 1024} /dev/urandom > /dev/shm/dirty", DIRTY_CMD_TIMEOUTS * cmd_timeout)


class Qmp:
    """A minimal QMP client (one command at a time over a Unix socket)."""

    def __init__(self, path: Path, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(str(path))
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
        self.f = self.sock.makefile("rw")
        json.loads(self.f.readline())  # greeting
        self.cmd("qmp_capabilities")

    def cmd(self, name: str, **args: Any) -> Any:
        """Runs a QMP command; returns its `return` value (JSON), or raises RuntimeError."""
        self.f.write(json.dumps({"execute": name, "arguments": args} if args else {"execute": name}) + "\n")
        self.f.flush()
        while True:
            msg = json.loads(self.f.readline())
            if "return" in msg:
                return msg["return"]
            if "error" in msg:
                raise RuntimeError(f"QMP {name}: {msg['error']}")

    def close(self) -> None:
        self.sock.close()


def ignition_run(cfg: VmConfig, mem: int, state: str, work: Path, logs: Path) -> dict[str, Any]:
    store, disk = work / "store", work / "rootfs.ext4"
    shutil.rmtree(store, ignore_errors=True)
    shutil.copyfile(paths.ROOTFS, disk)
    with Vm.boot(
        cfg, disk=disk, mem=mem, store=store, track_dirty=True, name="s", log_path=logs / f"ignition-{mem}-{state}.log"
    ) as vm:
        vm.login()
        if state != "idle":
            assert cfg.timeouts is not None
            dirty(lambda c, t: vm.sh(c, timeout=t), cfg.timeouts.cmd)
        snap = vm.snapshot("s", "full")
        assert vm.quit() == 0
    layer = store / "s"
    size = allocated(layer / "memory.bin") + allocated(layer / "state.bin")
    with Vm.restore(cfg, "s", store=store, log_path=logs / f"ignition-restore-{mem}-{state}.log") as vm:
        r = vm.restored
        assert r is not None and vm.quit() == 0
    return {
        "pause_ms": snap.pause_us / 1000,
        "device_hold_ms": (snap.device_hold_us or 0) / 1000,
        "save_ms": snap.pause_us / 1000 + snap.write_ms,
        "file_mib": size / 2**20,
        "restore_running_ms": r.restore_ms,
        "restore_prompt_ms": r.wall_s * 1000,
    }


def qemu_run(mem: int, state: str, work: Path, logs: Path, t: timeouts.Timeouts, accel: str = "tcg") -> dict[str, Any]:
    disk, image, sock = work / "rootfs-q.ext4", work / "qemu.mig", work / "qmp.sock"
    shutil.copyfile(paths.ROOTFS, disk)
    image.unlink(missing_ok=True)
    argv = qemu.qemu_argv(paths.KERNEL, disk, mem_mib=mem, accel=accel)
    argv += ["-qmp", f"unix:{sock},server=on,wait=off"]
    child = console.spawn(argv, log_path=logs / f"qemu-{mem}-{state}.log", timeout=t.boot)
    try:
        console.login(child, t.boot)
        q = Qmp(sock, t.cmd)
        if state != "idle":
            dirty(lambda c, limit: console.run(child, c, limit), t.cmd)
        q.cmd("migrate", uri=f"exec:cat > {image}")
        deadline = time.monotonic() + t.boot
        while (m := q.cmd("query-migrate"))["status"] not in ("completed", "failed"):
            if time.monotonic() > deadline:
                raise RuntimeError("QEMU's migration did not complete")
            time.sleep(0.01)
        if m["status"] != "completed":
            raise RuntimeError(f"QEMU's migration failed: {m}")
        q.close()
    finally:
        console.terminate(child)
        sock.unlink(missing_ok=True)
    result = {
        "pause_ms": float(m["downtime"]),
        "save_ms": float(m["total-time"]),
        "file_mib": image.stat().st_size / 2**20,
    }
    argv = qemu.qemu_argv(paths.KERNEL, disk, mem_mib=mem, accel=accel)
    argv += ["-qmp", f"unix:{sock},server=on,wait=off", "-incoming", f"exec:cat {image}"]
    t0 = time.perf_counter()
    child = console.spawn(argv, log_path=logs / f"qemu-restore-{mem}-{state}.log", timeout=t.boot)
    try:
        q = Qmp(sock, t.cmd)
        while q.cmd("query-status")["status"] != "running":
            time.sleep(0.001)
        result["restore_running_ms"] = (time.perf_counter() - t0) * 1000
        q.close()
        console.paced_send(child, "\n")
        console.expect(child, console.PROMPT, t.boot, "the shell prompt after the incoming migration")
        result["restore_prompt_ms"] = (time.perf_counter() - t0) * 1000
    finally:
        console.terminate(child)
        sock.unlink(missing_ok=True)
    return result


COLUMNS = [
    ("pause_ms", "pause (ms)"),
    ("device_hold_ms", "devices held (ms)"),
    ("save_ms", "total save (ms)"),
    ("file_mib", "file (MiB)"),
    ("restore_running_ms", "restore to running (ms)"),
    ("restore_prompt_ms", "restore to prompt (ms)"),
]


def table(results: dict[str, Any]) -> str:
    lines = [
        "| RAM | state | VMM | " + " | ".join(c[1] for c in COLUMNS) + " |",
        "|---|---|---|" + "---|" * len(COLUMNS),
    ]
    for key, r in results.items():
        mem, state = key.split("/")
        for vmm in ("ignition", "qemu"):
            if vmm not in r:
                continue
            cells = []
            for c, _ in COLUMNS:
                s = r[vmm].get(c)
                cells.append(f"{s['median']:.1f} ({s['min']:.1f}-{s['max']:.1f})" if s else "n/a")
            lines.append(f"| {mem} MiB | {state} | {vmm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.snapshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--mem", type=int, action="append", help="RAM in MiB (repeatable; default: 512 and 2048)")
    p.add_argument("--runs", type=int, default=3, help="runs per case (default: 3)")
    p.add_argument("--backend", help="Ignition backend (default: boot's)")
    p.add_argument("--gic", choices=["userspace", "hvf"], help="Ignition's GIC (default: boot's, userspace)")
    p.add_argument("--state", choices=STATES, action="append", help="guest state (repeatable; default: both)")
    p.add_argument("--no-qemu", action="store_true", help="skip the QEMU comparison")
    p.add_argument("--accel", choices=qemu.ACCELS, default="tcg", help="QEMU's accelerator (default: tcg)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "snapshot.json")
    args = p.parse_args(argv)
    err = qemu.check_inputs(paths.KERNEL, paths.ROOTFS)
    if err and not (args.no_qemu and err.startswith(qemu.QEMU)):
        print(f"snapshot_bench: {err}", file=sys.stderr)
        return 1
    cfg = VmConfig(boot=paths.boot_bin(), backend=args.backend, gic=args.gic)
    qt = timeouts.for_backend("qemu")
    logs = RESULTS_DIR / "logs" / "snapshot"
    logs.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="snapshot-bench-", dir=RESULTS_DIR) as tmp:
        work = Path(tmp)
        for mem in args.mem or [512, 2048]:
            for state in args.state or STATES:
                samples: dict[str, list[dict[str, Any]]] = {"ignition": []}
                if not args.no_qemu:
                    samples["qemu"] = []
                for run in range(args.runs):
                    print(f"[snapshot_bench] {mem} MiB {state}: run {run + 1}/{args.runs}", flush=True)
                    samples["ignition"].append(ignition_run(cfg, mem, state, work, logs))
                    if not args.no_qemu:
                        samples["qemu"].append(qemu_run(mem, state, work, logs, qt, args.accel))
                results[f"{mem}/{state}"] = {
                    vmm: {c: stats([s[c] for s in runs]) for c, _ in COLUMNS if c in runs[0]}
                    for vmm, runs in samples.items()
                }
    md = table(results)
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "host": host.summary(),
                "date": time.strftime("%Y-%m-%d"),
                "runs": args.runs,
                "backend": cfg.backend,
                "gic": cfg.gic or "userspace",
                "qemu_accel": None if args.no_qemu else args.accel,
                "results": results,
            },
            indent=2,
        )
        + "\n"
    )
    args.out.with_suffix(".md").write_text(md + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
