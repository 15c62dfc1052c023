"""The first-run check of a host: everything end to end on one backend, beside its peers, in one table.

On a Mac (Apple Silicon) it builds Ignition (with the emu backend too when cmake is there),
signs `boot`, and runs on `--backend hvf`, first with the userspace GIC and then, on macOS 15
or later, with the in-kernel GIC (`--gic hvf`):

- the whole end-to-end pytest suite (every module of scripts/tests with e2e tests, the
  kvm-unit-tests gating entries among them), one JUnit file per GIC;
- the conformance groups (guest/conformance), whose bounded waits report a lost wake-up (an
  interrupt raised for a running vCPU and never taken) as a `LOST` line, and their
  interrupt-latency runs;
- the benchmarks in a short mode (ignition.bench.*): boot to login, snapshot pause and
  restore, and `branch` into BRANCH_N children, on this backend and on emu; boot and snapshot
  on QEMU too (`-accel hvf` on a Mac, TCG elsewhere; QEMU has no branch); the others where
  their tools are.

It ends with one Markdown table (also in OUT/summary.md) to paste into an issue: pass/fail per
suite and the headline figures beside emu's and QEMU's. On Linux it runs the same way with
`--backend emu` (CI runs it with `--suites` naming a few suites, the whole suite having run in
its test stage). Exit status 0 only if every suite ran and passed, no wake-up was lost and
every benchmark that could run did.

    scripts/mac-check.sh                                  # the wrapper: pip installs, then this
    python3 -m ignition.mac_check --backend emu --suites test_boot_e2e --bench-runs 1
    python3 -m ignition.mac_check -- -x -k snapshot       # arguments after -- go to pytest
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import conformance, paths, qemu

OUT_DIR = paths.REPO_ROOT / "target" / "mac-check"
"""Logs, JUnit files, benchmark JSON and summary.md ($MAC_CHECK_OUT, else this)."""
TESTS = paths.SCRIPTS / "tests"
LATENCY = "sgi-cross-cpu"
"""The latency figure in the table: an SGI from one vCPU to another that spins (a kick)."""
BRANCH_N = 4
"""Children per `branch` request in the table's branch row."""
BENCHES = ("boot", "snapshot", "branch", "diff_snapshot", "net", "oci")
"""ignition.bench modules run, in this order."""

Run = Callable[[Sequence[str], Path], int]
"""Runs argv with stdout and stderr to a log file (appended), in the repository; the exit status."""


def run_logged(argv: Sequence[str], log: Path) -> int:
    """Run: argv's output goes to `log` and to this terminal.

    The child imports `ignition` from this checkout (PYTHONPATH), whichever
    checkout the installed package points at."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"[mac-check] {' '.join(argv)}  (log: {log})", flush=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(paths.SCRIPTS), env.get("PYTHONPATH")]))
    with open(log, "ab") as f:
        p = subprocess.Popen(list(argv), cwd=paths.REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = p.stdout
        assert out is not None
        while chunk := os.read(out.fileno(), 65536):
            f.write(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        return p.wait()


@dataclass(frozen=True)
class Host:
    """What the table says of the host and the tree."""

    system: str
    """`Darwin` or `Linux`."""
    machine: str
    release: str
    """macOS product version (`15.1`), else the kernel release."""
    build: str
    chip: str
    commit: str
    dirty: bool
    cmake: bool
    """cmake is on PATH (the emu backend's C build needs it)."""

    @property
    def mac(self) -> bool:
        return self.system == "Darwin" and self.machine in ("arm64", "aarch64")

    @property
    def macos_major(self) -> int:
        try:
            return int(self.release.split(".")[0]) if self.system == "Darwin" else 0
        except ValueError:
            return 0


def sh(argv: Sequence[str]) -> str:
    """A command's stdout, stripped; "" if it fails or is missing."""
    try:
        r = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, cwd=paths.REPO_ROOT)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def probe_host() -> Host:
    system = platform.system()
    if system == "Darwin":
        release, build = sh(["sw_vers", "-productVersion"]), sh(["sw_vers", "-buildVersion"])
        chip = sh(["sysctl", "-n", "machdep.cpu.brand_string"])
    else:
        from . import host

        release, build, chip = platform.release(), "", host.cpu_model()
    return Host(
        system=system,
        machine=platform.machine(),
        release=release or "?",
        build=build or "?",
        chip=chip or "unknown",
        commit=sh(["git", "rev-parse", "--short", "HEAD"]) or "unknown",
        dirty=bool(sh(["git", "status", "--porcelain", "--untracked-files=no"])),
        cmake=shutil.which("cmake") is not None,
    )


