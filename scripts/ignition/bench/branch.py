"""Benchmark (not a test): `branch`, one request into N children.

A source (fresh boot, --mem, the guest agent, --track-dirty) waits until ready; then for each N
in --counts, --runs times: `branch` with count N (over the control socket), timed from the
request to

- all **running**: every child's control socket file exists (a child's `boot` listens on it
  just before its vCPUs start), watched by a thread polling the branch directory;
- all **ready**: the answer (every child's `status` says ready: its guest agent answered with
  the child's generation ID).

The answer's layer gives the source's pause (`pause_us`) and the layer's write time (both
within the times above); each child's log gives its own
`Restore-time` and `Agent-ready-time` (their spread is the children's). After 5 s idle, each
child's `boot` memory from /proc/PID/smaps_rollup: USS (Private_Clean + Private_Dirty) and PSS;
and the bytes each child's disk overlay holds (its store work directory's allocated bytes).
Then the children are stopped and the next run starts.

Prints a table and writes bench-results/branch.json (`summary`: per N, the medians of the
request-to-ready time and the source's pause).

    python3 -m ignition.bench.branch --counts 1,8 --runs 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ignition import host, paths
from ignition.branch import Child
from ignition.stats import stats, write_report
from ignition.vm import Vm, VmConfig

IDLE_S = 5.0


def smaps(pid: int) -> dict[str, int] | None:
    """smaps_rollup's fields, in KiB; None where the host has no /proc (macOS)."""
    rollup = Path(f"/proc/{pid}/smaps_rollup")
    if not rollup.exists():
        return None
    out = {}
    for line in rollup.read_text().splitlines()[1:]:
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0])
    return out


def log_ms(log: Path, key: str) -> int | None:
    m = re.search(rf"^{key} = (\d+) ms", log.read_text(), re.M)
    return int(m.group(1)) if m else None


def work_bytes(store: Path) -> int:
    """Allocated bytes of the store's `.tmp-run-*` work directories (the children's overlays)."""
    return sum(f.stat().st_blocks * 512 for d in store.glob(".tmp-run-*") for f in d.rglob("*") if f.is_file())


def one_branch(vm: Vm, store: Path, n: int, name: str) -> dict[str, Any]:
    assert vm.control_path is not None
    bdir = vm.control_path.parent / name
    running_at: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if bdir.is_dir() and len(list(bdir.glob("*.control"))) == n:
                running_at.append(time.perf_counter())
                return
            time.sleep(0.002)

    w = threading.Thread(target=watch)
    base_work = work_bytes(store)
    t0 = time.perf_counter()
    w.start()
    try:
        children = vm.branch(n, name)
    finally:
        stop.set()
        w.join()
    ready_s = time.perf_counter() - t0
    try:
        answer = vm.branched
        assert answer is not None
        time.sleep(IDLE_S)
        mem = [smaps(c.pid) for c in children]
        r: dict[str, Any] = {
            "n": n,
            "pause_us": answer["layer"]["pause_us"],
            "layer_write_ms": answer["layer"]["write_ms"],
            "layer_kind": answer["layer"]["kind"],
            "layer_pages": answer["layer"]["pages"],
            "running_ms": round((running_at[0] - t0) * 1000, 1) if running_at else None,
            "ready_ms": round(ready_s * 1000, 1),
            "child_restore_ms": [log_ms(c.log_path, "Restore-time") for c in children],
            "child_agent_ready_ms": [log_ms(c.log_path, "Agent-ready-time") for c in children],
            "uss_kib": [m["Private_Clean"] + m["Private_Dirty"] for m in mem if m],
            "pss_kib": [m["Pss"] for m in mem if m],
            "overlay_kib_per_child": round((work_bytes(store) - base_work) / 1024 / n, 1),
        }
    finally:
        stop_all(children)
    return r


def stop_all(children: Sequence[Child]) -> None:
    for c in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(c.pid, signal.SIGTERM)
    for c in children:
        if not c.wait_gone():
            c.kill()


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| N | source pause (µs) | layer write (ms) | request to all running (ms) | request to all ready (ms) | "
        "per-child Restore-time (ms, min-max) | per-child Agent-ready-time (ms, min-max) | "
        "USS per child (MiB, median / max) | PSS per child (MiB, median) | overlay per child (KiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["uss_kib"]:
            uss, pss = stats([u / 1024 for u in r["uss_kib"]]), stats([p / 1024 for p in r["pss_kib"]])
            mem = f"{uss['median']} / {uss['max']} | {pss['median']}"
        else:
            mem = "n/a (no /proc) | n/a"
        rt = [x for x in r["child_restore_ms"] if x is not None]
        ar = [x for x in r["child_agent_ready_ms"] if x is not None]
        lines.append(
            f"| {r['n']} | {r['pause_us']} | {r['layer_write_ms']} | {r['running_ms']} | {r['ready_ms']} | "
            f"{min(rt, default=0)}-{max(rt, default=0)} | {min(ar, default=0)}-{max(ar, default=0)} | "
            f"{mem} | {r['overlay_kib_per_child']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.branch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--boot", type=Path, default=paths.boot_bin(), help="the boot binary [default: %(default)s]")
    p.add_argument("--backend", choices=["emu", "hvf"], help="Ignition backend [default: boot's]")
    p.add_argument("--gic", choices=["userspace", "hvf"], help="Ignition's GIC [default: boot's]")
    p.add_argument("--counts", default="1,8", help="children per request, comma-separated [default: %(default)s]")
    p.add_argument("--runs", type=int, default=1, help="requests per count")
    p.add_argument("--mem", type=int, default=512, help="the source's RAM, MiB")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "branch.json")
    a = p.parse_args(argv)
    cfg = VmConfig(boot=a.boot, backend=a.backend, gic=a.gic)
    counts = [int(c) for c in a.counts.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="ignition-bench-branch-") as tmp:
        work = Path(tmp)
        disk, store = work / "rootfs.ext4", work / "store"
        shutil.copyfile(paths.ROOTFS, disk)
        extra = ["--branch-limit", str(max(counts))]
        with Vm.boot(
            cfg, disk=disk, mem=a.mem, store=store, name="src", track_dirty=True, agent=True, extra=extra
        ) as vm:
            vm.wait_ready()
            for n in counts:
                for i in range(a.runs):
                    rows.append(one_branch(vm, store, n, f"b{n}r{i}"))
                    print(table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    summary = {
        str(n): {
            "ready_ms": stats([r["ready_ms"] for r in rows if r["n"] == n]),
            "pause_us": stats([r["pause_us"] for r in rows if r["n"] == n]),
        }
        for n in counts
    }
    result = {"host": host.summary(), "backend": a.backend, "gic": a.gic, "mem_mib": a.mem, "rows": rows}
    write_report(a.out, result | {"summary": summary}, [table(rows)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
