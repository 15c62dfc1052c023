"""The architectural conformance suite: bare-metal test images (guest/conformance/), run on
`boot` and on QEMU TCG, and their console protocol.

Each group is one Linux arm64 Image. It prints, over the PL011:

    # free text (the first line names the group, EL, MMU, PSCI conduit, CNTFRQ)
    # check <check>                  (a check starts)
    PASS <check>
    FAIL <check>: <detail>          (more details of the same check: "#   also: ...")
    ID <register> 0x<16 hex digits>  (group idregs)
    LAT <name> hz=<CNTFRQ> ticks=<t1>,<t2>,...   (raise-to-handler samples)
    LOST <what> intid=<N> cpu=<C>    (an interrupt raised for CPU C, not taken within 5 s)
    RESULT pass=N fail=M

and ends with PSCI SYSTEM_OFF. A group passes when the VM exits 0 after a RESULT line with
fail=0 whose pass count matches the PASS lines.

    images = conformance.build(paths.REPO_ROOT / "target" / "conformance")
    r = conformance.run_qemu("sgi", images)
    print(r.status, r.checks, r.latency)
"""

from __future__ import annotations

import math
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pexpect

from .. import console, paths, qemu, timeouts

BUILD_SCRIPT = paths.REPO_ROOT / "guest" / "conformance" / "build.sh"
IMAGES_DIR = paths.REPO_ROOT / "target" / "conformance"
"""Where the runner and the tests build the images (guest/build.sh puts a copy in guest/out/conformance)."""
MEM_MIB = 512


@dataclass(frozen=True)
class Group:
    """One test image."""

    name: str
    cpus: int
    """vCPUs the image needs (secondaries start through PSCI CPU_ON; extra ones idle)."""
    checks: str
    """What it checks, one line (the book has the details)."""
    paused: bool = False
    """It prints `# ready` and waits for a byte of console input: the point where a run
    across a snapshot takes and restores one (run_ignition_across_snapshot)."""


GROUPS: dict[str, Group] = {
    g.name: g
    for g in (
        Group("sgi", 4, "SGIs to self, to a target list and broadcast (IRM=1) reach CPUs spinning with IRQs enabled"),
        Group("active", 1, "GICv3 active state: IAR/EOIR/DIR flow, GICR/GICD ISACTIVER, ICACTIVER, in a handler"),
        Group("vtimer", 1, "virtual timer: ISTATUS, TVAL/CVAL, PPI 27 follows the output, IRQ, WFI with PSTATE.I set"),
        Group("debug", 2, "BRK, hardware breakpoint, watchpoint and software step at EL1 and EL0"),
        Group("pmu", 1, "an advertised PMUv3 counts: PMCCNTR_EL0 and the events PMCEID0_EL0 lists"),
        Group("idregs", 2, "ID_AA64* values; advertised features work (ISA, debug counts, granules, DC ZVA, AArch32)"),
        Group(
            "gic-minimal",
            2,
            "SGIs and the timer PPI reach CPUs whose GIC was set up minimally (redistributors "
            "never woken through GICR_WAKER), as bare-metal suites do",
        ),
        Group(
            "snapshot",
            1,
            "a breakpoint, a watchpoint, a timer and a pending SGI programmed before a pause point "
            "each fire once after it (across a snapshot and restore on Ignition)",
            paused=True,
        ),
    )
}
"""Every group, in the order the suite runs them."""


