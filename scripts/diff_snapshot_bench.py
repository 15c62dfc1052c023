#!/usr/bin/env python3
"""Benchmark (not a test): the cost and the payoff of diff snapshots, in one run.

Reproduces, on the portable `emu` backend (or any --backend), the tables of the
earlier spike's write-up (shared/seeds/003): median of N runs with min and max.

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

    scripts/diff_snapshot_bench.py                 # N=3, 512 MiB, emu
    scripts/diff_snapshot_bench.py --runs 5 --mem 1024
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
from pathlib import Path
from typing import Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ignition import console as harness  # noqa: E402
import pexpect  # noqa: E402
from ignition.paths import DEFAULT_BOOT, GUEST_OUT, REPO_ROOT as REPO, RESULTS_DIR  # noqa: E402
from ignition.diff_snapshot_report import (  # noqa: E402
    BANDWIDTH_MIB, CHAIN_DEPTH, CHAIN_MIB, DD_MIB, DIFF_MIB, DISK_WRITE_MIB, MIB, RESTORE_SPECS, report,
    summarize_all)
from ignition.stats import sha256  # noqa: E402

DEFAULT_STORE = RESULTS_DIR / "vmstore-bench"
LOG_DIR = RESULTS_DIR / "logs" / "diff_snapshot"

# Generous: `emu` is a software CPU on a small machine that other jobs share.
BOOT_TIMEOUT = 240.0  # spawn -> login: / restore logged
CMD_TIMEOUT = 180.0  # one shell command, a snapshot write, an exit

# The guest's clock in microseconds, from busybox adjtimex (date has no %N here).
GUEST_CLOCK = r"adjtimex | sed -n 's/^ *time\.tv_[a-z]*: *//p'"


def parse_disk_clone(text: str) -> dict:
    """`METHOD (H of N chunks hashed[: note])`, the value of a `Snapshot-disk-clone` line."""
    m = re.fullmatch(r"(.+?) \((\d+) of (\d+) chunks hashed(?:: ([^)]*))?\)", text.strip())
    if not m:
        raise ValueError(f"cannot parse Snapshot-disk-clone value {text!r}")
    return {"method": m.group(1), "chunks_hashed": int(m.group(2)), "chunks": int(m.group(3)),
            "reused": m.group(4) is not None}


class StepError(Exception):
    """A named step of the benchmark failed."""


# --- small helpers ---------------------------------------------------------------------------


def sh(argv: Sequence[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def file_sizes(path: Path) -> dict:
    st = path.stat()
    return {"logical": st.st_size, "physical": st.st_blocks * 512}


def tree_sizes(root: Path) -> dict:
    """Summed st_size and st_blocks*512 of every regular file (hard links once)."""
    logical = physical = 0
    seen = set()
    for p in root.rglob("*"):
        st = p.lstat()
        if not p.is_file() or p.is_symlink() or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        logical += st.st_size
        physical += st.st_blocks * 512
    return {"logical": logical, "physical": physical}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def mem_total_mib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# --- the benchmark ---------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path):
        self.args = args
        self.tmp = tmp  # disk copies
        # A private copy of the binary: a rebuild during the run cannot mix two builds.
        self.boot = tmp / "boot"
        shutil.copy2(args.boot, self.boot)
        self.store = args.store
        self.children: list = []
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
        except (harness.ConsoleError, OSError, ValueError, AssertionError, subprocess.SubprocessError,
                pexpect.ExceptionPexpect) as e:
            self.kill_all()
            where = f" (console log: {self.log})" if self.log else ""
            raise StepError(f"step '{name}' failed{where}:\n{type(e).__name__}: {e}") from None

    def kill_all(self) -> None:
        for c in list(self.children):
            self.kill(c)

    def spawn(self, argv: Sequence[str], tag: str):
        self.seq += 1
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.log = LOG_DIR / f"{self.seq:02d}-{tag}.log"
        child = harness.spawn(argv, log_path=self.log, timeout=BOOT_TIMEOUT)
        self.children.append(child)
        return child

    def kill(self, child) -> None:
        try:
            harness.terminate(child)
        finally:
            if child in self.children:
                self.children.remove(child)

    def quit_vm(self, child) -> None:
        """Ctrl-A x; the VMM must exit with status 0."""
        child.send("\x01x")
        status = harness.wait_exit(child, CMD_TIMEOUT)
        self.children.remove(child)
        if status != 0:
            raise harness.ConsoleError(f"boot exited with status {status} after Ctrl-A x")

    def base_argv(self) -> list[str]:
        return [str(self.boot), "--backend", self.args.backend]

    def disk_copy(self, tag: str) -> Path:
        """A sparse copy of the guest's root disk (made before any clock starts)."""
        dst = self.tmp / f"{tag}.ext4"
        subprocess.run(["cp", "--sparse=always", str(self.args.disk), str(dst)], check=True)
        return dst

    # console pieces

    @staticmethod
    def login_at_prompt(child) -> None:
        """Log in as root once `login:` has been matched (harness.login would wait for it again)."""
        harness.paced_send(child, "root\n")
        if harness.expect(child, [harness.PASSWORD, harness.PROMPT], BOOT_TIMEOUT,
                          "a password prompt or the shell prompt") == 0:
            harness.paced_send(child, "\n")
            harness.expect(child, harness.PROMPT, BOOT_TIMEOUT, "the shell prompt after the password")

    @staticmethod
    def snapshot(child, kind: str, name: str) -> dict:
        """Ctrl-A s; returns the VMM's write time, pages, disk clone method, and wall to the line."""
        t0 = time.perf_counter()
        child.send("\x01s")
        failed = r"\[snapshot\][^\r\n]*(?:failed|refused)[^\r\n]*"
        i = harness.expect(child, [r"Snapshot-write-time = (\d+) ms", failed], CMD_TIMEOUT,
                           f"Snapshot-write-time of '{name}'")
        if i == 1:
            raise harness.ConsoleError(f"the VMM refused the snapshot: {child.match.group(0).strip()}")
        write_ms = int(child.match.group(1))
        harness.expect(child, r"Snapshot-disk-clone = ([^\r\n]+)\r*\n", CMD_TIMEOUT, "Snapshot-disk-clone")
        clone = child.match.group(1).strip()
        disk = parse_disk_clone(clone)
        harness.expect(child, rf"\[snapshot\] (full|diff) '{re.escape(name)}' \((\d+) pages, ([0-9.]+) MiB\) written",
                       CMD_TIMEOUT, f"the [snapshot] line of '{name}'")
        wall = time.perf_counter() - t0
        got = child.match.group(1)
        if got != kind:
            raise harness.ConsoleError(f"expected a {kind} snapshot of '{name}', the VMM wrote a {got}")
        return {"write_ms": write_ms, "pages": int(child.match.group(2)), "mib": float(child.match.group(3)),
                "disk_clone": disk["method"], "disk_chunks_hashed": disk["chunks_hashed"],
                "disk_chunks": disk["chunks"], "console_wall_s": wall}

    @staticmethod
    def restore_logged(child) -> dict:
        """Waits for `Restore-time`, `Restore-stages` and `Restore-disk-copy`; returns them.

        `restore_ms` is the whole-ms `Restore-time`, `total_us` the same total in µs and
        `stages_us` its stages. The working disk is copied on its own thread while the restore
        goes on and after the guest starts (its first disk request waits for it): the copy's
        own time is `disk_copy_us`, and `disk_ready_us` is when it finished, from restore start.
        The disk line may come before or after the others.
        """
        pats = [r"Restore-time = (\d+) ms", r"Restore-stages: ([^\r\n]*)\r*\n",
                r"Restore-disk-copy = (\d+) us \([^)]*\); ready (\d+) us after restore start"]
        seen: dict[int, re.Match] = {}
        while len(seen) < len(pats):
            i = harness.expect(child, pats, BOOT_TIMEOUT, "the Restore-time, -stages and -disk-copy lines")
            seen[i] = child.match
        total_ms = int(seen[0].group(1))
        # "NAME N us", or "NAME N us (OTHER M us)" for work on another thread (not a stage).
        stages, parallel, total_us = {}, {}, None
        for part in seen[1].group(1).split(","):
            m = re.fullmatch(r"\s*(.+?) (\d+) us(?: \((.+?) (\d+) us\))?\s*", part)
            if not m:
                raise harness.ConsoleError(f"cannot parse Restore-stages item {part!r}")
            if m.group(1) == "total":
                total_us = int(m.group(2))
            else:
                stages[m.group(1)] = int(m.group(2))
            if m.group(3):
                parallel[m.group(3)] = int(m.group(4))
        if total_us is None:
            raise harness.ConsoleError("Restore-stages lacks the total")
        return {"restore_ms": total_ms, "total_us": total_us, "disk_copy_us": int(seen[2].group(1)),
                "disk_ready_us": int(seen[2].group(2)), "stages_us": stages, "parallel_us": parallel}

    def restore(self, spec: str, tag: str, *extra: str) -> tuple:
        """Spawns `boot --restore spec`, waits for its log lines, presses Enter, waits for the prompt."""
        argv = [*self.base_argv(), "--store", str(self.store), "--restore", spec, *extra]
        t0 = time.perf_counter()
        child = self.spawn(argv, tag)
        r = self.restore_logged(child)
        t_logged = time.perf_counter()
        harness.paced_send(child, "\n")
        harness.expect(child, harness.PROMPT, CMD_TIMEOUT, "the shell prompt after Enter on the restored console")
        t_prompt = time.perf_counter()
        r.update(wall_s=t_prompt - t0, logged_wall_s=t_logged - t0, enter_to_prompt_s=t_prompt - t_logged)
        return child, r

    def dd_in_guest(self, child, path: str, mib: int) -> dict:
        """dd of mib MiB of zeros to a file, timed by the guest's clock (and the host's, around it)."""
        cmd = (f"a=$({GUEST_CLOCK}); dd if=/dev/zero of={path} bs=1M count={mib} 2>/dev/null; "
               f"s=$?; b=$({GUEST_CLOCK}); echo dd-clock $a $b; test $s = 0")
        t0 = time.perf_counter()
        out = harness.run(child, cmd, CMD_TIMEOUT)
        host = time.perf_counter() - t0
        m = re.search(r"dd-clock (\d+) (\d+) (\d+) (\d+)", out)
        if not m:
            raise harness.ConsoleError(f"cannot read the guest clock around dd; output:\n{out}")
        s0, u0, s1, u1 = map(int, m.groups())
        secs = (s1 - s0) + (u1 - u0) / 1e6
        if secs <= 0:
            raise harness.ConsoleError(f"the guest clock did not advance across dd: {out!r}")
        return {"guest_s": secs, "mb_per_s": mib * MIB / 1e6 / secs, "host_command_wall_s": host}

    # phases

    def disk_bandwidth(self, runs: int, when: str) -> list[dict]:
        """Sequential write of BANDWIDTH_MIB with fsync into a new file in the store's directory, N times.

        The files are kept until the batch ends, so that (like a snapshot) every
        sample writes into newly allocated page cache rather than reusing the
        pages a deleted previous sample freed.
        """
        out = []
        buf = os.urandom(MIB)
        paths = []
        try:
            self._bandwidth_samples(runs, when, buf, paths, out)
        finally:
            for q in paths:
                q.unlink(missing_ok=True)
        return out

    def _bandwidth_samples(self, runs, when, buf, paths, out) -> None:
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
                out.append({"s": secs, "mb_per_s": BANDWIDTH_MIB * MIB / 1e6 / secs, "buffered_s": t_buffered,
                            "when": when, "sha256_mb_per_s": BANDWIDTH_MIB * MIB / 1e6 / hash_s})
                print(f"disk bandwidth ({when}) {i + 1}/{runs}: {BANDWIDTH_MIB} MiB + fsync in {secs * 1000:.0f} ms "
                      f"(write() {t_buffered * 1000:.0f} ms) "
                      f"= {out[-1]['mb_per_s']:.0f} MB/s; sha256 {out[-1]['sha256_mb_per_s']:.0f} MB/s")

    def boot_and_dd(self, tracked: bool, i: int) -> dict:
        mode = "tracked" if tracked else "untracked"
        with self.step(f"boot {mode} run {i + 1}"):
            disk = self.disk_copy(f"boot-{mode}-{i + 1}")
            argv = [*self.base_argv(), "--kernel", str(self.args.kernel), "--disk", str(disk),
                    "--mem", str(self.args.mem)] + (["--track-dirty"] if tracked else [])
            t0 = time.perf_counter()
            child = self.spawn(argv, f"boot-{mode}-{i + 1}")
            harness.expect(child, r"Guest-boot-time = (\d+) ms", BOOT_TIMEOUT, "the Guest-boot-time line")
            guest_ms = int(child.match.group(1))
            harness.expect(child, harness.LOGIN, BOOT_TIMEOUT, "the login: prompt")
            wall = time.perf_counter() - t0
            self.login_at_prompt(child)
        with self.step(f"dd {DD_MIB} MiB to /dev/shm, {mode} run {i + 1}"):
            dd = self.dd_in_guest(child, "/dev/shm/blob", DD_MIB)
            self.quit_vm(child)
            disk.unlink()
        print(f"boot {mode:9} {i + 1}/{self.args.runs}: Guest-boot-time {guest_ms} ms, login {wall * 1000:.0f} ms; "
              f"dd {DD_MIB} MiB {dd['mb_per_s']:.0f} MB/s ({dd['guest_s'] * 1000:.0f} ms)")
        return {"guest_boot_ms": guest_ms, "login_wall_s": wall, "dd": dd}

    def full_snapshot(self, name: str, i: int) -> dict:
        with self.step(f"full snapshot '{name}' (run {i + 1})"):
            disk = self.disk_copy(name)
            argv = [*self.base_argv(), "--kernel", str(self.args.kernel), "--disk", str(disk),
                    "--mem", str(self.args.mem), "--store", str(self.store), "--track-dirty", "--name", name]
            child = self.spawn(argv, f"full-{name}")
            harness.login(child, timeout=BOOT_TIMEOUT)
            # A prepared base image is synced: its restored children then start
            # with nothing left to write back, so a diff whose guest did not
            # write its disk reuses the parent's disk image (and hash).
            harness.run(child, "sync", CMD_TIMEOUT)
            snap = self.snapshot(child, "full", name)
            self.quit_vm(child)
            disk.unlink()
        print(f"full  {name:10} {i + 1}/{self.args.runs}: Snapshot-write-time {snap['write_ms']} ms, "
              f"{snap['pages']} pages, Ctrl-A s -> line {snap['console_wall_s'] * 1000:.0f} ms ({snap['disk_clone']})")
        return snap

    def diff_snapshot(self, parent: str, name: str, mib: int, label: str) -> dict:
        with self.step(f"diff snapshot '{name}' ({label}: restore '{parent}', dirty {mib} MiB, Ctrl-A s)"):
            child, r = self.restore(parent, f"diff-{name}", "--track-dirty", "--name", name)
            harness.run(child, f"dd if=/dev/zero of=/dev/shm/{name} bs=1M count={mib} 2>/dev/null", CMD_TIMEOUT)
            snap = self.snapshot(child, "diff", name)
            self.quit_vm(child)
        snap["dirtied_mib"] = mib
        snap["restore_of_parent"] = r
        print(f"diff  {name:10} ({label}): Snapshot-write-time {snap['write_ms']} ms, {snap['pages']} pages, "
              f"Ctrl-A s -> line {snap['console_wall_s'] * 1000:.0f} ms")
        return snap

    def disk_diff_snapshot(self, parent: str, name: str, mib: int, label: str) -> dict:
        """Like diff_snapshot, but the guest writes mib MiB to a file on its root disk and syncs."""
        with self.step(f"diff snapshot '{name}' ({label}: restore '{parent}', write {mib} MiB to /, sync, Ctrl-A s)"):
            child, r = self.restore(parent, f"diff-{name}", "--track-dirty", "--name", name)
            harness.run(child, f"dd if=/dev/zero of=/root/{name} bs=1M count={mib} 2>/dev/null && sync",
                        CMD_TIMEOUT)
            snap = self.snapshot(child, "diff", name)
            self.quit_vm(child)
        snap["disk_written_mib"] = mib
        snap["restore_of_parent"] = r
        print(f"diff  {name:10} ({label}): Snapshot-write-time {snap['write_ms']} ms, {snap['pages']} pages, "
              f"{snap['disk_chunks_hashed']} of {snap['disk_chunks']} disk chunks hashed, "
              f"Ctrl-A s -> line {snap['console_wall_s'] * 1000:.0f} ms")
        return snap

    def timed_restore(self, spec: str, layers: int, expect_files: list[str], i: int) -> dict:
        with self.step(f"restore '{spec}' ({layers} layers) run {i + 1}"):
            child, r = self.restore(spec, f"restore-{spec}-{i + 1}")
            # Not timed: the restored guest must hold exactly the chain's files.
            got = harness.run(child, "ls /dev/shm", CMD_TIMEOUT).split()
            if sorted(got) != sorted(expect_files):
                raise AssertionError(f"/dev/shm after restoring '{spec}' holds {got}, expected {expect_files}")
            self.quit_vm(child)
        named = sum(r["stages_us"].values())
        r["unattributed_us"] = max(0, r["total_us"] - named)
        top = max(r["stages_us"], key=r["stages_us"].get)
        print(f"restore {spec:9} {i + 1}/{self.args.restore_runs}: Restore-time {r['restore_ms']} ms "
              f"(largest stage: {top} {r['stages_us'][top] / 1000:.0f} ms), wall to prompt {r['wall_s'] * 1000:.0f} ms")
        return r

    def layer_footprint(self, name: str) -> dict:
        d = self.store / name
        files = {p.name: file_sizes(p) for p in sorted(d.iterdir()) if p.is_file()}
        return {"files": files, "total": tree_sizes(d)}

    def remove_layer(self, name: str) -> None:
        d = self.store / name
        for p in [d, *d.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)
        shutil.rmtree(d)

    def run(self) -> dict:
        n = self.args.runs
        res: dict = {}
        t_start = time.perf_counter()

        print(f"== host disk: sequential write bandwidth ({BANDWIDTH_MIB} MiB + fsync, {self.store})")
        res["disk_bandwidth"] = self.disk_bandwidth(n, "start")

        print("== boot and in-guest dd, untracked vs --track-dirty (interleaved)")
        boots = {"untracked": [], "tracked": []}
        for i in range(n):
            for tracked in (False, True):
                boots["tracked" if tracked else "untracked"].append(self.boot_and_dd(tracked, i))
        res["boot"] = boots

        print("== snapshot write: full (fresh boot) and diffs of the golden root")
        full_names = ["golden"] + [f"full-{i + 1}" for i in range(1, n)]
        res["full"] = [self.full_snapshot(name, i) for i, name in enumerate(full_names)]
        diffs: dict = {str(m): [] for m in DIFF_MIB}
        disk_diffs = []
        for i in range(n):
            for mib in DIFF_MIB:
                diffs[str(mib)].append(self.diff_snapshot("golden", f"w{mib}-{i + 1}", mib, f"write run {i + 1}"))
            disk_diffs.append(self.disk_diff_snapshot("golden", f"wd{DISK_WRITE_MIB}-{i + 1}", DISK_WRITE_MIB,
                                                      f"write run {i + 1}"))
        res["diff"] = diffs
        res["disk_diff"] = disk_diffs

        # Footprint of the write-measurement layers, then remove them so golden
        # has a single child chain for golden+N.
        extra = [*full_names[1:], *(f"w{m}-{i + 1}" for m in DIFF_MIB for i in range(n)),
                 *(f"wd{DISK_WRITE_MIB}-{i + 1}" for i in range(n))]
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
        restores: dict = {spec: [] for spec, _ in RESTORE_SPECS}
        for i in range(self.args.restore_runs):
            for spec, layers in RESTORE_SPECS:
                files = [f"d{k}" for k in range(1, layers)]
                restores[spec].append(self.timed_restore(spec, layers, files, i))
        res["restore"] = restores

        with self.step("footprint of the store"):
            layers = ["golden", *(f"d{k}" for k in range(1, CHAIN_DEPTH + 1))]
            res["footprint"] = {
                "layers": {name: self.layer_footprint(name) for name in layers},
                "store": tree_sizes(self.store),
                "store_entries": sorted(p.name for p in self.store.iterdir()),
            }
        print("== host disk again (the host is shared: bandwidth drifts)")
        res["disk_bandwidth"] += self.disk_bandwidth(n, "end")
        res["elapsed_s"] = round(time.perf_counter() - t_start, 1)
        res["loadavg_end"] = os.getloadavg()
        return res


