"""Benchmark (not a test): `branch`, one request into N children, beside doing it by hand and QEMU.

For each method in --methods, each source state in --state and each N in --counts, --runs
times (medians of the runs in `summary`):

- **branch**: a source (fresh boot, --mem, the guest agent, --track-dirty) gets `branch` with
  count N over its control socket (its children start as the VMM chooses: forks of the source
  where it can, `start: fork`).
- **branch-exec**: the same with `start: exec`: each child is `boot --restore` started anew.
- **hand**: the same source gets `snapshot` over its control socket, then N `boot --restore
  LAYER --daemonize` are started at once, each with its own control socket, vsock socket and
  CID, as a user would script it without `branch` (each restore runs on an overlay of the
  layer's disk, so there is no disk to copy), and each child's control socket is polled until
  its status says ready.
- **qemu**: the same guest under qemu-system-aarch64 (TCG, logged in on its serial console)
  saves its state with QMP `migrate "exec:cat > FILE"`, its disk is copied once per child
  (`cp --sparse=always`, while the source is stopped after the save), and N
  `qemu-system-aarch64 -incoming "exec:cat FILE" -daemonize` start at once, each on its own
  copy; then the source is resumed (`cont`).

States: **idle** (the source as it is), **dirty** (before each request the source writes 64
MiB of fresh random data to a tmpfs file: through its guest agent, or its serial console
under QEMU).

Each request is timed from its start to

- all **running**: branch: every child's control socket file exists (a child's `boot` listens
  on it just before its vCPUs start); hand: every `boot --daemonize` parent has exited (it
  does once the VM runs); qemu: every child's QMP `query-status` says running;
- all **ready**: branch: the answer (every child's agent answered with its generation ID);
  hand: every child's control socket status says ready (the same test); qemu: every child's
  serial console echoes a command (QEMU has no agent).

Also recorded: the source's pause (branch and hand: the snapshot's `pause_us`; qemu: the
migration's `downtime`, in µs), the layer's write time, each child's `Restore-time` and
`Agent-ready-time` (from its log: Ignition only), each child's CPU time when all are ready
(utime + stime from /proc/PID/stat), and after 5 s idle each child's memory from
/proc/PID/smaps_rollup: USS (Private_Clean + Private_Dirty), PSS, and its anonymous memory
(`Anonymous`: freed when it ends, not page cache); the disk bytes each child holds (branch
and hand: its store work directory's overlay; qemu: its copy's allocated bytes); and the host's
load average (`os.getloadavg()`) before each request, since the machine may be shared.

A count whose children would not fit in half the host's available memory (estimated from the
largest child of that method seen so far) is skipped and listed as such.

Prints a table and writes bench-results/branch.json (`summary`: per method, state and N, the
medians); with --plot, an SVG of the medians (matplotlib); --from merges earlier reports
(their rows) into one, without running anything. The rows so far are in branch.partial.json while it runs.

    python3 -m ignition.bench.branch                                  # the issue's matrix
    python3 -m ignition.bench.branch --counts 1,8 --runs 1 --methods branch --state idle
    python3 -m ignition.bench.branch --methods qemu --out bench-results/branch-qemu.json
    python3 -m ignition.bench.branch --from bench-results/branch.json bench-results/branch-qemu.json \
        --out bench-results/branch-all.json --plot book/src/figures/branch.svg
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ignition import console, host, net, paths, qemu
from ignition.branch import Child, pid_alive
from ignition.control import ControlClient
from ignition.stats import stats, write_report
from ignition.vm import Vm, VmConfig

IDLE_S = 5.0
DIRTY_MIB = 64
RAM_DIR = "/mnt/ram"
DIRTY_CMD = (
    # Mounted once (the guest's busybox has no `mountpoint`): a tmpfs mounted over another
    # would hide, and keep, the file written before.
    f"mkdir -p {RAM_DIR} && (grep -q ' {RAM_DIR} ' /proc/mounts || "
    f"mount -t tmpfs -o size={DIRTY_MIB + 16}m ram {RAM_DIR}) && "
    f"rm -f {RAM_DIR}/dirty && dd if=/dev/urandom of={RAM_DIR}/dirty bs=1M count={DIRTY_MIB} 2>/dev/null"
)
METHODS = ("branch", "branch-exec", "hand", "qemu")
STATES = ("idle", "dirty")
# A first guess of one child's resident memory, MiB, until one has been measured.
FIRST_GUESS_MIB = {"branch": 48, "branch-exec": 48, "hand": 48, "qemu": 256}
POLL_S = 0.02


def smaps(pid: int) -> dict[str, int] | None:
    """smaps_rollup's fields, in KiB; None where the host has no /proc (macOS) or pid is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    out = {}
    for line in text.splitlines()[1:]:
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0])
    return out