@dataclass
class Result:
    """One group's run on one target."""

    group: str
    target: str
    """`emu`, `hvf` (Ignition's backends) or `qemu` (the reference)."""
    status: str = "error"
    """`pass`, `fail` (a check failed, or the run did not end cleanly) or `error` (could not run)."""
    checks: dict[str, str | None] = field(default_factory=dict)
    """Check name -> None (passed) or the failure detail, in output order."""
    latency: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Name -> latency_summary() of its samples."""
    ids: dict[str, int] = field(default_factory=dict)
    """ID register name -> value (group idregs)."""
    lost: list[str] = field(default_factory=list)
    """Lost wake-ups: each `LOST` line's text (`what intid=N cpu=C`), an interrupt raised for a
    running CPU and not taken within the image's bounded wait, in a check or a latency run."""
    header: str = ""
    """The image's first `#` line (EL, MMU, PSCI conduit, CNTFRQ, MIDR)."""
    problem: str | None = None
    """Why the run as a whole failed (exit status, no RESULT line, timeout), else None."""
    exit_code: int | None = None
    elapsed_s: float = 0.0
    console: str = ""
    stderr: str = ""

    @property
    def passed(self) -> int:
        return sum(1 for d in self.checks.values() if d is None)

    @property
    def failures(self) -> dict[str, str]:
        return {k: d for k, d in self.checks.items() if d is not None}

    def summary(self) -> str:
        """`pass 4/4`, `FAIL 1/7: a, b, c` (the failed checks) or `ERROR: why`, one line."""
        n = len(self.checks)
        if self.status == "pass" and self.lost:
            return f"pass {self.passed}/{n}; LOST {len(self.lost)}: " + ", ".join(self.lost)
        if self.status == "pass":
            return f"pass {self.passed}/{n}"
        if self.status == "error":
            return f"ERROR: {self.problem}"
        return f"FAIL {self.passed}/{n}: " + (", ".join(self.failures) or str(self.problem))

    def explain(self) -> str:
        """Every failure, the problem and the console's tail, for an assertion message."""
        lines = [f"{self.group} on {self.target}: {self.summary()}"]
        lines += [f"  FAIL {k}: {d}" for k, d in self.failures.items()]
        lines += [f"  LOST {w}" for w in self.lost]
        if self.problem:
            lines.append(f"  {self.problem}")
        tail = self.console.strip().splitlines()[-15:]
        return "\n".join(lines + ["  console (tail):"] + [f"  | {t}" for t in tail])

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "summary": self.summary(),
            "checks": self.checks,
            "problem": self.problem,
            "exit_code": self.exit_code,
            "elapsed_s": round(self.elapsed_s, 3),
            "header": self.header,
            "lost": self.lost,
        }


_BEGIN = re.compile(r"^# check ([\w.-]+)$")
_CHECK = re.compile(r"^(PASS|FAIL) ([\w.-]+)(?:: (.*))?$")
_ALSO = "#   also: "
_ID = re.compile(r"^ID (\w+) 0x([0-9a-f]{16})$")
_LAT = re.compile(r"^LAT ([\w-]+) hz=(\d+) ticks=([\d,]*)$")
_RESULT = re.compile(r"^RESULT pass=(\d+) fail=(\d+)$")
_LOST = re.compile(r"^LOST (.+ intid=\d+ cpu=\d+)$")


def latency_summary(ticks: Sequence[int], hz: int) -> dict[str, Any]:
    """Counter ticks -> ns: `n`, `median_ns`, `p99_ns` (nearest rank), `min_ns`, `max_ns`, `samples_ns`.
    With no samples only `n` = 0."""
    if not ticks:
        return {"n": 0}
    ns = sorted(t * 1e9 / hz for t in ticks)
    p99 = ns[max(0, math.ceil(0.99 * len(ns)) - 1)]
    return {
        "n": len(ns),
        "median_ns": round(statistics.median(ns)),
        "p99_ns": round(p99),
        "min_ns": round(ns[0]),
        "max_ns": round(ns[-1]),
        "samples_ns": [round(t * 1e9 / hz) for t in ticks],
    }