def host_info(args: argparse.Namespace) -> dict:
    boot = args.boot.resolve()
    fs = sh(["df", "-T", str(args.store)]).splitlines()
    store_fs = fs[-1].split()[1] if len(fs) >= 2 and len(fs[-1].split()) > 1 else "unknown"
    head = sh(["git", "rev-parse", "HEAD"])
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg_start": os.getloadavg(),
        "uname": sh(["uname", "-a"]) or " ".join(platform.uname()),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "host_mem_mib": mem_total_mib(),
        "store_fs": store_fs,
        "boot": str(boot.relative_to(REPO)) if boot.is_relative_to(REPO) else str(boot),
        "boot_sha256": sha256(boot),
        "boot_mtime": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(boot.stat().st_mtime)),
        "boot_version": sh([str(boot), "--version"]),
        "profile": "release" if "release" in boot.parts else ("debug" if "debug" in boot.parts else "unknown"),
        "git_head": head or "unknown",
        "git_dirty": bool(sh(["git", "status", "--porcelain", "--untracked-files=no"])),
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
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="runs per measurement (default: 3)")
    p.add_argument("--restore-runs", type=int, default=15,
                   help="runs per restore target (default: 15; restores are cheap, and a few ms are easily "
                        "disturbed on a shared host)")
    p.add_argument("--mem", type=int, default=512, help="guest RAM in MiB (default: 512)")
    p.add_argument("--boot", type=Path, default=DEFAULT_BOOT, help="the boot binary (default: target/release/boot)")
    p.add_argument("--backend", default="emu", choices=["emu", "hvf"], help="Ignition backend (default: emu)")
    p.add_argument("--kernel", type=Path, default=GUEST_OUT / "Image")
    p.add_argument("--disk", type=Path, default=GUEST_OUT / "rootfs.ext4", help="root disk (copied, never modified)")
    p.add_argument("--store", type=Path, default=DEFAULT_STORE,
                   help="throwaway snapshot store, removed at start and end (default: bench-results/vmstore-bench)")
    p.add_argument("--keep-store", action="store_true", help="leave the store in place at the end (for inspection)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "diff_snapshot.json",
                   help="JSON results (default: bench-results/diff_snapshot.json); the Markdown goes next to it (.md)")
    p.add_argument("--from-json", type=Path, metavar="JSON",
                   help="run nothing: rewrite the Markdown report of an earlier run's JSON (next to it)")
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
    for f, hint in ((args.boot, "cargo build --release --bin boot"), (args.kernel, "guest/build.sh"),
                    (args.disk, "guest/build.sh")):
        if not f.is_file():
            print(f"diff_snapshot_bench: {f} not found ({hint})", file=sys.stderr)
            return 1
    args.store = args.store.resolve()
    if args.store == REPO or REPO.is_relative_to(args.store) or args.store.is_relative_to(GUEST_OUT.resolve()):
        p.error(f"refusing to use {args.store} as the throwaway store")

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    def wipe_store():
        if args.store.exists():
            for q in [args.store, *args.store.rglob("*")]:
                if not q.is_symlink():
                    os.chmod(q, 0o755 if q.is_dir() else 0o644)  # layers are read-only
            shutil.rmtree(args.store)

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
    result = {"benchmark": "diff_snapshot", "config": info, "summary": summary, "raw": raw,
              "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
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