def mem_available_mib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def log_ms(log: Path, key: str) -> int | None:
    try:
        m = re.search(rf"^{key} = (\d+) ms", log.read_text(), re.M)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def allocated(files: Iterator[Path]) -> int:
    return sum(f.stat().st_blocks * 512 for f in files if f.is_file())


def work_bytes(store: Path) -> int:
    """Allocated bytes of the store's `.tmp-run-*` work directories (the children's overlays)."""
    return allocated(f for d in store.glob(".tmp-run-*") for f in d.rglob("*"))


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def memory(pids: Sequence[int]) -> dict[str, list[int]]:
    """Per process: USS, PSS and anonymous memory (KiB); and those of the passts they started."""
    mem = [m for m in (smaps(p) for p in pids) if m]
    passts = [m for m in (smaps(q) for p in pids for q in net.passt_pids(p)) if m]
    return {
        "uss_kib": [m["Private_Clean"] + m["Private_Dirty"] for m in mem],
        "pss_kib": [m["Pss"] for m in mem],
        "anon_kib": [m["Anonymous"] for m in mem],
        "passt_uss_kib": [m["Private_Clean"] + m["Private_Dirty"] for m in passts],
        "passt_pss_kib": [m["Pss"] for m in passts],
    }


def kill_all(pids: Sequence[int], timeout: float = 30.0) -> None:
    """SIGTERM to each, then SIGKILL to any still there after timeout."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


def watch_until(done: Callable[[], bool]) -> tuple[threading.Thread, list[float], threading.Event]:
    """A thread polling done() every 2 ms; appends perf_counter() when it is first true."""
    at: list[float] = []
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            if done():
                at.append(time.perf_counter())
                return
            time.sleep(0.002)

    return threading.Thread(target=run, daemon=True), at, stop


def finish(
    r: dict[str, Any], pids: Sequence[int], t0: float, running_at: list[float], ready_at: float
) -> dict[str, Any]:
    """Fills in the times, the CPU each child used to get ready and its memory after IDLE_S."""
    if "source_cpu_ms" in r and (c := host.process_cpu_ms(r.pop("source_pid"))) is not None:
        r["source_cpu_ms"] = c - r["source_cpu_ms"]
    r["running_ms"] = round((running_at[0] - t0) * 1000, 1) if running_at else None
    r["ready_ms"] = round((ready_at - t0) * 1000, 1)
    r["child_cpu_ms"] = [c for c in (host.process_cpu_ms(p) for p in pids) if c is not None]
    time.sleep(IDLE_S)
    r |= memory(pids)
    return r


# Ignition: branch and by hand


def dirty(vm: Vm) -> float:
    """The source writes DIRTY_MIB of fresh data to tmpfs; returns the seconds it took."""
    t = time.perf_counter()
    vm.run(DIRTY_CMD, timeout=600)
    return time.perf_counter() - t


def one_branch(vm: Vm, store: Path, n: int, name: str, start: str | None = None) -> dict[str, Any]:
    assert vm.control_path is not None
    bdir = vm.control_path.parent / name
    w, running_at, stop = watch_until(lambda: bdir.is_dir() and len(list(bdir.glob("*.control"))) == n)
    base_work = work_bytes(store)
    r: dict[str, Any] = {"load": load(), "source_pid": vm.pid, "source_cpu_ms": host.process_cpu_ms(vm.pid)}
    t0 = time.perf_counter()
    w.start()
    try:
        children = vm.branch(n, name, start=start)
    finally:
        stop.set()
        w.join()
    ready_at = time.perf_counter()
    try:
        answer = vm.branched
        assert answer is not None
        r |= {
            "pause_us": answer["layer"]["pause_us"],
            "layer_write_ms": answer["layer"]["write_ms"],
            "layer_kind": answer["layer"]["kind"],
            "start": answer["start"],
            "layer_pages": answer["layer"]["pages"],
            "child_restore_ms": [log_ms(c.log_path, "Restore-time") for c in children],
            "child_agent_ready_ms": [log_ms(c.log_path, "Agent-ready-time") for c in children],
        }
        finish(r, [c.pid for c in children], t0, running_at, ready_at)
        r["disk_kib_per_child"] = round((work_bytes(store) - base_work) / 1024 / n, 1)
    finally:
        stop_request(vm, children)
    return r


def stop_request(vm: Vm, children: Sequence[Child]) -> None:
    """Stops the children of one of vm's branch requests. The source's handle then forgets
    them: it must not stop them again at its end, when their pids may be other processes'."""
    stop_children(children)
    vm.children = [c for c in vm.children if c not in children]