def parse(result: Result, console: str) -> Result:
    """Fills result's checks, ids, latency, header and status from the console text and its
    exit_code/problem (set before). Status `pass` needs exit 0, RESULT fail=0 and matching
    PASS lines."""
    result.console = console
    counts = None
    started = failed = None
    for raw in console.splitlines():
        line = raw.strip("\r")
        if line.startswith("# conformance group") and not result.header:
            result.header = line[2:]
        if m := _BEGIN.match(line):
            started, failed = m.group(1), None
        elif m := _CHECK.match(line):
            kind, name, detail = m.groups()
            if kind == "PASS":
                result.checks.setdefault(name, None)
            else:
                result.checks[name] = detail or "failed"
                failed = name
        elif line.startswith(_ALSO) and failed:
            result.checks[failed] = f"{result.checks[failed]}; {line[len(_ALSO) :]}"
        elif m := _ID.match(line):
            result.ids[m.group(1)] = int(m.group(2), 16)
        elif m := _LOST.match(line):
            result.lost.append(m.group(1))
        elif m := _LAT.match(line):
            ticks = [int(t) for t in m.group(3).split(",") if t]
            result.latency[m.group(1)] = latency_summary(ticks, int(m.group(2)))
        elif (m := _RESULT.match(line)) and counts is None:
            counts = (int(m.group(1)), int(m.group(2)))
    if result.problem is None:
        if counts is None:
            result.problem = f"no RESULT line (exit status {result.exit_code})"
        elif result.exit_code != 0:
            result.problem = f"exit status {result.exit_code} after the RESULT line"
        elif counts != (result.passed, len(result.failures)):
            result.problem = f"RESULT pass={counts[0]} fail={counts[1]} disagrees with the PASS/FAIL lines"
    if result.problem and counts is None and started and started not in result.checks:
        result.checks[started] = result.problem  # the check that was running
    ok = result.problem is None and not result.failures and result.checks
    result.status = "pass" if ok else "fail"
    return result


