"""kvm-unit-tests (arm64) on Ignition's `boot` beside QEMU TCG.

The public test suite KVM and QEMU developers run on arm64 guests is vendored, source and
built tests, in third_party/kvm-unit-tests/ (its README gives the commit and the build
recipe). This module reads its `unittests.cfg`, runs each entry on `boot` and on
`qemu-system-aarch64 -M virt,gic-version=3 -cpu max`, parses the suite's output, prints one
table and writes JSON:

    python3 -m ignition.kvm_unit_tests                     # every entry on emu, QEMU from the record
    python3 -m ignition.kvm_unit_tests --entries timer,gicv3-ipi -v
    python3 -m ignition.kvm_unit_tests --qemu live         # QEMU run now, side by side
    python3 -m ignition.kvm_unit_tests --record-qemu       # re-derive the recorded QEMU verdicts

The exit status is 1 when an entry of GATING that passes on QEMU does not pass on Ignition.

A test prints `PASS:`/`FAIL:`/`SKIP:` lines, `SUMMARY: ...` and `EXIT: STATUS=N` with
N = (code << 1) | 1: N = 1 (code 0) passes, N = 77 (every test skipped) skips, anything else
fails; a run without the EXIT line (a hang, a crash) fails. A `.flat` is a position-independent
raw binary: `boot` loads arm64 Images, so the runner wraps each one in an Image header
(wrap_flat). Entries of the
`migration` group print MIGRATE_PROMPT and wait for a key: on Ignition the runner takes a
snapshot through the control socket there, quits, restores it in a new `boot` and presses the
key on the restored console; on QEMU it migrates to a file and resumes from it with
`-incoming`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shlex
import socket
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pexpect

from . import console, paths, qemu, timeouts
from .control import ControlClient, ControlError

SUITE_DIR = paths.REPO_ROOT / "third_party" / "kvm-unit-tests"
SUITE_COMMIT = "1da1819e49fc4938985edca67df669099b4c87a7"
"""The suite's commit the vendored files are built from (third_party/kvm-unit-tests/README.md)."""
CFG = SUITE_DIR / "unittests.cfg"
FLAT_DIR = SUITE_DIR / "arm"
RECORD = SUITE_DIR / "qemu-verdicts.json"
"""QEMU's verdicts on this suite commit, written by --record-qemu."""
RECORD_COMMAND = "python3 -m ignition.kvm_unit_tests --record-qemu"

GATING = (
    "selftest-setup",
    "selftest-vectors-kernel",
    "selftest-vectors-user",
    "selftest-smp",
    "gicv3-ipi",
    "gicv3-active",
    "psci",
    "timer",
    "cache",
    "debug-bp",
    "debug-wp",
    "debug-sstep",
    "fpu-context",
    "pl031",
    "debug-bp-migration",
    "debug-wp-migration",
    "debug-sstep-migration",
)
"""Entries that must pass on Ignition when they pass on QEMU. The rest run and are reported."""

DEFAULT_MAX_SMP = 2
"""$MAX_SMP in unittests.cfg. The suite's own scripts use the host's CPU count; a fixed value
keeps the recorded QEMU verdicts comparable across machines (and a 2-core CI runner busy
enough)."""
DEFAULT_MEM_MIB = 512
"""Guest RAM unless an entry's qemu_params say `-m N` (the QEMU command of the suite's README)."""
DEFAULT_TIMEOUT_S = 90.0
"""The suite's per-test timeout when its cfg names none (scripts/runtime.bash)."""

MIGRATE_PROMPT = r"Now migrate the VM[^\r\n]*"
"""What a migration test prints where it waits for the migration and a key (lib/migrate.c)."""
SKIP_MIGRATION = r"Skipped VM migration[^\r\n]*"
"""What it prints instead when it skips the migration: it waits for the key all the same (the
suite's scripts/arch-run.bash then presses it without migrating)."""
KEY = "\n"

TIMING_CHECK = re.compile(r"latency within \d+ ms$")
"""Report lines that measure how fast the host schedules the vCPU (arm/timer.c: the timer's
condition seen within 10 ms of CVAL by a busy loop), not what the architecture requires. An
entry whose only failures are these is run again, up to TIMING_RETRIES more times, and takes
the verdict of its first run without them; on a loaded 2-core machine a descheduled vCPU
misses the 10 ms on QEMU as on Ignition."""
TIMING_RETRIES = 2