@contextlib.contextmanager
def source(cfg: VmConfig, work: Path, mem: int, extra: Sequence[str]) -> Iterator[Vm]:
    """The branch benchmarks' source: a fresh boot on a copy of the rootfs in `work` (store
    work/store, the guest agent, --track-dirty, `extra`), ready, its console drained."""
    disk = work / "rootfs.ext4"
    shutil.copyfile(paths.ROOTFS, disk)
    with Vm.boot(
        cfg, disk=disk, mem=mem, store=work / "store", name="src", track_dirty=True, agent=True, extra=list(extra)
    ) as vm:
        vm.wait_ready()
        drain = console.Drain(vm.child)
        try:
            yield vm
        finally:
            drain.close()


def stop_children(children: Sequence[Child]) -> None:
    for c in children:
        if c.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid, signal.SIGTERM)
    for c in children:
        if not c.wait_gone():
            c.kill()


def one_by_hand(cfg: VmConfig, vm: Vm, store: Path, n: int, name: str, timeout: float, passt: bool) -> dict[str, Any]:
    """`snapshot`, then N `boot --restore --daemonize` at once (with passt: each on a passt of
    its own, with a MAC of its own), polled until ready."""
    assert vm.control_path is not None
    d = vm.control_path.parent / name
    d.mkdir()
    base_work = work_bytes(store)
    r: dict[str, Any] = {"load": load(), "source_pid": vm.pid, "source_cpu_ms": host.process_cpu_ms(vm.pid)}
    t0 = time.perf_counter()
    layer = vm.snapshot(name)
    parents = []
    for i in range(1, n + 1):
        f = d / f"{name}-{i}"
        argv = cfg.argv(
            "--restore", name, "--store", str(store), "--name", f"{name}-{i}", "--control", f"{f}.control",
            "--console", f"socket:{f}.console", "--vsock-uds", f"{f}.vsock", "--vsock-cid", str(1000 + i),
            "--pid-file", f"{f}.pid", "--log-file", f"{f}.log", "--track-dirty", "--daemonize",
            *(["--net", "passt", "--mac", f"52:54:00:ff:{i >> 8:02x}:{i & 0xFF:02x}"] if passt else []),
        )  # fmt: skip
        parents.append(
            subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        )
    pids: list[int] = []
    try:
        collect_pids(parents, d, name, "boot --restore", timeout, pids)
        running_at = [time.perf_counter()]
        deadline = time.monotonic() + timeout
        for i in range(1, n + 1):
            with ControlClient(d / f"{name}-{i}.control") as c:
                while not c.status()["ready"]:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{name}-{i}: not ready within {timeout:g} s")
                    time.sleep(POLL_S)
        ready_at = time.perf_counter()
        r |= {
            "pause_us": layer.pause_us,
            "layer_write_ms": layer.write_ms,
            "layer_kind": layer.kind,
            "layer_pages": layer.pages,
            "child_restore_ms": [log_ms(d / f"{name}-{i}.log", "Restore-time") for i in range(1, n + 1)],
            "child_agent_ready_ms": [log_ms(d / f"{name}-{i}.log", "Agent-ready-time") for i in range(1, n + 1)],
        }
        finish(r, pids, t0, running_at, ready_at)
        r["disk_kib_per_child"] = round((work_bytes(store) - base_work) / 1024 / n, 1)
    finally:
        for p in parents:
            if p.poll() is None:
                p.kill()
        kill_all(pids)
    return r