def build(out: Path = IMAGES_DIR) -> dict[str, Path]:
    """Runs guest/conformance/build.sh --out `out`; returns group -> image path.
    Raises RuntimeError with the script's output if it fails."""
    r = subprocess.run([str(BUILD_SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    return images(out)


def images(directory: Path) -> dict[str, Path]:
    """group -> directory/<group>.Image for every group."""
    return {g: directory / f"{g}.Image" for g in GROUPS}


def boot_argv(
    boot: Path, image: Path, cpus: int, disk: Path, backend: str | None = None, gic: str | None = None
) -> list[str]:
    """`boot` running a conformance image (the disk is a placeholder the image never reads)."""
    argv = [str(boot), "--kernel", str(image), "--disk", str(disk), "--cpus", str(cpus), "--mem", str(MEM_MIB)]
    if backend:
        argv += ["--backend", backend]
    if gic:
        argv += ["--gic", gic]
    return argv


def qemu_argv(image: Path, cpus: int, qemu_bin: str = qemu.QEMU) -> list[str]:
    """The reference: QEMU virt with GICv3, `-cpu max`, entered at EL1 (no EL2/EL3), TCG."""
    return [
        qemu_bin,
        "-M",
        "virt,gic-version=3",
        "-cpu",
        "max",
        "-m",
        str(MEM_MIB),
        "-smp",
        str(cpus),
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(image),
    ]


READY = "# ready"
"""What a paused group prints where it waits for console input."""


def run_paused(group: str, target: str, argv: Sequence[str], timeout: float) -> Result:
    """Runs a paused group on a pty, sending its byte at `# ready`; a run past `timeout` is
    killed and fails as a hang."""
    result = Result(group, target)
    t0 = time.perf_counter()
    child = console.spawn(argv, timeout=timeout)
    out = []
    try:
        console.expect(child, READY, timeout, "the pause point")
        out.append(console.before(child) + console.after(child))
        child.send("g")
        child.expect(pexpect.EOF, timeout=timeout)
        out.append(console.before(child))
        child.close()
        result.exit_code = child.exitstatus
    except (console.ConsoleError, pexpect.TIMEOUT) as e:
        out.append(console.before(child))
        result.problem = f"did not finish: {e}"
        console.terminate(child)
    result.elapsed_s = time.perf_counter() - t0
    parse(result, "".join(out))
    return result


def run_ignition_across_snapshot(
    group: str,
    image_dir: Path,
    boot: Path,
    backend: str | None = None,
    gic: str | None = None,
    timeout: float | None = None,
) -> Result:
    """A paused group on `boot --track-dirty`, snapshotted (Ctrl-A s) at its pause point and
    quit; then `boot --restore`, which gets the byte and runs the checks. The result is the
    restored run's (target `BACKEND+snapshot`)."""
    name = backend or timeouts.default_backend()
    timeout = timeouts.for_backend(name).cmd if timeout is None else timeout
    target = f"{name}+snapshot"
    with tempfile.TemporaryDirectory(prefix="ignition-conformance-") as tmp:
        disk, store = Path(tmp) / "disk.img", Path(tmp) / "store"
        with open(disk, "wb") as f:
            f.truncate(1 << 20)
        argv = boot_argv(boot, images(image_dir)[group], GROUPS[group].cpus, disk, backend, gic)
        argv += ["--track-dirty", "--name", "paused", "--store", str(store)]
        child = console.spawn(argv, timeout=timeout)
        try:
            console.expect(child, READY, timeout, "the pause point")
            child.send("\x01s")
            console.expect(child, r"\[snapshot\] full 'paused'[^\r\n]* written", timeout, "the snapshot")
            child.send("\x01x")
            child.expect(pexpect.EOF, timeout=timeout)
        except (console.ConsoleError, pexpect.TIMEOUT) as e:
            console.terminate(child)
            return Result(group, target, problem=f"no snapshot at the pause point: {e}")
        child.close()
        argv = [str(boot), "--restore", "paused", "--store", str(store)]
        if backend:
            argv += ["--backend", backend]
        if gic:
            argv += ["--gic", gic]
        result = Result(group, target)
        t0 = time.perf_counter()
        child = console.spawn(argv, timeout=timeout)
        out = ""
        try:
            console.expect(child, r"Restore-time = \d+ ms", timeout, "the restore")
            child.send("g")
            child.expect(pexpect.EOF, timeout=timeout)
            out = console.before(child)
            child.close()
            result.exit_code = child.exitstatus
        except (console.ConsoleError, pexpect.TIMEOUT) as e:
            out = console.before(child)
            result.problem = f"did not finish: {e}"
            console.terminate(child)
        result.elapsed_s = time.perf_counter() - t0
        return parse(result, out)


def run_argv(group: str, target: str, argv: Sequence[str], timeout: float) -> Result:
    """Runs one image (stdin closed, console on stdout; a paused group on a pty, given its
    byte at once); a run past `timeout` is killed and fails as a hang naming the last check
    it started."""
    if GROUPS[group].paused:
        return run_paused(group, target, argv, timeout)
    result = Result(group, target)
    t0 = time.perf_counter()
    try:
        p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        out, err = p.stdout, p.stderr
        result.exit_code = p.returncode
    except subprocess.TimeoutExpired as e:
        out, err = e.stdout or b"", e.stderr or b""
        result.problem = f"killed after {timeout:g} s (hang)"
    except OSError as e:
        result.problem = f"cannot run {argv[0]}: {e}"
        result.elapsed_s = time.perf_counter() - t0
        return result
    result.elapsed_s = time.perf_counter() - t0
    result.stderr = err.decode("utf-8", "replace")
    parse(result, out.decode("utf-8", "replace"))
    return result


def run_ignition(
    group: str,
    image_dir: Path,
    boot: Path,
    backend: str | None = None,
    gic: str | None = None,
    timeout: float | None = None,
) -> Result:
    """One group on `boot` (backend None: boot's default); timeout default: the backend's cmd timeout."""
    name = backend or timeouts.default_backend()
    timeout = timeouts.for_backend(name).cmd if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="ignition-conformance-") as tmp:
        disk = Path(tmp) / "disk.img"
        with open(disk, "wb") as f:
            f.truncate(1 << 20)
        argv = boot_argv(boot, images(image_dir)[group], GROUPS[group].cpus, disk, backend, gic)
        return run_argv(group, name, argv, timeout)


def run_qemu(group: str, image_dir: Path, timeout: float | None = None, qemu_bin: str = qemu.QEMU) -> Result:
    """One group on QEMU TCG."""
    timeout = timeouts.for_backend("qemu").cmd if timeout is None else timeout
    return run_argv(group, "qemu", qemu_argv(images(image_dir)[group], GROUPS[group].cpus, qemu_bin), timeout)


def qemu_version(qemu_bin: str = qemu.QEMU) -> str:
    """First line of `qemu-system-aarch64 --version`, or "" if it cannot run."""
    try:
        return subprocess.run([qemu_bin, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[
            0
        ]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def cross_compiler() -> str | None:
    """The cross compiler build.sh uses, if on PATH (else None)."""
    cc = os.environ.get("CROSS_COMPILE", "aarch64-linux-gnu-") + "gcc"
    return cc if any((Path(d) / cc).is_file() for d in os.environ.get("PATH", "").split(os.pathsep) if d) else None