# Image header (Linux Documentation/arch/arm64/booting.rst). The flat binary is linked at 0
# with 64 KiB-aligned sections and relocates itself, but its ADRP sequences need it loaded at
# a 4 KiB-aligned address: it follows the header after a 64 KiB pad, at RAM + 0x80000 (where
# QEMU's loader puts a raw `-kernel` binary), so text_offset is 0x70000.
IMAGE_MAGIC = 0x644D5241
FLAT_PAD = 0x1_0000
TEXT_OFFSET = 0x8_0000 - FLAT_PAD
BSS_AND_STACK = 0x4_0000
"""Room after the file for the test's BSS and its 64 KiB boot stack (its linker script puts both
after the data, in 64 KiB-aligned steps), so that `boot` places the DTB beyond them."""

VERDICTS = ("PASS", "FAIL", "SKIP", "n/a")
"""`n/a`: the entry needs a machine option Ignition does not have (see unsupported_on_ignition)."""


# ----- unittests.cfg ---------------------------------------------------------------------------


@dataclass
class Entry:
    """One `[name]` section of unittests.cfg."""

    name: str
    file: str
    smp: str = "1"
    """An integer or a shell arithmetic expression of $MAX_SMP (see eval_smp)."""
    test_args: str = ""
    """The guest's command line (QEMU's -append): the test's argv[1:]."""
    qemu_params: str = ""
    groups: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    arch: str = ""
    accel: str = ""
    disabled_if: str = ""

    @property
    def migration(self) -> bool:
        return "migration" in self.groups

    def cpus(self, max_smp: int) -> int:
        return eval_smp(self.smp, max_smp)

    def mem_mib(self) -> int:
        """`-m N` of qemu_params, else DEFAULT_MEM_MIB."""
        words = shlex.split(self.qemu_params)
        for i, w in enumerate(words[:-1]):
            if w == "-m":
                return int(words[i + 1].rstrip("MmGg") or DEFAULT_MEM_MIB)
        return DEFAULT_MEM_MIB

    def extra_qemu_args(self) -> list[str]:
        """qemu_params other than `-m N` (given to QEMU as they are)."""
        words = shlex.split(self.qemu_params)
        out, skip = [], False
        for i, w in enumerate(words):
            if skip:
                skip = False
            elif w == "-m" and i + 1 < len(words):
                skip = True
            else:
                out.append(w)
        return out

    def unsupported_on_ignition(self) -> str | None:
        """Why `boot` cannot give this entry the machine it asks for, or None."""
        extra = self.extra_qemu_args()
        if not extra:
            return None
        joined = " ".join(extra)
        if joined in ("-machine gic-version=3", "-M gic-version=3"):
            return None
        return f"needs QEMU option {joined!r}"


class CfgError(ValueError):
    """unittests.cfg could not be parsed."""


_SECTION = re.compile(r"^\[([^\]]+)\]\s*$")
_KEY = re.compile(r"^(\w+)\s*=\s*(.*)$")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    return value


def _seconds(value: str) -> float:
    """A cfg timeout: `90`, `90s`, `2m`, `1h` (as `timeout(1)` reads them)."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", value.strip())
    if not m:
        raise CfgError(f"bad timeout {value!r}")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def parse_cfg(text: str) -> list[Entry]:
    """The entries of a unittests.cfg text, in file order. `#` starts a comment line; a
    section runs to the next; `extra_params = -append '...'` (the older spelling) sets
    test_args. Raises CfgError for a key outside a section, a section without `file`, a
    duplicate name or an unparsable timeout."""
    entries: list[Entry] = []
    raw: dict[str, str] | None = None
    name = ""

    def close() -> None:
        if raw is None:
            return
        if "file" not in raw:
            raise CfgError(f"[{name}] has no file")
        e = Entry(name=name, file=_unquote(raw["file"]))
        e.smp = _unquote(raw.get("smp", "1"))
        e.test_args = _unquote(raw.get("test_args", ""))
        extra = raw.get("extra_params", "")
        if m := re.search(r"-append\s+('[^']*'|\"[^\"]*\"|\S+)", extra):
            e.test_args = _unquote(m.group(1))
            extra = (extra[: m.start()] + extra[m.end() :]).strip()
        e.qemu_params = " ".join(p for p in (raw.get("qemu_params", "").strip(), extra) if p)
        e.groups = raw.get("groups", "").split()
        if "timeout" in raw:
            e.timeout_s = _seconds(raw["timeout"])
        e.arch = raw.get("arch", "").strip()
        e.accel = raw.get("accel", "").strip()
        e.disabled_if = raw.get("disabled_if", "").strip()
        if any(x.name == name for x in entries):
            raise CfgError(f"duplicate entry [{name}]")
        entries.append(e)

    for lineno, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        if m := _SECTION.match(s):
            close()
            name, raw = m.group(1).strip(), {}
        elif (m := _KEY.match(s)) and raw is not None:
            raw[m.group(1)] = m.group(2).strip()
        else:
            raise CfgError(f"line {lineno}: {s!r} is neither a section nor a key inside one")
    close()
    return entries


def eval_smp(expr: str, max_smp: int) -> int:
    """An `smp` value: an integer, `$MAX_SMP`, or shell arithmetic `$((...))` over them with
    + - * / % comparisons and `?:` (what unittests.cfg uses, e.g.
    `$((($MAX_SMP < 8)?$MAX_SMP:8))`). Raises CfgError for anything else or a result < 1."""
    s = expr.strip()
    if s.startswith("$((") and s.endswith("))"):
        s = s[3:-2]
    s = s.replace("$MAX_SMP", str(max_smp)).replace("${MAX_SMP}", str(max_smp))
    value = _Arith(s, expr).parse()
    if value < 1:
        raise CfgError(f"smp {expr!r} is {value}")
    return value


_BINARY: dict[str, Callable[[int, int], int]] = {
    "||": lambda v, w: int(bool(v) or bool(w)),
    "&&": lambda v, w: int(bool(v) and bool(w)),
    "==": lambda v, w: int(v == w),
    "!=": lambda v, w: int(v != w),
    "<": lambda v, w: int(v < w),
    ">": lambda v, w: int(v > w),
    "<=": lambda v, w: int(v <= w),
    ">=": lambda v, w: int(v >= w),
    "+": lambda v, w: v + w,
    "-": lambda v, w: v - w,
    "*": lambda v, w: v * w,
    "/": lambda v, w: int(v / w),
    "%": lambda v, w: v - w * int(v / w),
}
"""The shell arithmetic's binary operators (`$((...))` in `smp` lines)."""