@dataclass(frozen=True)
class Plan:
    """What one check runs."""

    backend: str
    gics: tuple[str, ...]
    """GIC modes the suites, conformance and this backend's figures run with."""
    skipped_gic: str | None
    """Why the in-kernel GIC is not run (hvf before macOS 15), else None."""
    emu_build: bool
    """A second build with the emu backend (a Mac with cmake), for figures on emu beside hvf;
    if it fails, the check goes on without them."""
    peer_emu: bool
    """Figures on emu too (hvf runs and emu is to be built)."""
    no_emu_reason: str | None
    accel: str
    """QEMU's accelerator: hvf on a Mac, else tcg."""
    suites: tuple[str, ...]
    benches: tuple[str, ...]
    bench_runs: int
    sign: bool


def e2e_suites() -> list[str]:
    """Every module of scripts/tests that has an e2e test (a `pytest.mark.e2e` in it), sorted."""
    return sorted(p.stem for p in TESTS.glob("test_*.py") if "mark.e2e" in p.read_text())


def make_plan(host: Host, backend: str | None, suites: Sequence[str] | None, benches: Sequence[str], runs: int) -> Plan:
    """The plan for `host`; raises ValueError for a backend the host cannot run."""
    backend = backend or ("hvf" if host.mac else "emu")
    if backend == "hvf" and not host.mac:
        raise ValueError(f"--backend hvf needs macOS on Apple Silicon; this is {host.system} {host.machine}")
    gics: tuple[str, ...] = ("userspace",)
    skipped_gic = None
    if backend == "hvf":
        if host.macos_major >= 15:
            gics = ("userspace", "hvf")
        else:
            skipped_gic = f"needs macOS 15 (this is {host.release})"
    peer_emu, no_emu = False, None
    if backend == "hvf":
        if host.cmake:
            peer_emu = True
        else:
            no_emu = "not built: no cmake (brew install cmake)"
    known = e2e_suites()
    chosen = tuple(suites) if suites else tuple(known)
    unknown = [s for s in chosen if s not in known]
    if unknown:
        raise ValueError(f"no e2e suite {', '.join(unknown)} in {TESTS} (known: {', '.join(known)})")
    return Plan(
        backend=backend,
        gics=gics,
        skipped_gic=skipped_gic,
        emu_build=peer_emu,
        peer_emu=peer_emu,
        no_emu_reason=no_emu,
        accel="hvf" if host.mac else "tcg",
        suites=chosen,
        benches=tuple(benches),
        bench_runs=runs,
        sign=host.system == "Darwin",
    )


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.errors == 0 and self.passed > 0

    def cell(self) -> str:
        parts = [f"{self.passed} passed"]
        more = ((self.failed, "failed"), (self.errors, "errors"), (self.skipped, "skipped"))
        parts += [f"{n} {w}" for n, w in more if n]
        return ", ".join(parts) + ("" if self.ok else " ✗")


