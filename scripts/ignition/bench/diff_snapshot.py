"""Benchmark (not a test): the cost and the payoff of diff snapshots, in one run.

On the portable `emu` backend (or any --backend), one table per measurement
below, each figure the median of N runs with min and max:

  0. Host disk: sequential write bandwidth (256 MiB, fsync) into the store's
     directory, so snapshot write times can be read as a fraction of it.
  1. Boot, untracked vs --track-dirty: `Guest-boot-time` and wall spawn -> `login:`.
     In the same boot, in-guest `dd if=/dev/zero of=/dev/shm/blob bs=1M count=64`
     throughput, timed in the guest (busybox dd prints no rate).
  2. Snapshot write: a full layer (fresh boot, whole RAM) vs diffs after dirtying
     8 and 64 MiB of /dev/shm, and after writing 8 MiB to a file on the root disk
     (then `sync`), in a restore of the root with --track-dirty:
     `Snapshot-write-time`, the pages of the `[snapshot]` line, the disk chunks
     hashed (`Snapshot-disk-clone`), and (separately) wall Ctrl-A s -> that
     console line.
  3. Restore of 1, 2 and 4 layers (golden, golden+1, golden+3): `Restore-time`,
     the `Restore-stages` medians, and wall spawn -> the shell prompt answering
     an Enter sent once the restore is logged.
  4. Footprint: logical (st_size) and physical (st_blocks*512) size of each
     layer's memory.bin, of each layer and of the whole store.

Everything runs on throwaway copies: a store (default bench-results/vmstore-bench,
removed at start and end) and disk copies in a temporary directory next to it;
guest/out is only read. Writes bench-results/diff_snapshot.json and
bench-results/diff_snapshot.md; console logs go to bench-results/logs/diff_snapshot/.

    python3 -m ignition.bench.diff_snapshot                 # N=3, 512 MiB, emu
    python3 -m ignition.bench.diff_snapshot --runs 5 --mem 1024

Timeouts are the backend's (scripts/ignition/timeouts.py); on a slow host set
IGNITION_TIMEOUT_SCALE (e.g. 2).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import pexpect

from ignition import console, host
from ignition import store as vmstore
from ignition.diff_snapshot_report import (
    BANDWIDTH_MIB,
    CHAIN_DEPTH,
    CHAIN_MIB,
    DD_MIB,
    DIFF_MIB,
    DISK_WRITE_MIB,
    MIB,
    RESTORE_SPECS,
    report,
    summarize_all,
)
from ignition.paths import DEFAULT_BOOT, GUEST_OUT, RESULTS_DIR
from ignition.paths import REPO_ROOT as REPO
from ignition.stats import sha256
from ignition.vm import Vm, VmConfig

DEFAULT_STORE = RESULTS_DIR / "vmstore-bench"
LOG_DIR = RESULTS_DIR / "logs" / "diff_snapshot"

# The guest's clock in microseconds, from busybox adjtimex (date has no %N here).
GUEST_CLOCK = r"adjtimex | sed -n 's/^ *time\.tv_[a-z]*: *//p'"


class StepError(Exception):
    """A named step of the benchmark failed."""


# --- the benchmark ---------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp  # disk copies
        # A private copy of the binary: a rebuild during the run cannot mix two builds.
        self.boot = tmp / "boot"
        shutil.copy2(args.boot, self.boot)
        self.cfg = VmConfig(boot=self.boot, backend=args.backend, kernel=args.kernel)
        self.store = args.store
        self.vms: list[Vm] = []
        self.step_name = "setup"
        self.log: Path | None = None
        self.seq = 0

    # step bookkeeping and process handling

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Runs a step; any failure becomes a StepError naming it (and its console log)."""
        self.step_name, self.log = name, None
        try:
            yield
        except StepError:
            self.kill_all()
            raise
        except (
            console.ConsoleError,
            OSError,
            ValueError,
            AssertionError,
            subprocess.SubprocessError,
            pexpect.ExceptionPexpect,
        ) as e:
            self.kill_all()
            where = f" (console log: {self.log})" if self.log else ""
            raise StepError(f"step '{name}' failed{where}:\n{type(e).__name__}: {e}") from None

    def kill_all(self) -> None:
        for vm in list(self.vms):
            self.kill(vm)

    def next_log(self, tag: str) -> Path:
        """The console log of the next VM: LOG_DIR/NN-tag.log."""
        self.seq += 1
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log = LOG_DIR / f"{self.seq:02d}-{tag}.log"
        return self.log

    def started(self, vm: Vm) -> Vm:
        """Registers a VM for kill_all."""
        self.vms.append(vm)
        return vm

    def kill(self, vm: Vm) -> None:
        try:
            vm.terminate()
        finally:
            if vm in self.vms:
                self.vms.remove(vm)

    def quit_vm(self, vm: Vm) -> None:
        """Ctrl-A x; the VMM must exit with status 0."""
        status = vm.quit()
        self.vms.remove(vm)
        if status != 0:
            raise console.ConsoleError(f"boot exited with status {status} after Ctrl-A x")

    def disk_copy(self, tag: str) -> Path:
        """A sparse copy of the guest's root disk (made before any clock starts)."""
        dst = self.tmp / f"{tag}.ext4"
        subprocess.run(["cp", "--sparse=always", str(self.args.disk), str(dst)], check=True)
        return dst

    # console pieces

    @staticmethod
    def snapshot(vm: Vm, kind: str, name: str) -> dict[str, Any]:
        """Ctrl-A s; returns the VMM's write time, pages, disk clone method, and wall to the line."""
        snap = vm.snapshot(name, kind)
        return {
            "write_ms": snap.write_ms,
            "pages": snap.pages,
            "mib": snap.mib,
            "disk_clone": snap.disk.method,
            "disk_chunks_hashed": snap.disk.chunks_hashed,
            "disk_chunks": snap.disk.chunks,
            "console_wall_s": snap.console_wall_s,
        }

    def restore(self, spec: str, tag: str, name: str | None = None) -> tuple[Vm, dict[str, Any]]:
        """Spawns `boot --restore spec` (with --track-dirty when naming a snapshot), waits for its
        log lines, presses Enter, waits for the prompt.

        `restore_ms` is the whole-ms `Restore-time`, `total_us` the same total in µs and
        `stages_us` its stages. Opening the chain's disk under the VM's overlay (nothing is
        copied) is part of the resolve stage; its own time is `disk_us`.
        """
        vm = self.started(
            Vm.restore(
                self.cfg,
                spec,
                store=self.store,
                name=name,
                track_dirty=name is not None,
                log_path=self.next_log(tag),
                wait=False,
            )
        )
        x = vm.wait_restored()
        r = {
            "restore_ms": x.restore_ms,
            "total_us": x.total_us,
            "disk_us": x.disk_us,
            "stages_us": x.stages.stages_us,
            "parallel_us": x.stages.parallel_us,
            "wall_s": x.wall_s,
            "logged_wall_s": x.logged_wall_s,
            "enter_to_prompt_s": x.wall_s - x.logged_wall_s,
        }
        return vm, r

    def dd_in_guest(self, vm: Vm, path: str, mib: int) -> dict[str, Any]:
        """dd of mib MiB of zeros to a file, timed by the guest's clock (and the host's, around it)."""
        cmd = (
            f"a=$({GUEST_CLOCK}); dd if=/dev/zero of={path} bs=1M count={mib} 2>/dev/null; "
            f"s=$?; b=$({GUEST_CLOCK}); echo dd-clock $a $b; test $s = 0"
        )
        t0 = time.perf_counter()
        out = vm.sh(cmd)
        host = time.perf_counter() - t0
        m = re.search(r"dd-clock (\d+) (\d+) (\d+) (\d+)", out)
        if not m:
            raise console.ConsoleError(f"cannot read the guest clock around dd; output:\n{out}")
        s0, u0, s1, u1 = map(int, m.groups())
        secs = (s1 - s0) + (u1 - u0) / 1e6
        if secs <= 0:
            raise console.ConsoleError(f"the guest clock did not advance across dd: {out!r}")
        return {"guest_s": secs, "mb_per_s": mib * MIB / 1e6 / secs, "host_command_wall_s": host}

    # phases

    def disk_bandwidth(self, runs: int, when: str) -> list[dict[str, Any]]:
        """Sequential write of BANDWIDTH_MIB with fsync into a new file in the store's directory, N times.

        The files are kept until the batch ends, so that (like a snapshot) every
        sample writes into newly allocated page cache rather than reusing the
        pages a deleted previous sample freed.
        """
        out: list[dict[str, Any]] = []
        buf = os.urandom(MIB)
        paths: list[Path] = []
        try:
            self._bandwidth_samples(runs, when, buf, paths, out)
        finally:
            for q in paths:
                q.unlink(missing_ok=True)
        return out

    def _bandwidth_samples(
        self, runs: int, when: str, buf: bytes, paths: list[Path], out: list[dict[str, Any]]
    ) -> None:
        for i in range(runs):
            path = self.store / f".bench-bandwidth-{when}-{i + 1}"
            paths.append(path)
            with self.step(f"disk bandwidth ({when}) run {i + 1}"):
                t0 = time.perf_counter()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    for _ in range(BANDWIDTH_MIB):
                        os.write(fd, buf)
                    t_buffered = time.perf_counter() - t0
                    os.fsync(fd)
                finally:
                    os.close(fd)
                secs = time.perf_counter() - t0
                # The store hashes every file it writes (sha256): the host's hashing rate, for scale.
                h = hashlib.sha256()
                t1 = time.perf_counter()
                for _ in range(BANDWIDTH_MIB):
                    h.update(buf)
                hash_s = time.perf_counter() - t1
                out.append(
                    {
                        "s": secs,
                        "mb_per_s": BANDWIDTH_MIB * MIB / 1e6 / secs,
                        "buffered_s": t_buffered,
                        "when": when,
                        "sha256_mb_per_s": BANDWIDTH_MIB * MIB / 1e6 / hash_s,
                    }
                )
                print(
                    f"disk bandwidth ({when}) {i + 1}/{runs}: {BANDWIDTH_MIB} MiB + fsync in {secs * 1000:.0f} ms "
                    f"(write() {t_buffered * 1000:.0f} ms) "
                    f"= {out[-1]['mb_per_s']:.0f} MB/s; sha256 {out[-1]['sha256_mb_per_s']:.0f} MB/s"
                )

    def boot_and_dd(self, tracked: bool, i: int) -> dict[str, Any]:
        mode = "tracked" if tracked else "untracked"
        with self.step(f"boot {mode} run {i + 1}"):
            disk = self.disk_copy(f"boot-{mode}-{i + 1}")
            vm = self.started(
                Vm.boot(
                    self.cfg,
                    disk=disk,
                    mem=self.args.mem,
                    track_dirty=tracked,
                    log_path=self.next_log(f"boot-{mode}-{i + 1}"),
                )
            )
            guest_ms = vm.guest_boot_time_ms()
            wall = vm.wait_login()
            vm.login()
        with self.step(f"dd {DD_MIB} MiB to /dev/shm, {mode} run {i + 1}"):
            dd = self.dd_in_guest(vm, "/dev/shm/blob", DD_MIB)
            self.quit_vm(vm)
            disk.unlink()
        print(
            f"boot {mode:9} {i + 1}/{self.args.runs}: Guest-boot-time {guest_ms} ms, login {wall * 1000:.0f} ms; "
            f"dd {DD_MIB} MiB {dd['mb_per_s']:.0f} MB/s ({dd['guest_s'] * 1000:.0f} ms)"
        )
        return {"guest_boot_ms": guest_ms, "login_wall_s": wall, "dd": dd}

    def full_snapshot(self, name: str, i: int) -> dict[str, Any]:
        with self.step(f"full snapshot '{name}' (run {i + 1})"):
            disk = self.disk_copy(name)
            vm = self.started(
                Vm.boot(
                    self.cfg,
                    disk=disk,
                    mem=self.args.mem,
                    store=self.store,
                    name=name,
                    track_dirty=True,
                    log_path=self.next_log(f"full-{name}"),
                )
            )
            vm.login()
            # A prepared base image is synced: its restored children then start
            # with nothing left to write back, so a diff whose guest did not
            # write its disk reuses the parent's disk image (and hash).
            vm.sh("sync")
            snap = self.snapshot(vm, "full", name)
            self.quit_vm(vm)
            disk.unlink()
        print(
            f"full  {name:10} {i + 1}/{self.args.runs}: Snapshot-write-time {snap['write_ms']} ms, "
            f"{snap['pages']} pages, Ctrl-A s -> line {snap['console_wall_s'] * 1000:.0f} ms ({snap['disk_clone']})"
        )
        return snap

    def diff_snapshot(self, parent: str, name: str, mib: int, label: str) -> dict[str, Any]:
        with self.step(f"diff snapshot '{name}' ({label}: restore '{parent}', dirty {mib} MiB, Ctrl-A s)"):
            vm, r = self.restore(parent, f"diff-{name}", name)
            vm.sh(f"dd if=/dev/zero of=/dev/shm/{name} bs=1M count={mib} 2>/dev/null")
            snap = self.snapshot(vm, "diff", name)
            self.quit_vm(vm)
        snap["dirtied_mib"] = mib
        snap["restore_of_parent"] = r
        print(
            f"diff  {name:10} ({label}): Snapshot-write-time {snap['write_ms']} ms, {snap['pages']} pages, "
            f"Ctrl-A s -> line {snap['console_wall_s'] * 1000:.0f} ms"
        )
        return snap

    def disk_diff_snapshot(self, parent: str, name: str, mib: int, label: str) -> dict[str, Any]:
        """Like diff_snapshot, but the guest writes mib MiB to a file on its root disk and syncs."""
        with self.step(f"diff snapshot '{name}' ({label}: restore '{parent}', write {mib} MiB to /, sync, Ctrl-A s)"):
            vm, r = self.restore(parent, f"diff-{name}", name)
            vm.sh(f"dd if=/dev/zero of=/root/{name} bs=1M count={mib} 2>/dev/null && sync")
            snap = self.snapshot(vm, "diff", name)
            self.quit_vm(vm)
        snap["disk_written_mib"] = mib
        snap["restore_of_parent"] = r
        print(
            f"diff  {name:10} ({label}): Snapshot-write-time {snap['write_ms']} ms, {snap['pages']} pages, "
            f"{snap['disk_chunks_hashed']} of {snap['disk_chunks']} disk chunks hashed, "
            f"Ctrl-A s -> line {snap['console_wall_s'] * 1000:.0f} ms"
        )
        return snap

    def timed_restore(self, spec: str, layers: int, expect_files: list[str], i: int) -> dict[str, Any]:
        with self.step(f"restore '{spec}' ({layers} layers) run {i + 1}"):
            vm, r = self.restore(spec, f"restore-{spec}-{i + 1}")
            # Not timed: the restored guest must hold exactly the chain's files.
            got = vm.sh("ls /dev/shm").split()
            if sorted(got) != sorted(expect_files):
                raise AssertionError(f"/dev/shm after restoring '{spec}' holds {got}, expected {expect_files}")
            self.quit_vm(vm)
        named = sum(r["stages_us"].values())
        r["unattributed_us"] = max(0, r["total_us"] - named)
        top = max(r["stages_us"], key=r["stages_us"].get)
        print(
            f"restore {spec:9} {i + 1}/{self.args.restore_runs}: Restore-time {r['restore_ms']} ms "
            f"(largest stage: {top} {r['stages_us'][top] / 1000:.0f} ms), wall to prompt {r['wall_s'] * 1000:.0f} ms"
        )
        return r

    def layer_footprint(self, name: str) -> dict[str, Any]:
        d = self.store / name
        files = {p.name: vmstore.file_sizes(p) for p in sorted(d.iterdir()) if p.is_file()}
        return {"files": files, "total": vmstore.tree_sizes(d)}

    def remove_layer(self, name: str) -> None:
        vmstore.remove_tree(self.store / name)

    def run(self) -> dict[str, Any]:
        n = self.args.runs
        res: dict[str, Any] = {}
        t_start = time.perf_counter()

        print(f"== host disk: sequential write bandwidth ({BANDWIDTH_MIB} MiB + fsync, {self.store})")
        res["disk_bandwidth"] = self.disk_bandwidth(n, "start")

        print("== boot and in-guest dd, untracked vs --track-dirty (interleaved)")
        boots: dict[str, list[dict[str, Any]]] = {"untracked": [], "tracked": []}
        for i in range(n):
            for tracked in (False, True):
                boots["tracked" if tracked else "untracked"].append(self.boot_and_dd(tracked, i))
        res["boot"] = boots

        print("== snapshot write: full (fresh boot) and diffs of the golden root")
        full_names = ["golden"] + [f"full-{i + 1}" for i in range(1, n)]
        res["full"] = [self.full_snapshot(name, i) for i, name in enumerate(full_names)]
        diffs: dict[str, Any] = {str(m): [] for m in DIFF_MIB}
        disk_diffs = []
        for i in range(n):
            for mib in DIFF_MIB:
                diffs[str(mib)].append(self.diff_snapshot("golden", f"w{mib}-{i + 1}", mib, f"write run {i + 1}"))
            disk_diffs.append(
                self.disk_diff_snapshot("golden", f"wd{DISK_WRITE_MIB}-{i + 1}", DISK_WRITE_MIB, f"write run {i + 1}")
            )
        res["diff"] = diffs
        res["disk_diff"] = disk_diffs

        # Footprint of the write-measurement layers, then remove them so golden
        # has a single child chain for golden+N.
        extra = [
            *full_names[1:],
            *(f"w{m}-{i + 1}" for m in DIFF_MIB for i in range(n)),
            *(f"wd{DISK_WRITE_MIB}-{i + 1}" for i in range(n)),
        ]
        with self.step("footprint of the write-measurement layers"):
            res["write_layers_footprint"] = {name: self.layer_footprint(name) for name in extra}
            for name in extra:
                self.remove_layer(name)

        print(f"== restore chain: golden -> d1 .. d{CHAIN_DEPTH} ({CHAIN_MIB} MiB dirtied per layer)")
        chain = []
        parent = "golden"
        for k in range(1, CHAIN_DEPTH + 1):
            chain.append(self.diff_snapshot(parent, f"d{k}", CHAIN_MIB, f"chain layer {k}"))
            parent = f"d{k}"
        res["chain_build"] = chain

        print("== restore by chain depth (interleaved)")
        restores: dict[str, Any] = {spec: [] for spec, _ in RESTORE_SPECS}
        for i in range(self.args.restore_runs):
            for spec, layers in RESTORE_SPECS:
                files = [f"d{k}" for k in range(1, layers)]
                restores[spec].append(self.timed_restore(spec, layers, files, i))
        res["restore"] = restores

        with self.step("footprint of the store"):
            chain_layers = ["golden", *(f"d{k}" for k in range(1, CHAIN_DEPTH + 1))]
            res["footprint"] = {
                "layers": {name: self.layer_footprint(name) for name in chain_layers},
                "store": vmstore.tree_sizes(self.store),
                "store_entries": sorted(p.name for p in self.store.iterdir()),
            }
        print("== host disk again (the host is shared: bandwidth drifts)")
        res["disk_bandwidth"] += self.disk_bandwidth(n, "end")
        res["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        res["loadavg_end"] = os.getloadavg()
        return res


def host_info(args: argparse.Namespace) -> dict[str, Any]:
    boot = args.boot.resolve()
    fs = host.sh(["df", "-T", str(args.store)]).splitlines()
    store_fs = fs[-1].split()[1] if len(fs) >= 2 and len(fs[-1].split()) > 1 else "unknown"
    head = host.sh(["git", "rev-parse", "HEAD"])
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg_start": os.getloadavg(),
        "uname": host.sh(["uname", "-a"]) or " ".join(platform.uname()),
        "cpu_count": os.cpu_count(),
        "cpu_model": host.cpu_model(),
        "host_mem_mib": host.mem_total_mib(),
        "store_fs": store_fs,
        "boot": str(boot.relative_to(REPO)) if boot.is_relative_to(REPO) else str(boot),
        "boot_sha256": sha256(boot),
        "boot_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(boot.stat().st_mtime)),
        "boot_version": host.sh([str(boot), "--version"]),
        "profile": "release" if "release" in boot.parts else ("debug" if "debug" in boot.parts else "unknown"),
        "git_head": head or "unknown",
        "git_dirty": bool(host.sh(["git", "status", "--porcelain", "--untracked-files=no"])),
        "backend": args.backend,
        "mem_mib": args.mem,
        "cpus": 1,
        "runs": args.runs,
        "restore_runs": args.restore_runs,
        "store": str(args.store),
        "kernel_sha256": sha256(args.kernel),
        "disk_sha256": sha256(args.disk),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.diff_snapshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=3, help="runs per measurement (default: 3)")
    p.add_argument(
        "--restore-runs",
        type=int,
        default=15,
        help="runs per restore target (default: 15; restores are cheap, and a few ms are easily "
        "disturbed on a shared host)",
    )
    p.add_argument("--mem", type=int, default=512, help="guest RAM in MiB (default: 512)")
    p.add_argument("--boot", type=Path, default=DEFAULT_BOOT, help="the boot binary (default: target/release/boot)")
    p.add_argument("--backend", default="emu", choices=["emu", "hvf"], help="Ignition backend (default: emu)")
    p.add_argument("--kernel", type=Path, default=GUEST_OUT / "Image")
    p.add_argument("--disk", type=Path, default=GUEST_OUT / "rootfs.ext4", help="root disk (copied, never modified)")
    p.add_argument(
        "--store",
        type=Path,
        default=DEFAULT_STORE,
        help="throwaway snapshot store, removed at start and end (default: bench-results/vmstore-bench)",
    )
    p.add_argument("--keep-store", action="store_true", help="leave the store in place at the end (for inspection)")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / "diff_snapshot.json",
        help="JSON results (default: bench-results/diff_snapshot.json); the Markdown goes next to it (.md)",
    )
    p.add_argument(
        "--from-json",
        type=Path,
        metavar="JSON",
        help="run nothing: rewrite the Markdown report of an earlier run's JSON (next to it)",
    )
    args = p.parse_args(argv)
    if args.from_json:
        prev = json.loads(args.from_json.read_text())
        md_path = args.from_json.with_suffix(".md")
        md_path.write_text(report(prev["raw"], prev["summary"], prev["config"]))
        print(f"wrote {md_path}")
        return 0
    if args.runs < 1 or args.restore_runs < 1:
        p.error("--runs and --restore-runs must be >= 1")
    if args.mem < 256:
        p.error("--mem must be >= 256 (the 64 MiB dd and diff need room in /dev/shm)")
    for f, hint in (
        (args.boot, "cargo build --release --bin boot"),
        (args.kernel, "guest/build.sh"),
        (args.disk, "guest/build.sh"),
    ):
        if not f.is_file():
            print(f"diff_snapshot_bench: {f} not found ({hint})", file=sys.stderr)
            return 1
    args.store = args.store.resolve()
    if args.store == REPO or REPO.is_relative_to(args.store) or args.store.is_relative_to(GUEST_OUT.resolve()):
        p.error(f"refusing to use {args.store} as the throwaway store")

    def on_signal(signum: int, _frame: FrameType | None) -> NoReturn:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    def wipe_store() -> None:
        if args.store.exists():
            vmstore.remove_tree(args.store)

    wipe_store()
    args.store.mkdir(parents=True)
    shutil.rmtree(LOG_DIR, ignore_errors=True)  # logs of this run only
    info = host_info(args)
    bench = None
    try:
        with tempfile.TemporaryDirectory(prefix="diffsnap-disks-", dir=args.store.parent) as tmp:
            bench = Bench(args, Path(tmp))
            raw = bench.run()
        info["page_size"] = json.loads((args.store / "golden" / "manifest.json").read_text())["page_size"]
    except StepError as e:
        print(f"diff_snapshot_bench: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        step = bench.step_name if bench else "setup"
        print(f"diff_snapshot_bench: interrupted during step '{step}' ({e or 'Ctrl-C'})", file=sys.stderr)
        return 130
    finally:
        if bench:
            bench.kill_all()
        if not args.keep_store:
            wipe_store()

    summary = summarize_all(raw, args.runs)
    result = {
        "benchmark": "diff_snapshot",
        "config": info,
        "summary": summary,
        "raw": raw,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")  # insertion order: the report's order
    md = report(raw, summary, info)
    md_path = args.out.with_suffix(".md")
    md_path.write_text(md)
    print()
    print(md)
    print(f"wrote {args.out} and {md_path}; console logs in {LOG_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
