"""Profile (not a test): where a branch's children spend their CPU from request to ready.

Boots a source as `ignition.bench.branch` does (fresh boot, --mem, the guest agent,
--track-dirty), makes --warm branches whose children it stops (a source's later branches are
the common case), then records one `branch` of --count children with `perf record -a -g -e
cpu-clock` (a software clock: it samples in VMs without hardware counters) and sorts each
sample of a child's process into one of

- **restore**: the child's main thread (it restores the VM and starts the devices);
- the vCPU thread, by the sampled function: **translating guest code** (TCG's front and back
  end), **finding translated blocks** (the engine's block hash tables and jump cache),
  **running translated code** (samples in the translation buffer, which has no symbols),
  **emulation helpers and VMM hooks** (anything else in `boot`: TCG helpers, softmmu, the emu
  backend's hooks), **copy-on-write faults** and **other page faults** (kernel samples under a
  page fault, split by whether the kernel copied a page for a write), **kernel, other**
  (syscalls, scheduling) and **libc**;
- **other threads** (devices, control socket, agent client, timers);

and prints the split per child (ms, from the sample count at --freq) with the most sampled
functions. The source's own samples in `fork` (the pause's page-table copy) are reported
too. Needs `perf` (Debian's linux-perf) and root, or perf_event_paranoid <= 0 for `-a`.

    python3 -m ignition.bench.branch_profile --count 32
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ignition import paths
from ignition.bench.branch import source, stop_request
from ignition.stats import write_report
from ignition.vm import Vm, VmConfig

TRANSLATING = re.compile(
    r"^(tcg_|tb_gen_code|gen_intermediate_code|translator_|disas_|aarch64_tr_|liveness_pass|la_|temp_"
    r"|reachable_code_pass|init_ts_info|tcg_opt|tcg_reg|tcg_out|tb_link_page|tb_page_add|page_find_alloc)"
)
FINDING = re.compile(r"^(helper_lookup_tb_ptr|qht_|tb_lookup|tb_htable_lookup|tb_tc_cmp|tb_cmp|g_tree_|g_hash_)")
VCPU = "vcpu"
CATEGORIES = (
    "restore",
    "translating guest code",
    "finding translated blocks",
    "running translated code",
    "emulation helpers and VMM hooks",
    "copy-on-write faults",
    "other page faults",
    "kernel, other",
    "libc",
    "other threads",
)


@dataclass
class Sample:
    """One `perf script` sample: the process, thread and its name, and the call chain from
    the sampled function outwards as (symbol, object) pairs."""

    pid: int
    tid: int
    comm: str
    frames: list[tuple[str, str]]


def parse(text: str) -> Iterator[Sample]:
    """Samples of `perf script -F comm,pid,tid,ip,sym,dso` output (a header line
    `COMM PID/TID`, then one `ADDR SYMBOL (OBJECT)` line per frame, a blank line after each)."""
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines:
            continue
        m = re.match(r"\s*(.*?)\s+(\d+)/(\d+)\s*$", lines[0])
        if not m:
            continue
        frames = []
        for line in lines[1:]:
            f = re.match(r"\s*[0-9a-f]+\s+(.*?)\s+\((.*)\)\s*$", line)
            if f:
                frames.append((f.group(1), f.group(2)))
        yield Sample(int(m.group(2)), int(m.group(3)), m.group(1), frames)


def category(s: Sample) -> str:
    """Which of CATEGORIES a child's sample belongs to (see the module docs)."""
    if s.tid == s.pid:
        return "restore"
    if not s.comm.startswith(VCPU):
        return "other threads"
    sym, dso = s.frames[0] if s.frames else ("[unknown]", "[unknown]")
    if dso.startswith("[kernel"):
        syms = {f for f, _ in s.frames}
        if "exc_page_fault" in syms or "asm_exc_page_fault" in syms:
            return "copy-on-write faults" if syms & {"do_wp_page", "wp_page_copy"} else "other page faults"
        return "kernel, other"
    if dso in ("[unknown]", "") or dso.startswith("/tmp/perf-") or dso.startswith("[anon") or dso.startswith("//anon"):
        return "running translated code"
    base = dso.rsplit("/", 1)[-1]
    if base.startswith("libc.") or base.startswith("libc-"):
        return "libc"
    if TRANSLATING.match(sym):
        return "translating guest code"
    if FINDING.match(sym):
        return "finding translated blocks"
    return "emulation helpers and VMM hooks"