def junit_counts(xml: Path, suites: Sequence[str]) -> dict[str, Counts] | None:
    """Per suite (module name), its test cases' outcomes in a pytest JUnit file; None if the
    file is missing or unreadable (pytest did not get to write it)."""
    try:
        root = ET.parse(xml).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = {s: Counts() for s in suites}
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")
        suite = next((p for p in parts if p in counts), None)
        if suite is None:
            continue
        kinds = {child.tag for child in case}
        c = counts[suite]
        if "failure" in kinds:
            c.failed += 1
        elif "error" in kinds:
            c.errors += 1
        elif "skipped" in kinds:
            c.skipped += 1
        else:
            c.passed += 1
    return counts


@dataclass
class Figures:
    """Headline figures of one column; None: not measured."""

    login_s: float | None = None
    pause_ms: float | None = None
    restore_ms: float | None = None
    branch_ready_ms: float | None = None
    """`branch` into BRANCH_N children: request to every child ready (median)."""
    branch_pause_us: float | None = None
    """The source's pause in that request (median)."""


@dataclass
class Report:
    host: Host
    plan: Plan
    suites: dict[str, dict[str, Counts] | None] = field(default_factory=dict)
    """GIC -> suite counts (None: no JUnit file)."""
    conformance: dict[str, list[conformance.Result]] = field(default_factory=dict)
    """GIC -> each group's result on this backend."""
    figures: dict[str, Figures] = field(default_factory=dict)
    """Column -> figures."""
    benches: dict[str, str] = field(default_factory=dict)
    """Bench module -> `ran`, `FAILED (log)` or `not run: why`."""
    started: str = ""
    emu_problem: str | None = None
    """Why the emu column is empty although planned (its build failed)."""

    def ok(self) -> bool:
        suites_ok = all(counts is not None and all(c.ok for c in counts.values()) for counts in self.suites.values())
        conf_ok = all(r.status == "pass" and not r.lost for rs in self.conformance.values() for r in rs)
        benches_ok = all(not b.startswith("FAILED") for b in self.benches.values())
        return suites_ok and conf_ok and benches_ok and self.emu_problem is None


def column(plan: Plan, gic: str) -> str:
    return f"{plan.backend} ({'in-kernel' if gic == 'hvf' else 'userspace'} GIC)"


def qemu_column(plan: Plan) -> str:
    return f"QEMU ({plan.accel.upper() if plan.accel == 'tcg' else 'hvf'})"


def fmt(v: float | None, unit: str, nd: int = 1) -> str:
    return "—" if v is None else f"{v:.{nd}f} {unit}"