# QEMU


class Qmp:
    """A QMP connection (QEMU's JSON control protocol) on a Unix socket."""

    def __init__(self, path: Path, timeout: float = 60.0):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(path))
        except OSError:
            self.sock.close()
            raise
        self.f = self.sock.makefile("rw")
        self._read()  # the greeting
        self.execute("qmp_capabilities")

    def _read(self) -> dict[str, Any]:
        while True:
            line = self.f.readline()
            if not line:
                raise ConnectionError("QMP connection closed")
            msg: dict[str, Any] = json.loads(line)
            if "event" not in msg:
                return msg

    def execute(self, command: str, **arguments: Any) -> Any:
        self.f.write(json.dumps({"execute": command, "arguments": arguments}) + "\n")
        self.f.flush()
        msg = self._read()
        if "error" in msg:
            raise RuntimeError(f"QMP {command}: {msg['error']}")
        return msg["return"]

    def close(self) -> None:
        self.f.close()
        self.sock.close()


def connect_retry(connect: Callable[[], Any], deadline: float) -> Any:
    while True:
        try:
            return connect()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)


def serial_answers(path: Path, tag: str, deadline: float) -> None:
    """Types `echo TAG` on a serial console socket until TAG comes back, within deadline."""
    with socket.socket(socket.AF_UNIX) as s:
        connect_retry(lambda: s.connect(str(path)), deadline)
        s.settimeout(0.5)
        got = b""
        want = tag.encode()
        # Typed as 'X''Y' so that the echo of the typed line does not match.
        half = len(tag) // 2
        line = f"echo '{tag[:half]}''{tag[half:]}'\n".encode()
        sent_at = 0.0
        while want not in got:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{path}: no answer on the serial console")
            if time.monotonic() - sent_at > 2.0:
                s.sendall(line)
                sent_at = time.monotonic()
            with contextlib.suppress(TimeoutError):
                chunk = s.recv(4096)
                if not chunk:
                    raise RuntimeError(f"{path}: serial console closed")
                got = (got + chunk)[-4096:]


@dataclass
class QemuSource:
    child: Any  # pexpect.spawn
    qmp: Qmp
    disk: Path
    work: Path
    mem: int


def qemu_child_argv(src: QemuSource, disk: Path, state: Path, f: Path) -> list[str]:
    argv = qemu.qemu_argv(paths.KERNEL, disk, mem_mib=src.mem)
    argv.remove("-nographic")
    return [
        *argv, "-display", "none", "-monitor", "none", "-serial", f"unix:{f}.serial,server=on,wait=off",
        "-qmp", f"unix:{f}.qmp,server=on,wait=off", "-incoming", f"exec:cat {state}",
        "-daemonize", "-pidfile", f"{f}.pid",
    ]  # fmt: skip