def split(samples: Iterable[Sample], children: set[int], source: int) -> dict[str, Any]:
    """Sample counts of the children by category and by sampled function, and the source's
    samples in total and inside `fork`."""
    by_cat: collections.Counter[str] = collections.Counter()
    by_sym: collections.Counter[str] = collections.Counter()
    src = src_fork = 0
    for s in samples:
        if s.pid == source:
            src += 1
            src_fork += any(f == "copy_process" for f, _ in s.frames)
        elif s.pid in children:
            by_cat[category(s)] += 1
            if s.frames:
                by_sym[f"{s.frames[0][0]} ({s.frames[0][1].rsplit('/', 1)[-1]})"] += 1
    return {
        "children_samples": sum(by_cat.values()),
        "categories": {c: by_cat[c] for c in CATEGORIES},
        "top_functions": by_sym.most_common(25),
        "source_samples": src,
        "source_fork_samples": src_fork,
    }


def table(r: dict[str, Any]) -> list[str]:
    n, hz = r["count"], r["freq"]
    total = r["children_samples"] or 1
    out = [
        f"{n} children, {r['children_samples']} samples at {hz} Hz: {r['children_samples'] / hz / n * 1000:.1f} ms "
        f"of CPU per child (request to ready {r['ready_ms']} ms, source pause {r['pause_us']} µs)",
        "",
        "| where | ms per child | share |",
        "|---|---|---|",
    ]
    for c, k in r["categories"].items():
        out.append(f"| {c} | {k / hz / n * 1000:.1f} | {100 * k / total:.0f} % |")
    out += ["", "most sampled functions (children):"]
    out += [f"  {k:6d}  {100 * k / total:4.1f} %  {f}" for f, k in r["top_functions"]]
    out.append(
        f"source: {r['source_samples']} samples, {r['source_fork_samples']} in fork "
        f"({r['source_fork_samples'] / hz * 1000:.1f} ms)"
    )
    return out


def record(vm: Vm, n: int, freq: int, data: Path, start: str | None) -> dict[str, Any]:
    """One branch of n children under `perf record -a`; its answer's figures and the children's pids."""
    perf = subprocess.Popen(
        ["perf", "record", "-q", "-a", "-g", "-e", "cpu-clock", "-F", str(freq), "-o", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)  # perf is sampling before the request
        if perf.poll() is not None:
            raise SystemExit(f"perf record failed: {perf.stderr.read().decode() if perf.stderr else ''}")
        t = time.perf_counter()
        children = vm.branch(n, "profiled", start=start)
        ready_ms = round((time.perf_counter() - t) * 1000, 1)
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(timeout=60)
    try:
        answer = vm.branched or {}
        return {
            "ready_ms": ready_ms,
            "pause_us": answer.get("layer", {}).get("pause_us"),
            "pids": [c.pid for c in children],
        }
    finally:
        stop_request(vm, children)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.branch_profile",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--boot", type=Path, default=paths.boot_bin(), help="the boot binary [default: %(default)s]")
    p.add_argument("--count", type=int, default=32, help="children of the profiled request [default: %(default)s]")
    p.add_argument("--warm", type=int, default=1, help="branches before it (children stopped) [default: %(default)s]")
    p.add_argument("--mem", type=int, default=512, help="the source's RAM, MiB [default: %(default)s]")
    p.add_argument("--freq", type=int, default=4000, help="samples per second per CPU [default: %(default)s]")
    p.add_argument("--start", choices=["fork", "exec"], help="the children's start [default: the VMM's]")
    p.add_argument("--perf-data", type=Path, help="keep perf's recording here [default: a temporary file]")
    p.add_argument("--out", type=Path, default=paths.RESULTS_DIR / "branch-profile.json")
    a = p.parse_args(argv)
    if not shutil.which("perf"):
        p.error("perf is not installed (Debian: linux-perf)")
    with tempfile.TemporaryDirectory(prefix="ignition-branch-profile-") as tmp:
        work = Path(tmp)
        data = a.perf_data or work / "perf.data"
        with source(VmConfig(boot=a.boot), work, a.mem, ["--branch-limit", str(a.count)]) as vm:
            for i in range(a.warm):
                stop_request(vm, vm.branch(a.count, f"warm{i}", start=a.start))
            rec = record(vm, a.count, a.freq, data, a.start)
            source_pid = vm.pid
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm,pid,tid,ip,sym,dso"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    r = {"count": a.count, "freq": a.freq, "mem_mib": a.mem, "ready_ms": rec["ready_ms"], "pause_us": rec["pause_us"]}
    r |= split(parse(script), set(rec["pids"]), source_pid)
    write_report(a.out, r, table(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