class _Arith:
    """A recursive-descent evaluator of shell integer arithmetic (no variables left)."""

    _TOKEN = re.compile(r"\s*(\d+|<=|>=|==|!=|&&|\|\||[-+*/%<>?:()])")

    def __init__(self, text: str, original: str):
        self.original = original
        self.tokens, pos = [], 0
        while pos < len(text):
            m = self._TOKEN.match(text, pos)
            if not m:
                if text[pos:].strip():
                    raise CfgError(f"smp {original!r}: cannot read {text[pos:]!r}")
                break
            self.tokens.append(m.group(1))
            pos = m.end()
        self.i = 0

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, want: str | None = None) -> str:
        tok = self.peek()
        if tok is None or (want is not None and tok != want):
            raise CfgError(f"smp {self.original!r}: expected {want or 'more'}, found {tok!r}")
        self.i += 1
        return tok

    def parse(self) -> int:
        v = self.ternary()
        if self.peek() is not None:
            raise CfgError(f"smp {self.original!r}: trailing {self.peek()!r}")
        return v

    def ternary(self) -> int:
        cond = self.binary(0)
        if self.peek() == "?":
            self.take("?")
            a = self.ternary()
            self.take(":")
            b = self.ternary()
            return a if cond else b
        return cond

    _LEVELS = (("||",), ("&&",), ("==", "!="), ("<", ">", "<=", ">="), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> int:
        if level == len(self._LEVELS):
            return self.unary()
        v = self.binary(level + 1)
        while self.peek() in self._LEVELS[level]:
            op = self.take()
            w = self.binary(level + 1)
            if op in "/%" and w == 0:
                raise CfgError(f"smp {self.original!r}: division by zero")
            v = self._apply(op, v, w)
        return v

    @staticmethod
    def _apply(op: str, v: int, w: int) -> int:
        """`v op w` with the shell's integer semantics (division truncates toward zero)."""
        return _BINARY[op](v, w)

    def unary(self) -> int:
        tok = self.take()
        if tok == "(":
            v = self.ternary()
            self.take(")")
            return v
        if tok == "-":
            return -self.unary()
        if tok.isdigit():
            return int(tok)
        raise CfgError(f"smp {self.original!r}: unexpected {tok!r}")


RUNNER_CFG = """
# The suite builds arm/pl031.flat (its Makefile's tests) but its unittests.cfg has no entry for
# it; run it as its README says a test is run: one CPU, no arguments.
[pl031]
file = pl031.flat
groups = rtc
"""
"""Entries the runner adds to unittests.cfg, in its format."""


def load_entries(cfg: Path = CFG) -> list[Entry]:
    """The cfg's entries, then RUNNER_CFG's."""
    return parse_cfg(cfg.read_text() + "\n" + RUNNER_CFG)


# ----- the suite's output ----------------------------------------------------------------------

_REPORT = re.compile(r"^(PASS|FAIL|SKIP|XPASS|XFAIL): (.*)$")
_SUMMARY = re.compile(r"^SUMMARY: .*$")
_EXIT = re.compile(r"^EXIT: STATUS=(\d+)$")


@dataclass
class Outcome:
    """One entry's run on one target."""

    verdict: str = "FAIL"
    """PASS, FAIL, SKIP or n/a (VERDICTS)."""
    summary: str = ""
    """The SUMMARY line without its `SUMMARY: `, else why the run failed or was not made."""
    exit_status: int | None = None
    """N of `EXIT: STATUS=N`."""
    reports: list[tuple[str, str]] = field(default_factory=list)
    """(PASS/FAIL/SKIP/XPASS/XFAIL, text) per report line, in order."""
    problem: str | None = None
    """Why the run ended abnormally (timeout, no EXIT line, a migration step that failed)."""
    retries: int = 0
    """Runs before this one whose only failures were TIMING_CHECK lines."""
    elapsed_s: float = 0.0
    console: str = ""

    @property
    def failures(self) -> list[str]:
        return [t for k, t in self.reports if k in ("FAIL", "XPASS")]

    @property
    def timing_only(self) -> bool:
        """Failed, and only on TIMING_CHECK lines."""
        return (
            self.verdict == "FAIL"
            and self.problem is None
            and bool(self.failures)
            and all(TIMING_CHECK.search(f) for f in self.failures)
        )

    def as_json(self, with_console: bool = False) -> dict[str, Any]:
        d = {
            "verdict": self.verdict,
            "summary": self.summary,
            "exit_status": self.exit_status,
            "failures": self.failures,
            "problem": self.problem,
            "retries": self.retries,
            "elapsed_s": round(self.elapsed_s, 2),
            "reports": [f"{k}: {t}" for k, t in self.reports],
        }
        if with_console:
            d["console"] = self.console
        return d


EXIT_PASS = (0 << 1) | 1
"""`EXIT: STATUS=1`: exit code 0."""
EXIT_SKIP = 77
"""`EXIT: STATUS=77`: every test skipped (report_summary exits with 77 >> 1, which the status
line turns back into 77; the suite's scripts/runtime.bash reads 77 as SKIP)."""


def parse_output(text: str, problem: str | None = None) -> Outcome:
    """The outcome of a test from its console text, as the suite's own scripts read it
    (scripts/arch-run.bash, runtime.bash): `EXIT: STATUS=1` PASS, `EXIT: STATUS=77` SKIP,
    any other status FAIL; a FAIL (or XPASS) report line also makes it FAIL, and a status 1
    whose only report lines are SKIPs is a SKIP. `problem` (a
    timeout, a migration step that failed) makes a run without an EXIT line fail with that
    reason."""
    out = Outcome(console=text, problem=problem)
    for raw in text.splitlines():
        line = raw.strip("\r").strip()
        if m := _REPORT.match(line):
            out.reports.append((m.group(1), m.group(2)))
        elif _SUMMARY.match(line):
            out.summary = line[len("SUMMARY: ") :]
        elif m := _EXIT.match(line):
            out.exit_status = int(m.group(1))
    if out.exit_status is None:
        out.verdict = "FAIL"
        out.problem = out.problem or "no EXIT line"
        out.summary = f"{out.problem}" + (f" ({out.summary})" if out.summary else "")
        return out
    skipped_only = all(k == "SKIP" for k, _ in out.reports) and bool(out.reports)
    if out.exit_status == EXIT_PASS and not out.failures and not skipped_only:
        out.verdict = "PASS"
    elif out.exit_status == EXIT_PASS and skipped_only:
        # A test that skips before its checks may exit 0 without a summary
        # (arm/pl031.c without a device): nothing passed.
        out.verdict = "SKIP"
    elif out.exit_status == EXIT_SKIP and not out.failures:
        out.verdict = "SKIP"
    else:
        out.verdict = "FAIL"
    if not out.summary:
        out.summary = f"EXIT: STATUS={out.exit_status}"
    return out


# ----- images -----------------------------------------------------------------------------------


def wrap_flat(flat: bytes) -> bytes:
    """A kvm-unit-tests `.flat` as an arm64 Image `boot` loads: the 64-byte header (code0 a
    branch to the flat, text_offset TEXT_OFFSET, image_size covering the file, its BSS and
    stack, flags 0: little-endian, no page-size preference), zeros to FLAT_PAD, the flat. The
    flat then starts at RAM + 0x80000 with X0 = the DTB, as under QEMU's `-kernel`."""
    header = bytearray(FLAT_PAD)
    branch = 0x1400_0000 | (FLAT_PAD // 4)  # b . + FLAT_PAD
    size = FLAT_PAD + -(-len(flat) // 0x1_0000) * 0x1_0000 + BSS_AND_STACK
    header[0:4] = branch.to_bytes(4, "little")
    header[0x08:0x10] = TEXT_OFFSET.to_bytes(8, "little")
    header[0x10:0x18] = size.to_bytes(8, "little")
    header[0x38:0x3C] = IMAGE_MAGIC.to_bytes(4, "little")
    return bytes(header) + flat


def wrapped_image(flat: Path, out_dir: Path) -> Path:
    """out_dir/<name>.Image, the wrapped flat (rewritten when the flat is newer)."""
    out = out_dir / (flat.stem + ".Image")
    if not out.is_file() or out.stat().st_mtime < flat.stat().st_mtime:
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(wrap_flat(flat.read_bytes()))
        tmp.replace(out)
    return out


# ----- running ----------------------------------------------------------------------------------


def entry_timeout(entry: Entry, backend: str) -> float:
    """The cfg's timeout (the suite's default 90 s without one), never below the package's
    policy for the backend (timeouts.py): a slow, loaded machine must not fail a correct test."""
    policy = timeouts.for_backend(backend).cmd
    return max(entry.timeout_s or DEFAULT_TIMEOUT_S, policy)


class _Run:
    """Collects a run's console across its processes and bounds it by one deadline."""

    def __init__(self, timeout: float):
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout
        self.parts: list[str] = []
        self.t0 = time.perf_counter()

    def left(self) -> float:
        return max(0.1, self.deadline - time.monotonic())

    def take(self, child: pexpect.spawn[str]) -> None:
        before = child.before if isinstance(child.before, str) else ""
        after = child.after if isinstance(child.after, str) else ""
        self.parts.append(before + after)

    def wait(self, child: pexpect.spawn[str], patterns: list[str]) -> int:
        """child.expect(patterns + [EOF]) within the deadline; the index, len(patterns) at EOF.
        Raises pexpect.TIMEOUT past the deadline (the output so far is kept)."""
        try:
            expected: list[str | type[pexpect.EOF]] = [*patterns, pexpect.EOF]
            i = child.expect(expected, timeout=self.left())  # type: ignore[arg-type]
        except pexpect.TIMEOUT:
            self.take(child)
            raise
        self.take(child)
        return i

    def outcome(self, problem: str | None = None) -> Outcome:
        out = parse_output("".join(self.parts), problem)
        out.elapsed_s = time.perf_counter() - self.t0
        return out


def _finish(child: pexpect.spawn[str]) -> None:
    try:
        child.close()
    except pexpect.ExceptionPexpect:
        console.terminate(child)


def boot_argv(
    boot: Path, image: Path, entry: Entry, max_smp: int, disk: Path, backend: str | None, gic: str | None = None
) -> list[str]:
    """`boot` running a wrapped test (the disk is a placeholder the test never reads); `gic`
    is `--gic` (None: boot's, the userspace GIC)."""
    argv = [
        str(boot),
        "--kernel",
        str(image),
        "--disk",
        str(disk),
        "--cpus",
        str(entry.cpus(max_smp)),
        "--mem",
        str(entry.mem_mib()),
        "--cmdline",
        entry.test_args,
    ]
    if backend:
        argv += ["--backend", backend]
    if gic:
        argv += ["--gic", gic]
    return argv


def with_timing_retries(once: Callable[[], Outcome]) -> Outcome:
    """once(), run again while its only failures are TIMING_CHECK lines (at most
    TIMING_RETRIES more times); the last outcome, with the count of such runs before it."""
    out = once()
    retries = 0
    while out.timing_only and retries < TIMING_RETRIES:
        retries += 1
        out = once()
    out.retries = retries
    return out


def run_ignition(
    entry: Entry,
    boot: Path,
    image_dir: Path,
    backend: str | None = None,
    max_smp: int = DEFAULT_MAX_SMP,
    timeout: float | None = None,
    gic: str | None = None,
) -> Outcome:
    """One entry on `boot` (with_timing_retries), with `--gic gic` if given. At each
    MIGRATE_PROMPT: a snapshot through the control socket, quit, `boot --restore` in a new
    process (the snapshot's GIC), a key on its console; at SKIP_MIGRATION just the key."""
    if why := entry.unsupported_on_ignition():
        return Outcome(verdict="n/a", summary=why)
    image = wrapped_image(FLAT_DIR / entry.file, image_dir)
    name = backend or timeouts.default_backend()
    limit = timeout if timeout is not None else entry_timeout(entry, name)
    return with_timing_retries(lambda: _run_ignition_once(entry, boot, image, backend, max_smp, limit, gic))


def _run_ignition_once(
    entry: Entry, boot: Path, image: Path, backend: str | None, max_smp: int, timeout: float, gic: str | None
) -> Outcome:
    run = _Run(timeout)
    with tempfile.TemporaryDirectory(prefix="ignition-kut-") as tmp:
        disk, store, sock = Path(tmp) / "disk.img", Path(tmp) / "store", Path(tmp) / "control.sock"
        with open(disk, "wb") as f:
            f.truncate(1 << 20)
        argv = boot_argv(boot, image, entry, max_smp, disk, backend, gic)
        argv += ["--track-dirty", "--name", "kut", "--store", str(store), "--control", str(sock)]
        child = console.spawn(argv, timeout=run.timeout)
        migrations = 0
        try:
            while (prompt := run.wait(child, [MIGRATE_PROMPT, SKIP_MIGRATION])) < 2:
                if prompt == 1:
                    child.send(KEY)
                    continue
                migrations += 1
                layer = f"kut-migration-{migrations}"
                try:
                    with ControlClient(sock, timeout=run.left()) as c:
                        c.snapshot(layer)
                        c.quit()
                except (OSError, ControlError, ConnectionError) as e:
                    console.terminate(child)
                    return run.outcome(f"snapshot at the migration point failed: {e}")
                run.wait(child, [])
                _finish(child)
                if sock.exists():
                    sock.unlink()
                argv = [
                    str(boot),
                    "--restore",
                    layer,
                    "--store",
                    str(store),
                    "--track-dirty",
                    "--name",
                    f"kut-{migrations}",
                    "--control",
                    str(sock),
                ]
                if backend:
                    argv += ["--backend", backend]
                child = console.spawn(argv, timeout=run.timeout)
                if run.wait(child, [r"Restore-time = \d+ ms"]) != 0:
                    return run.outcome("the restored VM exited before it ran")
                child.send(KEY)
            _finish(child)
            problem = None if child.exitstatus == 0 else f"boot exited with status {child.exitstatus}"
            out = run.outcome(problem)
            if out.exit_status is not None:
                out.problem = problem
            return out
        except pexpect.TIMEOUT:
            console.terminate(child)
            return run.outcome(f"timed out after {run.timeout:g} s")


def qemu_argv(entry: Entry, max_smp: int, qemu_bin: str = qemu.QEMU) -> list[str]:
    """The suite README's reference command for an entry."""
    argv = [
        qemu_bin,
        "-M",
        "virt,gic-version=3",
        "-cpu",
        "max",
        "-smp",
        str(entry.cpus(max_smp)),
        "-m",
        str(entry.mem_mib()),
        "-nographic",
        "-no-reboot",
        "-kernel",
        str(FLAT_DIR / entry.file),
    ]
    argv += entry.extra_qemu_args()
    return argv + ["-append", entry.test_args]


def _hmp(path: Path, command: str, timeout: float) -> str:
    """One QEMU human-monitor command over its Unix socket; the text it answered."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout)
        s.connect(str(path))
        buf = b""
        while not buf.endswith(b"(qemu) "):
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
        s.sendall(command.encode() + b"\n")
        reply = b""
        while not reply.endswith(b"(qemu) "):
            chunk = s.recv(4096)
            if not chunk:
                break
            reply += chunk
        return reply.decode("utf-8", "replace")


def _poll(check: Callable[[], bool], run: _Run, what: str) -> None:
    while not check():
        if time.monotonic() > run.deadline:
            raise pexpect.TIMEOUT(f"waiting for {what}")
        time.sleep(0.05)


def run_qemu(
    entry: Entry, max_smp: int = DEFAULT_MAX_SMP, qemu_bin: str = qemu.QEMU, timeout: float | None = None
) -> Outcome:
    """One entry on QEMU TCG (with_timing_retries). At each MIGRATE_PROMPT: `migrate` to a
    file over the monitor, quit, a new QEMU with `-incoming` from the file, a key on its
    console once it runs; at SKIP_MIGRATION just the key."""
    limit = timeout if timeout is not None else entry_timeout(entry, "qemu")
    return with_timing_retries(lambda: _run_qemu_once(entry, max_smp, qemu_bin, limit))


def _run_qemu_once(entry: Entry, max_smp: int, qemu_bin: str, timeout: float) -> Outcome:
    run = _Run(timeout)
    with tempfile.TemporaryDirectory(prefix="ignition-kut-qemu-") as tmp:
        mon, state = Path(tmp) / "monitor.sock", Path(tmp) / "state"
        base = qemu_argv(entry, max_smp, qemu_bin)
        if entry.migration:
            base += ["-monitor", f"unix:{mon},server=on,wait=off"]
        child = console.spawn(base, timeout=run.timeout)
        migrations = 0
        try:
            while (prompt := run.wait(child, [MIGRATE_PROMPT, SKIP_MIGRATION])) < 2:
                if prompt == 1:
                    child.send(KEY)
                    continue
                migrations += 1
                _hmp(mon, f'migrate "exec:cat > {state}"', run.left())
                _poll(lambda: "completed" in _hmp(mon, "info migrate", run.left()), run, "the migration")
                _hmp(mon, "quit", run.left())
                run.wait(child, [])
                _finish(child)
                mon.unlink(missing_ok=True)
                child = console.spawn(base + ["-incoming", f"exec:cat {state}"], timeout=run.timeout)
                _poll(lambda: mon.exists(), run, "the monitor")
                _poll(lambda: "running" in _hmp(mon, "info status", run.left()), run, "the incoming VM to run")
                child.send(KEY)
            _finish(child)
            return run.outcome(None)
        except (pexpect.TIMEOUT, OSError) as e:
            console.terminate(child)
            what = f"timed out after {run.timeout:g} s" if isinstance(e, pexpect.TIMEOUT) else f"monitor: {e}"
            return run.outcome(what)


# ----- the record of QEMU's verdicts -----------------------------------------------------------


def qemu_version(qemu_bin: str = qemu.QEMU) -> str:
    import subprocess

    try:
        return subprocess.run([qemu_bin, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[
            0
        ]
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def load_record(path: Path = RECORD) -> dict[str, Any]:
    """The recorded QEMU verdicts: {suite_commit, qemu, max_smp, command, entries: {name:
    Outcome.as_json()}}. Raises FileNotFoundError or ValueError (malformed)."""
    rec = json.loads(path.read_text())
    if not isinstance(rec, dict) or not isinstance(rec.get("entries"), dict):
        raise ValueError(f"{path}: no entries")
    return dict(rec)


def record_outcomes(rec: dict[str, Any], max_smp: int) -> dict[str, Outcome]:
    """The record's outcomes, if it was made for this suite commit and $MAX_SMP. Raises
    ValueError otherwise (re-record with RECORD_COMMAND)."""
    if rec.get("suite_commit") != SUITE_COMMIT or rec.get("max_smp") != max_smp:
        raise ValueError(
            f"the QEMU record is for suite {rec.get('suite_commit')} with MAX_SMP="
            f"{rec.get('max_smp')}, not {SUITE_COMMIT} with {max_smp}: run {RECORD_COMMAND}"
        )
    out = {}
    for name, d in rec["entries"].items():
        out[name] = Outcome(
            verdict=d["verdict"],
            summary=d.get("summary", ""),
            exit_status=d.get("exit_status"),
            problem=d.get("problem"),
            elapsed_s=d.get("elapsed_s", 0.0),
        )
    return out


# ----- the table and the gate ------------------------------------------------------------------


@dataclass
class Row:
    entry: Entry
    ignition: Outcome | None
    qemu: Outcome | None

    @property
    def gating(self) -> bool:
        return self.entry.name in GATING

    @property
    def gate_failed(self) -> bool:
        """A gating entry QEMU passes that Ignition does not."""
        return (
            self.gating
            and self.qemu is not None
            and self.qemu.verdict == "PASS"
            and self.ignition is not None
            and self.ignition.verdict != "PASS"
        )


def table(rows: Sequence[Row], backend: str) -> str:
    """One Markdown table: entry (`*` gating), Ignition's and QEMU's verdicts, Ignition's
    summary (QEMU's where Ignition did not run)."""
    head = ["entry", f"Ignition ({backend})", "QEMU", "summary"]
    body = []
    for r in rows:
        ig = r.ignition.verdict if r.ignition else "-"
        qe = r.qemu.verdict if r.qemu else "-"
        summary = (r.ignition or r.qemu or Outcome(summary="")).summary
        if r.ignition and r.ignition.failures:
            summary += "; failed: " + ", ".join(r.ignition.failures[:4])
        body.append([r.entry.name + (" *" if r.gating else ""), ig, qe, summary])
    widths = [max(len(head[i]), *(len(b[i]) for b in body)) if body else len(head[i]) for i in range(4)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(b) for b in body])


def counts(rows: Iterable[Row], which: str) -> dict[str, int]:
    c: dict[str, int] = {}
    for r in rows:
        o = getattr(r, which)
        if o is not None:
            c[o.verdict] = c.get(o.verdict, 0) + 1
    return c


# ----- main -------------------------------------------------------------------------------------


def select(entries: list[Entry], names: str | None, gating_only: bool) -> list[Entry]:
    """The entries named (comma-separated, in cfg order) or, with gating_only, the GATING ones.
    Raises SystemExit for an unknown name."""
    chosen = entries
    if names:
        want = [n.strip() for n in names.split(",") if n.strip()]
        unknown = sorted(set(want) - {e.name for e in entries})
        if unknown:
            raise SystemExit(f"unknown entries: {', '.join(unknown)} (see {CFG})")
        chosen = [e for e in entries if e.name in want]
    if gating_only:
        chosen = [e for e in chosen if e.name in GATING]
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m ignition.kvm_unit_tests", description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", help="comma-separated cfg entries (default: all)")
    ap.add_argument("--gating", action="store_true", help="only the gating entries")
    ap.add_argument("--backend", default=None, help="boot's backend (default: boot's default)")
    ap.add_argument(
        "--boot", type=Path, default=None, help="the boot binary (default: $IGNITION_BOOT or target/release/boot)"
    )
    ap.add_argument(
        "--qemu",
        choices=["record", "live", "none"],
        default="record",
        help=f"QEMU's verdicts: from {RECORD.relative_to(paths.REPO_ROOT)} (default), run now, or none",
    )
    ap.add_argument(
        "--record-qemu",
        action="store_true",
        help="run every entry on QEMU and rewrite the record (Ignition is not run)",
    )
    ap.add_argument("--qemu-bin", default=qemu.QEMU)
    ap.add_argument("--max-smp", type=int, default=DEFAULT_MAX_SMP, help="$MAX_SMP in the cfg (default %(default)s)")
    ap.add_argument("--json", type=Path, default=paths.RESULTS_DIR / "kvm-unit-tests.json")
    ap.add_argument("-v", "--verbose", action="store_true", help="print each failed run's console")
    args = ap.parse_args(argv)

    entries = select(load_entries(), args.entries, args.gating)
    backend = args.backend or timeouts.default_backend()
    rows: list[Row] = []

    if args.record_qemu:
        if args.entries or args.gating:
            raise SystemExit("--record-qemu records every entry; drop --entries/--gating")
        rec = {
            "suite_commit": SUITE_COMMIT,
            "qemu": qemu_version(args.qemu_bin),
            "max_smp": args.max_smp,
            "command": RECORD_COMMAND,
            "reference": "qemu-system-aarch64 -M virt,gic-version=3 -cpu max "
            "-smp N -m M -nographic -no-reboot -kernel T.flat -append ARGS (plus the entry's qemu_params)",
            "recorded": datetime.date.today().isoformat(),
            "entries": {},
        }
        for e in entries:
            o = run_qemu(e, args.max_smp, args.qemu_bin)
            print(f"{e.name}: {o.verdict} ({o.summary})", flush=True)
            rec["entries"][e.name] = o.as_json()
            rows.append(Row(e, None, o))
        RECORD.write_text(json.dumps(rec, indent=1) + "\n")
        print(table(rows, backend))
        print(f"wrote {RECORD}")
        return 0

    recorded: dict[str, Outcome] = {}
    if args.qemu == "record":
        try:
            recorded = record_outcomes(load_record(), args.max_smp)
        except (OSError, ValueError, KeyError) as e:
            raise SystemExit(f"cannot use the QEMU record: {e}") from e
    boot = args.boot or paths.boot_bin()
    if not boot.is_file():
        raise SystemExit(f"{boot} not built: cargo build --release --bin boot")
    image_dir = paths.REPO_ROOT / "target" / "kvm-unit-tests"
    for entry in entries:
        ig = run_ignition(entry, boot, image_dir, args.backend, args.max_smp)
        qe = run_qemu(entry, args.max_smp, args.qemu_bin) if args.qemu == "live" else recorded.get(entry.name)
        rows.append(Row(entry, ig, qe))
        print(f"{entry.name}: Ignition {ig.verdict}, QEMU {qe.verdict if qe else '-'} ({ig.summary})", flush=True)
        if args.verbose and ig.verdict == "FAIL":
            tail = ig.console.replace("\r", "").strip().splitlines()[-30:]
            print("\n".join(f"  | {t}" for t in tail), flush=True)

    print()
    print(table(rows, backend))
    gate = [r.entry.name for r in rows if r.gate_failed]
    print(f"\nIgnition: {counts(rows, 'ignition')}; QEMU: {counts(rows, 'qemu')}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "suite_commit": SUITE_COMMIT,
                "backend": backend,
                "max_smp": args.max_smp,
                "qemu_source": args.qemu,
                "gate_failures": gate,
                "entries": {
                    r.entry.name: {
                        "gating": r.gating,
                        "cpus": r.entry.cpus(args.max_smp),
                        "mem_mib": r.entry.mem_mib(),
                        "args": r.entry.test_args,
                        "ignition": r.ignition.as_json(with_console=True) if r.ignition else None,
                        "qemu": r.qemu.as_json() if r.qemu else None,
                    }
                    for r in rows
                },
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.json}")
    if gate:
        print(f"GATE: {', '.join(gate)} pass on QEMU but not on Ignition", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