def table(r: Report) -> str:
    """The Markdown block to paste: a header line and one table."""
    p, h = r.plan, r.host
    cols = [column(p, g) for g in p.gics]
    if p.skipped_gic:
        cols.append(column(p, "hvf"))
    if p.backend == "hvf":
        cols.append("emu")
    cols.append(qemu_column(p))
    blank = dict.fromkeys(cols, "")

    def row(what: str, cells: dict[str, str]) -> str:
        return f"| {what} | " + " | ".join(cells.get(c, "") for c in cols) + " |"

    rows = []
    for suite in p.suites:
        cells = dict(blank)
        for g in p.gics:
            counts = r.suites.get(g)
            cells[column(p, g)] = "no results (see log)" if counts is None else counts[suite].cell()
        if p.skipped_gic:
            cells[column(p, "hvf")] = f"not run: {p.skipped_gic}"
        rows.append(row(suite, cells))
    conf, lat = dict(blank), dict(blank)
    for g in p.gics:
        rs = r.conformance.get(g, [])
        n_pass = sum(1 for x in rs if x.status == "pass")
        lost = [f"{x.group}: {w}" for x in rs for w in x.lost]
        failed = [x.group for x in rs if x.status != "pass"]
        cell = f"{n_pass}/{len(rs)} groups pass; lost wake-ups: {len(lost)}"
        if failed:
            cell += f" ✗ (failed: {', '.join(failed)})"
        if lost:
            cell += " ✗ (" + "; ".join(lost) + ")"
        conf[column(p, g)] = cell
        s = next((x.latency.get(LATENCY) for x in rs if LATENCY in x.latency), None)
        if s and s.get("n"):
            lat[column(p, g)] = f"{s['median_ns'] / 1000:.1f} µs (p99 {s['p99_ns'] / 1000:.1f} µs, n={s['n']})"
    rows.append(row("conformance groups", conf))
    rows.append(row(f"interrupt latency, {LATENCY} (median)", lat))
    for what, attr, unit, nd in (
        ("boot to login", "login_s", "s", 2),
        ("snapshot pause", "pause_ms", "ms", 2),
        ("restore to running", "restore_ms", "ms", 1),
    ):
        cells = dict(blank)
        for col, f in r.figures.items():
            cells[col] = fmt(getattr(f, attr), unit, nd)
        if p.backend == "hvf" and (r.emu_problem or not p.peer_emu):
            cells["emu"] = (r.emu_problem or p.no_emu_reason or "") + (" ✗" if r.emu_problem else "")
        rows.append(row(what, cells))
    cells = dict(blank)
    for col, f in r.figures.items():
        if f.branch_ready_ms is not None:
            cells[col] = f"{f.branch_ready_ms:.0f} ms (source paused {f.branch_pause_us:.0f} µs)"
    cells[qemu_column(p)] = "n/a (QEMU has no branch)"
    rows.append(row(f"branch into {BRANCH_N}: request to all ready", cells))
    bench = ", ".join(f"{k}: {v}" for k, v in r.benches.items()) or "none run"
    release = f"macOS {h.release} ({h.build})" if h.system == "Darwin" else f"{h.system} {h.release}"
    head = [
        "### Ignition check (`scripts/mac-check.sh`)",
        "",
        f"{release}, {h.machine}, {h.chip}; commit {h.commit}{' + local changes' if h.dirty else ''}; "
        f"{r.started}; backend {p.backend}; figures are medians of {p.bench_runs} run(s), 512 MiB, idle guest.",
        "",
        "| what | " + " | ".join(cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    verdict = "**all passed**" if r.ok() else "**FAILED** (✗ above; logs beside summary.md)"
    return "\n".join(head + rows + ["", f"Benchmarks (short mode): {bench}. {verdict}"]) + "\n"


def missing_guest() -> list[str]:
    """The guest's files that are missing (the conformance images too where they cannot be
    built: no aarch64 cross compiler, as on a Mac)."""
    need = [paths.GUEST_OUT / f for f in ("Image", "rootfs.ext4", "guest.json")]
    if not conformance.cross_compiler():
        need += [paths.GUEST_OUT / "conformance" / f"{g}.Image" for g in conformance.GROUPS]
    return [str(p.relative_to(paths.REPO_ROOT)) for p in need if not p.is_file()]


def conformance_images() -> Path:
    """Built from guest/conformance where a cross compiler is (as the pytest module does), else
    the guest build's copy (guest/out/conformance)."""
    if conformance.cross_compiler():
        conformance.build(conformance.IMAGES_DIR)
        return conformance.IMAGES_DIR
    return paths.GUEST_OUT / "conformance"


def run_conformance(plan: Plan, gic: str) -> list[conformance.Result]:
    """Every group on this backend with `gic`, bounded by the backend's command timeout."""
    images = conformance_images()
    out = []
    for g in conformance.GROUPS:
        r = conformance.run_ignition(g, images, paths.boot_bin(), plan.backend, gic)
        print(f"[mac-check] conformance {g} on {plan.backend} --gic {gic}: {r.summary()}", flush=True)
        out.append(r)
    return out


def bench_argv(
    plan: Plan, name: str, out: Path, backend: str, gic: str, first: bool, with_qemu: bool
) -> list[str] | None:
    """`python3 -m ignition.bench.NAME` in its short mode, or None if it is not run for this
    column (the benchmarks other than boot and snapshot run once, in the first column)."""
    base = [sys.executable, "-m", f"ignition.bench.{name}"]
    runs = str(plan.bench_runs)
    q = [] if with_qemu else ["--no-qemu"]
    ig = ["--backend", backend, "--gic", gic, "--accel", plan.accel, "--out", str(out), *q]
    if name == "boot":
        return base + ["--runs", runs, *ig]
    if name == "snapshot":
        return base + ["--mem", "512", "--state", "idle", "--runs", runs, *ig]
    if name == "branch":
        return base + [
            "--counts", str(BRANCH_N), "--runs", runs, "--methods", "branch", "--state", "idle",
            "--backend", backend, "--gic", gic, "--out", str(out),
        ]  # fmt: skip
    if not first:
        return None
    if name == "diff_snapshot":
        return base + ["--runs", runs, "--backend", backend]
    if name == "net":
        return base + ["--runs", runs, "--mib", "8", "--backend", backend, "--out", str(out), *q]
    if name == "oci":
        return base + ["--runs", runs, "--full-mib", "64", "--out", str(out)]
    return None


def bench_missing(name: str) -> str | None:
    """Why a benchmark cannot run on this host, else None."""
    if name == "net" and shutil.which("passt") is None:
        return "needs passt (Linux)"
    if name == "oci":
        from .registry import REGISTRY_BIN

        if not REGISTRY_BIN.is_file():
            return f"needs a registry ({REGISTRY_BIN})"
    return None


def figures_from(boot_json: Path, snap_json: Path, branch_json: Path) -> tuple[Figures, Figures | None]:
    """(Ignition's, QEMU's or None) from the boot, snapshot and branch benchmarks' JSON."""
    ig, qm = Figures(), None
    try:
        b = json.loads(boot_json.read_text())
        ig.login_s = b["ignition"]["login"]["median_s"]
        q = next((v for k, v in b.items() if k.startswith("qemu_")), None)
        if q:
            qm = Figures(login_s=q["login"]["median_s"])
    except (OSError, ValueError, KeyError):
        pass
    try:
        s = json.loads(snap_json.read_text())["results"]["512/idle"]
        ig.pause_ms = s["ignition"]["pause_ms"]["median"]
        ig.restore_ms = s["ignition"]["restore_running_ms"]["median"]
        if "qemu" in s:
            qm = qm or Figures()
            qm.pause_ms = s["qemu"]["pause_ms"]["median"]
            qm.restore_ms = s["qemu"]["restore_running_ms"]["median"]
    except (OSError, ValueError, KeyError):
        pass
    try:
        br = json.loads(branch_json.read_text())["summary"]["branch"]["idle"][str(BRANCH_N)]
        ig.branch_ready_ms = br["ready_ms"]
        ig.branch_pause_us = br["pause_us"]
    except (OSError, ValueError, KeyError):
        pass
    return ig, qm


def check(plan: Plan, host: Host, out: Path, pytest_args: Sequence[str], run: Run, build: bool = True) -> Report:
    """Runs the plan; returns the report (the table is table(report))."""
    report = Report(host, plan, started=time.strftime("%Y-%m-%d %H:%M %Z"))
    log = out / "build.log"
    emu = plan.peer_emu
    if build:
        cargo = ["cargo", "build", "--release", "--workspace", "--bins"]
        if run(cargo, log) != 0:
            raise RuntimeError(f"cargo build failed: see {log}")
        # Then with emu too: a failure leaves the first build's boot (hvf only) in place.
        if plan.emu_build and run([*cargo, "--features", "ignition-vmm/emu"], log) != 0:
            report.emu_problem, emu = "build with --features ignition-vmm/emu failed (build.log)", False
        # After the last build: cargo's output has no signature, and HVF answers HV_DENIED.
        if plan.sign and run([str(paths.SCRIPTS / "sign.sh"), str(paths.boot_bin())], log) != 0:
            raise RuntimeError(f"signing boot failed: see {log}")
    for gic in plan.gics:
        xml = out / f"gic-{gic}.xml"
        xml.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "pytest", "-q", *[str(TESTS / f"{s}.py") for s in plan.suites]]
        argv += ["-m", "e2e", "--backend", plan.backend, "--gic", gic, f"--junitxml={xml}", *pytest_args]
        run(argv, out / f"gic-{gic}.log")
        report.suites[gic] = junit_counts(xml, plan.suites)
        report.conformance[gic] = run_conformance(plan, gic)
    benches = out / "bench"
    columns = [(plan.backend, gic, column(plan, gic)) for gic in plan.gics]
    if emu:
        columns.append(("emu", "userspace", "emu"))
    for i, (backend, gic, col) in enumerate(columns):
        with_qemu = i == 0
        tag = f"{backend}-{gic}"
        for name in plan.benches:
            why = bench_missing(name)
            bench = bench_argv(plan, name, benches / f"{name}-{tag}.json", backend, gic, i == 0, with_qemu)
            if bench is None:
                continue
            key = name if i == 0 else f"{name} ({col})"
            if why:
                report.benches[key] = f"not run: {why}"
                continue
            rc = run(bench, out / f"bench-{name}-{tag}.log")
            report.benches[key] = "ran" if rc == 0 else f"FAILED (bench-{name}-{tag}.log)"
        ig, qm = figures_from(*(benches / f"{b}-{tag}.json" for b in ("boot", "snapshot", "branch")))
        report.figures[col] = ig
        if with_qemu and qm:
            report.figures[qemu_column(plan)] = qm
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    pytest_args: list[str] = []
    if "--" in args_in:
        i = args_in.index("--")
        args_in, pytest_args = args_in[:i], args_in[i + 1 :]
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.mac_check", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--backend", choices=["hvf", "emu"], help="default: hvf on a Mac, else emu")
    p.add_argument("--suites", help="comma-separated pytest modules (default: every e2e suite)")
    p.add_argument("--benches", default=",".join(BENCHES), help=f"comma-separated (default: {','.join(BENCHES)})")
    p.add_argument("--bench-runs", type=int, default=3, help="runs per figure (default: 3)")
    p.add_argument("--no-build", action="store_true", help="use the binaries already in target/release")
    p.add_argument("--out", type=Path, default=Path(os.environ.get("MAC_CHECK_OUT", OUT_DIR)))
    args = p.parse_args(args_in)
    benches = [b for b in args.benches.split(",") if b]
    bad = [b for b in benches if b not in BENCHES]
    if bad or args.bench_runs < 1:
        p.error(f"unknown benchmark {', '.join(bad)}" if bad else "--bench-runs must be >= 1")
    host = probe_host()
    try:
        plan = make_plan(host, args.backend, args.suites.split(",") if args.suites else None, benches, args.bench_runs)
    except ValueError as e:
        print(f"mac-check: {e}", file=sys.stderr)
        return 2
    missing = missing_guest()
    if missing:
        print(
            f"mac-check: the guest is missing ({', '.join(missing)}): build it on Linux (guest/build.sh) or "
            "fetch a pushed one: guest/fetch.sh REGISTRY/REPOSITORY:TAG (README.md, Mac users)",
            file=sys.stderr,
        )
        return 1
    if shutil.which(qemu.QEMU) is None:
        print(f"mac-check: {qemu.QEMU} not found (brew install qemu; Debian: qemu-system-arm)", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for old in [*args.out.glob("*.log"), *args.out.glob("*.xml"), args.out / "summary.md"]:
        old.unlink(missing_ok=True)
    os.environ.setdefault("IGNITION_RESULTS_DIR", str(args.out / "bench"))
    try:
        report = check(plan, host, args.out, pytest_args, run_logged, build=not args.no_build)
    except RuntimeError as e:
        print(f"mac-check: {e}", file=sys.stderr)
        return 1
    md = table(report)
    (args.out / "summary.md").write_text(md)
    print("\n" + md)
    print(f"[mac-check] the table is in {args.out / 'summary.md'}; logs, JUnit XML and benchmark JSON beside it")
    return 0 if report.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