def one_qemu(src: QemuSource, n: int, name: str, timeout: float) -> dict[str, Any]:
    d = src.work / name
    d.mkdir()
    state = d / "state"
    r: dict[str, Any] = {"load": load()}
    t0 = time.perf_counter()
    src.qmp.execute("migrate", uri=f"exec:cat > {state}")
    deadline = time.monotonic() + timeout
    while (m := src.qmp.execute("query-migrate")).get("status") != "completed":
        if m.get("status") == "failed" or time.monotonic() > deadline:
            raise RuntimeError(f"QEMU's save failed: {m}")
        time.sleep(POLL_S)
    disks = [d / f"disk-{i}.ext4" for i in range(1, n + 1)]
    for disk in disks:
        subprocess.run(["cp", "--sparse=always", str(src.disk), str(disk)], check=True)
    parents = [
        subprocess.Popen(
            qemu_child_argv(src, disk, state, d / f"{name}-{i}"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        for i, disk in enumerate(disks, 1)
    ]
    pids: list[int] = []
    try:
        collect_pids(parents, d, name, "QEMU", timeout, pids)
        src.qmp.execute("cont")
        for i in range(1, n + 1):
            qmp_path = d / f"{name}-{i}.qmp"
            q: Qmp = connect_retry(functools.partial(Qmp, qmp_path), deadline)
            try:
                while q.execute("query-status")["status"] != "running":
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"QEMU child {i} not running within {timeout:g} s")
                    time.sleep(POLL_S)
            finally:
                q.close()
        running_at = [time.perf_counter()]
        for i in range(1, n + 1):
            serial_answers(d / f"{name}-{i}.serial", f"R{i}x{name}", deadline)
        ready_at = time.perf_counter()
        r |= {"pause_us": int(m.get("downtime", 0)) * 1000, "migrate_total_ms": m.get("total-time")}
        finish(r, pids, t0, running_at, ready_at)
        r["disk_kib_per_child"] = round(allocated(iter(disks)) / 1024 / n, 1)
    finally:
        for p in parents:
            if p.poll() is None:
                p.kill()
        kill_all(pids)
        shutil.rmtree(d, ignore_errors=True)
        with contextlib.suppress(RuntimeError, OSError):
            if src.qmp.execute("query-status")["status"] != "running":
                src.qmp.execute("cont")
    return r


@contextlib.contextmanager
def qemu_source(work: Path, mem: int, timeout: float) -> Iterator[QemuSource]:
    disk = work / "qemu-rootfs.ext4"
    subprocess.run(["cp", "--sparse=always", str(paths.ROOTFS), str(disk)], check=True)
    qmp_path = work / "qemu-source.qmp"
    argv = [*qemu.qemu_argv(paths.KERNEL, disk, mem_mib=mem), "-qmp", f"unix:{qmp_path},server=on,wait=off"]
    child = console.spawn(argv, log_path=work / "qemu-source.log", timeout=timeout)
    try:
        console.login(child, timeout=timeout)
        q = connect_retry(lambda: Qmp(qmp_path), time.monotonic() + timeout)
        try:
            yield QemuSource(child, q, disk, work, mem)
        finally:
            q.close()
    finally:
        console.terminate(child)


# Report


def med(xs: Sequence[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return round(statistics.median(v), 1) if v else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method, state and N: the medians over runs (per-child figures: of each run's median)."""
    out: dict[str, Any] = {}
    for r in rows:
        out.setdefault(r["method"], {}).setdefault(r["state"], {}).setdefault(str(r["n"]), []).append(r)
    for states in out.values():
        for counts in states.values():
            for n, rs in counts.items():
                ok = [r for r in rs if "ready_ms" in r]
                counts[n] = {
                    "runs": len(ok),
                    "skipped": next((r["skipped"] for r in rs if "skipped" in r), None),
                    "pause_us": med([r.get("pause_us") for r in ok]),
                    "running_ms": med([r.get("running_ms") for r in ok]),
                    "ready_ms": med([r["ready_ms"] for r in ok]),
                    "ready_ms_stats": stats([r["ready_ms"] for r in ok]) if ok else None,
                    "child_cpu_ms": med([med(r["child_cpu_ms"]) for r in ok]),
                    "uss_mib": med([(med(r["uss_kib"]) or 0) / 1024 for r in ok if r["uss_kib"]]),
                    "pss_mib": med([(med(r["pss_kib"]) or 0) / 1024 for r in ok if r["pss_kib"]]),
                    "anon_mib": med([(med(r["anon_kib"]) or 0) / 1024 for r in ok if r["anon_kib"]]),
                    "disk_kib_per_child": med([r.get("disk_kib_per_child") for r in ok]),
                    "passt_uss_mib": med([(med(r["passt_uss_kib"]) or 0) / 1024 for r in ok if r.get("passt_uss_kib")]),
                    "passt_pss_mib": med([(med(r["passt_pss_kib"]) or 0) / 1024 for r in ok if r.get("passt_pss_kib")]),
                    "source_cpu_ms": med([r.get("source_cpu_ms") for r in ok]),
                    "load_1min": med([r["load"][0] for r in rs]),
                }
    return out


def collect_pids(
    parents: Sequence[subprocess.Popen[bytes]], d: Path, name: str, what: str, timeout: float, pids: list[int]
) -> None:
    """Waits for each daemonizing parent (child i of `name`) to exit and appends to `pids` the
    pid its child wrote to `d/NAME-I.pid`, one at a time (so that the caller can stop those
    started when one fails). RuntimeError names a parent that failed, with its stderr."""
    for i, p in enumerate(parents, 1):
        _, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{name}-{i}: {what} failed: {err.decode().strip()}")
        pids.append(int((d / f"{name}-{i}.pid").read_text()))


def table(summary: dict[str, Any]) -> str:
    lines = [
        "| method | state | N | runs | source pause (µs) | request to all running (ms) | request to all ready (ms) | "
        "CPU per child to ready (ms) | source's CPU (ms) | USS per child (MiB) | PSS per child (MiB) | "
        "anonymous per child (MiB) | passt USS / PSS per child (MiB) | disk per child (KiB) | load (1 min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def na(v: Any) -> Any:
        return "n/a" if v is None else v

    for method, states in sorted(summary.items(), key=lambda kv: METHODS.index(kv[0])):
        for state, counts in sorted(states.items(), key=lambda kv: STATES.index(kv[0])):
            for n, s in sorted(counts.items(), key=lambda kv: int(kv[0])):
                s = {k: na(v) for k, v in s.items()}
                if s["skipped"] != "n/a":
                    lines.append(f"| {method} | {state} | {n} | skipped: {s['skipped']} |||||||||||")
                    continue
                lines.append(
                    f"| {method} | {state} | {n} | {s['runs']} | {s['pause_us']} | {s['running_ms']} | "
                    f"{s['ready_ms']} | "
                    f"{s['child_cpu_ms']} | {s['source_cpu_ms']} | {s['uss_mib']} | {s['pss_mib']} | {s['anon_mib']} | "
                    f"{s['passt_uss_mib']} / {s['passt_pss_mib']} | "
                    f"{s['disk_kib_per_child']} | {s['load_1min']} |"
                )
    return "\n".join(lines)


def plot(result: dict[str, Any], out: Path) -> None:
    """An SVG of the medians: request to all ready, and USS per child, against N."""
    try:
        import matplotlib

        matplotlib.use("svg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("--plot needs matplotlib (pip install matplotlib)")
    summary = result["summary"]
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    all_n: set[int] = set()
    for method, states in summary.items():
        for state, counts in states.items():
            pts = sorted((int(n), s) for n, s in counts.items() if s["ready_ms"] is not None)
            if not pts:
                continue
            ns = [n for n, _ in pts]
            kw = {
                "linestyle": "-" if state == "idle" else "--",
                "marker": "o" if state == "idle" else "s",
                "color": f"C{METHODS.index(method)}",
                "label": f"{method}, {state}",
            }
            axes[0].plot(ns, [s["ready_ms"] / 1000 for _, s in pts], **kw)
            axes[1].plot(ns, [s["uss_mib"] for _, s in pts], **kw)
            axes[2].plot(ns, [s["child_cpu_ms"] for _, s in pts], **kw)
            all_n.update(ns)
    for ax, title in zip(
        axes, ["request to all ready (s)", "USS per child (MiB)", "CPU per child to ready (ms)"], strict=True
    ):
        ax.set_title(title)
        ax.set_xlabel("children (N)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(all_n), [str(n) for n in sorted(all_n)])
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    loads = [s["load_1min"] for st in summary.values() for c in st.values() for s in c.values() if s["load_1min"]]
    fig.suptitle(
        f"branch: medians of {result.get('runs')} runs, {result['mem_mib']} MiB source, "
        f"{result['host'].get('cpu_count')} host CPUs, load average {min(loads, default=0)}-{max(loads, default=0)}",
        fontsize=9,
    )
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None})
    print(f"wrote {out}")


def fits(method: str, n: int, biggest_mib: dict[str, float]) -> str | None:
    """Why n children of method would not fit in half the available memory, else None."""
    avail = mem_available_mib()
    need = n * biggest_mib.get(method, FIRST_GUESS_MIB[method])
    if avail is not None and need > avail / 2:
        return f"needs about {need:.0f} MiB, {avail} MiB available"
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.branch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--boot", type=Path, default=paths.boot_bin(), help="the boot binary [default: %(default)s]")
    p.add_argument("--backend", choices=["emu", "hvf"], help="Ignition backend [default: boot's]")
    p.add_argument("--gic", choices=["userspace", "hvf"], help="Ignition's GIC [default: boot's]")
    p.add_argument("--counts", default="1,8,32,64", help="children per request, comma-separated [default: %(default)s]")
    p.add_argument("--runs", type=int, default=5, help="requests per method, state and count [default: %(default)s]")
    p.add_argument("--state", default="idle,dirty", help="the source's states: idle, dirty [default: %(default)s]")
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"{', '.join(METHODS)} [default: %(default)s]",
    )
    p.add_argument("--mem", type=int, default=512, help="the source's RAM, MiB")
    p.add_argument(
        "--net",
        choices=["none", "passt"],
        default="none",
        help="passt: the Ignition source on --net passt, each child on a passt of its own (whose memory is "
        "measured too); QEMU's VMs have no network either way [default: %(default)s]",
    )
    p.add_argument("--timeout", type=float, default=600, help="seconds a request's children have to be ready")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "branch.json")
    p.add_argument("--plot", type=Path, help="also draw the medians into this SVG (needs matplotlib)")
    p.add_argument(
        "--from",
        dest="from_json",
        type=Path,
        nargs="+",
        help="run nothing: merge these reports' rows into --out (and --plot)",
    )
    a = p.parse_args(argv)
    if a.from_json:
        # Runs of separate invocations (say, Ignition's methods and QEMU's) as one report.
        runs = [json.loads(f.read_text()) for f in a.from_json]
        merged = runs[0] | {"rows": [r for run in runs for r in run["rows"]]}
        merged["summary"] = summarize(merged["rows"])
        write_report(a.out, merged, [table(merged["summary"])])
        if a.plot:
            plot(merged, a.plot)
        return 0
    counts = [int(c) for c in a.counts.split(",")]
    states = a.state.split(",")
    methods = a.methods.split(",")
    for s in states:
        if s not in STATES:
            p.error(f"--state {s}: not one of {', '.join(STATES)}")
    for m in methods:
        if m not in METHODS:
            p.error(f"--methods {m}: not one of {', '.join(METHODS)}")
    if "qemu" in methods and (why := qemu.check_inputs(paths.KERNEL, paths.ROOTFS)):
        p.error(why)
    cfg = VmConfig(boot=a.boot, backend=a.backend, gic=a.gic)
    rows: list[dict[str, Any]] = []
    biggest: dict[str, float] = {}
    # The rows so far, for a run that is cut short.
    partial = a.out.with_suffix(".partial.json")
    partial.parent.mkdir(parents=True, exist_ok=True)

    def run_all(method: str, one: Callable[[str, int, str], dict[str, Any]]) -> None:
        for state in states:
            for n in counts:
                if why := fits(method, n, biggest):
                    rows.append({"method": method, "state": state, "n": n, "skipped": why, "load": load()})
                    print(f"{method} {state} N={n}: skipped, {why}", file=sys.stderr)
                    continue
                for i in range(a.runs):
                    initials = "".join(w[0] for w in method.split("-"))
                    name = f"{initials}{state[0]}{n}r{i}"
                    r = {"method": method, "state": state, "n": n, "run": i} | one(state, n, name)
                    rows.append(r)
                    partial.write_text(json.dumps(rows) + "\n")
                    rss = [(u + 0.0) / 1024 for u in r["uss_kib"]]
                    biggest[method] = max([biggest.get(method, 0.0), *rss])
                    print(
                        f"{method} {state} N={n} run {i}: ready {r['ready_ms']} ms, running {r['running_ms']} ms, "
                        f"USS median {med(r['uss_kib'])} KiB, load {r['load']}",
                        file=sys.stderr,
                    )

    with tempfile.TemporaryDirectory(prefix="ignition-bench-branch-") as tmp:
        work = Path(tmp)
        store = work / "store"
        if {"branch", "branch-exec", "hand"} & set(methods):
            extra = ["--branch-limit", str(max(counts))] + (["--net", "passt"] if a.net == "passt" else [])
            with source(cfg, work, a.mem, extra) as vm:

                def ignition(method: str) -> Callable[[str, int, str], dict[str, Any]]:
                    def one(state: str, n: int, name: str) -> dict[str, Any]:
                        dirty_s = dirty(vm) if state == "dirty" else None
                        if method == "branch":
                            r = one_branch(vm, store, n, name)
                        elif method == "branch-exec":
                            r = one_branch(vm, store, n, name, start="exec")
                        else:
                            r = one_by_hand(cfg, vm, store, n, name, a.timeout, a.net == "passt")
                        return r | {"dirty_s": dirty_s}

                    return one

                for method in ("branch", "branch-exec", "hand"):
                    if method in methods:
                        run_all(method, ignition(method))
        if "qemu" in methods:
            with qemu_source(work, a.mem, a.timeout) as src:
                qdrain = console.Drain(src.child)

                def one_q(state: str, n: int, name: str) -> dict[str, Any]:
                    dirty_s = None
                    if state == "dirty":
                        t = time.perf_counter()
                        with qdrain.paused():
                            console.run(src.child, DIRTY_CMD, timeout=600)
                        dirty_s = time.perf_counter() - t
                    return one_qemu(src, n, name, a.timeout) | {"dirty_s": dirty_s}

                run_all("qemu", one_q)
                qdrain.close()
    summary = summarize(rows)
    result = {
        "host": host.summary() | {"cpu_model": host.cpu_model(), "mem_available_mib": mem_available_mib()},
        "backend": a.backend,
        "gic": a.gic,
        "mem_mib": a.mem,
        "runs": a.runs,
        "dirty_mib": DIRTY_MIB,
        "net": a.net,
        "rows": rows,
        "summary": summary,
    }
    write_report(a.out, result, [table(summary)])
    partial.unlink(missing_ok=True)
    if a.plot:
        plot(result, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
