"""ignition.mac_check (scripts/mac-check.sh's logic) on simulated hosts: the plan for a Mac
(macOS 15 and 14, with and without cmake) and Linux, the JUnit counts, the table, and the
whole check with a recording runner in place of cargo, pytest and the benchmarks. CI also
runs the real check on emu (.ci/run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ignition import conformance, mac_check
from ignition.conformance import Result
from ignition.mac_check import Counts, Host, Report, check, make_plan, table


def host(system: str = "Darwin", release: str = "15.1", cmake: bool = True) -> Host:
    machine = "arm64" if system == "Darwin" else "x86_64"
    return Host(system, machine, release, "24B83", "Apple M2", "abc1234", False, cmake)


SUITES = ["test_boot_e2e", "test_snapshot_e2e"]


def plan(h: Host, backend: str | None = None, benches=("boot", "snapshot", "net")):
    return make_plan(h, backend, SUITES, benches, 1)


def test_a_mac_on_15_runs_both_gics_with_emu_and_qemu_hvf_beside():
    p = plan(host())
    assert (p.backend, p.gics, p.skipped_gic, p.accel, p.sign) == ("hvf", ("userspace", "hvf"), None, "hvf", True)
    assert p.emu_build and p.peer_emu


def test_a_mac_on_14_skips_the_in_kernel_gic_and_without_cmake_emu():
    p = plan(host(release="14.6", cmake=False))
    assert p.gics == ("userspace",) and p.skipped_gic == "needs macOS 15 (this is 14.6)"
    assert not p.emu_build and not p.peer_emu and "brew install cmake" in (p.no_emu_reason or "")


def test_linux_runs_emu_beside_qemu_tcg_and_refuses_hvf():
    p = plan(host("Linux", "6.1"))
    assert (p.backend, p.gics, p.accel, p.sign, p.peer_emu) == ("emu", ("userspace",), "tcg", False, False)
    with pytest.raises(ValueError, match="needs macOS on Apple Silicon"):
        plan(host("Linux", "6.1"), "hvf")
    with pytest.raises(ValueError, match="no e2e suite test_nope"):
        make_plan(host("Linux"), None, ["test_nope"], (), 1)


def test_every_e2e_suite_is_run_by_default():
    suites = mac_check.e2e_suites()
    for s in ("test_boot_e2e", "test_background_snapshot_e2e", "test_clock_e2e", "test_conformance"):
        assert s in suites
    assert "test_kvm_unit_tests_e2e" in suites and "test_oci_e2e" in suites
    assert "test_mac_check" not in suites and "test_console" not in suites
    assert make_plan(host("Linux"), None, None, (), 1).suites == tuple(suites)


JUNIT = """<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="scripts.tests.test_boot_e2e" name="a"/>
<testcase classname="scripts.tests.test_boot_e2e" name="b">{fail}</testcase>
<testcase classname="scripts.tests.test_snapshot_e2e" name="c">{skip}</testcase>
<testcase classname="scripts.tests.test_snapshot_e2e" name="d"/>
</testsuite></testsuites>
"""


def junit(path: Path, failing: bool) -> None:
    fail, skip = ('<failure message="x"/>', '<skipped message="y"/>') if failing else ("", "")
    path.write_text(JUNIT.format(fail=fail, skip=skip))


def test_junit_counts(tmp_path):
    junit(tmp_path / "a.xml", failing=True)
    c = mac_check.junit_counts(tmp_path / "a.xml", SUITES)
    assert c == {"test_boot_e2e": Counts(1, 1, 0, 0), "test_snapshot_e2e": Counts(1, 0, 0, 1)}
    assert c["test_boot_e2e"].cell() == "1 passed, 1 failed ✗"
    assert c["test_snapshot_e2e"].cell() == "1 passed, 1 skipped"
    assert mac_check.junit_counts(tmp_path / "missing.xml", SUITES) is None


def group(name: str, lost: list[str] | None = None, status: str = "pass") -> Result:
    r = Result(name, "hvf", status=status, checks={"c": None})
    r.lost = lost or []
    if name == "sgi":
        r.latency[mac_check.LATENCY] = conformance.latency_summary([24, 48, 72], 24_000_000)
    return r


def report(p, failing=False, lost=None) -> Report:
    r = Report(host(), p, started="2026-11-26 18:00 UTC")
    for g in p.gics:
        r.suites[g] = {s: Counts(2, 0, 0, 0) for s in p.suites}
        r.conformance[g] = [group("sgi", lost), group("vtimer")]
    if failing:
        r.suites["hvf"] = {"test_boot_e2e": Counts(1, 1, 0, 0), "test_snapshot_e2e": Counts(2, 0, 0, 0)}
    r.figures = {
        "hvf (userspace GIC)": mac_check.Figures(0.52, 0.8, 2.0, 410.0, 650.0),
        "emu": mac_check.Figures(0.9, 0.6, 3.5, 1200.0, 580.0),
        "QEMU (hvf)": mac_check.Figures(0.4, 1.0, 60.0),
    }
    r.benches = {"boot": "ran", "net": "not run: needs passt (Linux)"}
    return r


def test_the_table_has_every_suite_and_figure_beside_emu_and_qemu():
    md = table(report(plan(host())))
    assert md.startswith("### Ignition check (`scripts/mac-check.sh`)\n")
    assert "macOS 15.1 (24B83), arm64, Apple M2; commit abc1234;" in md
    header = "| what | hvf (userspace GIC) | hvf (in-kernel GIC) | emu | QEMU (hvf) |"
    assert header in md
    assert "| test_boot_e2e | 2 passed | 2 passed |  |  |" in md
    assert "| conformance groups | 2/2 groups pass; lost wake-ups: 0 | 2/2 groups pass; lost wake-ups: 0 |" in md
    assert "| interrupt latency, sgi-cross-cpu (median) | 2.0 µs (p99 3.0 µs, n=3) |" in md
    assert "| boot to login | 0.52 s |  | 0.90 s | 0.40 s |" in md
    assert "| restore to running | 2.0 ms |  | 3.5 ms | 60.0 ms |" in md
    assert (
        "| branch into 4: request to all ready | 410 ms (source paused 650 µs) |  "
        "| 1200 ms (source paused 580 µs) | n/a (QEMU has no branch) |"
    ) in md
    assert "net: not run: needs passt (Linux)" in md and "**all passed**" in md
    # Markdown: every row has as many cells as the header.
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert {row.count("|") for row in rows} == {header.count("|")}


def test_a_failed_suite_or_a_lost_wake_up_fails_the_check():
    p = plan(host())
    assert report(p).ok()
    bad = report(p, failing=True)
    assert not bad.ok() and "| test_boot_e2e | 2 passed | 1 passed, 1 failed ✗ |" in table(bad)
    lost = report(p, lost=["sgi-cross-cpu intid=5 cpu=1"])
    assert not lost.ok()
    assert "lost wake-ups: 1 ✗ (sgi: sgi-cross-cpu intid=5 cpu=1)" in table(lost) and "**FAILED**" in table(lost)
    no_results = report(p)
    no_results.suites["hvf"] = None
    assert not no_results.ok() and "no results (see log)" in table(no_results)


def test_macos_14_says_why_the_in_kernel_gic_did_not_run():
    p = plan(host(release="14.6", cmake=False))
    md = table(report(p))
    assert "| test_boot_e2e | 2 passed | not run: needs macOS 15 (this is 14.6) |" in md
    assert "not built: no cmake (brew install cmake)" in md


def test_the_check_runs_build_sign_suites_conformance_and_benchmarks_in_order(tmp_path, monkeypatch):
    calls: list[list[str]] = []

    def run(argv, log):
        argv = list(argv)
        calls.append(argv)
        for a in argv:
            if a.startswith("--junitxml="):
                junit(Path(a.split("=", 1)[1]), failing="hvf" in argv[argv.index("--gic") + 1])
        if "ignition.bench.boot" in argv:
            out = Path(argv[argv.index("--out") + 1])
            out.parent.mkdir(parents=True, exist_ok=True)
            body = {"ignition": {"login": {"median_s": 0.5}}}
            if "--no-qemu" not in argv:
                body["qemu_hvf"] = {"login": {"median_s": 0.4}}
            out.write_text(json.dumps(body))
        if "ignition.bench.branch" in argv:
            assert argv[argv.index("--counts") + 1] == str(mac_check.BRANCH_N)
            out = Path(argv[argv.index("--out") + 1])
            ms = 400.0 if "hvf" in argv else 1200.0
            assert argv[argv.index("--methods") + 1] == "branch" and argv[argv.index("--state") + 1] == "idle"
            summary = {"branch": {"idle": {str(mac_check.BRANCH_N): {"ready_ms": ms, "pause_us": 600.0}}}}
            out.write_text(json.dumps({"summary": summary}))
        return 0

    monkeypatch.setattr(mac_check, "run_conformance", lambda p, gic: [group("sgi")])
    monkeypatch.setattr(mac_check, "bench_missing", lambda name: "needs passt (Linux)" if name == "net" else None)
    p = plan(host(), benches=("boot", "snapshot", "branch", "net"))
    r = check(p, host(), tmp_path, ["-x"], run)
    heads = [c[0] if c[0] == "cargo" else Path(c[0]).name for c in calls]
    assert calls[0] == ["cargo", "build", "--release", "--workspace", "--bins"]
    assert calls[1] == [*calls[0], "--features", "ignition-vmm/emu"]
    assert heads[2] == "sign.sh" and calls[2][1].endswith("target/release/boot")
    pytest_runs = [c for c in calls if "pytest" in c]
    assert [c[c.index("--gic") + 1] for c in pytest_runs] == ["userspace", "hvf"]
    for c in pytest_runs:
        assert c[-1] == "-x" and "--backend" in c and c[c.index("--backend") + 1] == "hvf"
        assert c[c.index("-m", 3) + 1] == "e2e"
    benches = [
        (c[2], c[c.index("--backend") + 1], c[c.index("--gic") + 1], "--no-qemu" in c)
        for c in calls
        if "--gic" in c and "pytest" not in c
    ]
    assert benches == [
        ("ignition.bench.boot", "hvf", "userspace", False),
        ("ignition.bench.snapshot", "hvf", "userspace", False),
        ("ignition.bench.branch", "hvf", "userspace", False),
        ("ignition.bench.boot", "hvf", "hvf", True),
        ("ignition.bench.snapshot", "hvf", "hvf", True),
        ("ignition.bench.branch", "hvf", "hvf", False),
        ("ignition.bench.boot", "emu", "userspace", True),
        ("ignition.bench.snapshot", "emu", "userspace", True),
        ("ignition.bench.branch", "emu", "userspace", False),
    ]
    assert all(c[c.index("--accel") + 1] == "hvf" for c in calls if "--accel" in c)
    assert r.benches["net"] == "not run: needs passt (Linux)"
    assert r.figures["QEMU (hvf)"].login_s == 0.4 and r.figures["emu"].login_s == 0.5
    assert r.figures["hvf (in-kernel GIC)"].branch_ready_ms == 400.0 and r.figures["emu"].branch_ready_ms == 1200.0
    assert "| branch into 4: request to all ready | 400 ms (source paused 600 µs) |" in table(r)
    assert not r.ok(), "the in-kernel GIC's run failed a test"
    assert "| test_boot_e2e | 2 passed | 1 passed, 1 failed ✗ |" in table(r)


def test_main_refuses_hvf_off_a_mac_and_a_missing_guest(monkeypatch, capsys):
    monkeypatch.setattr(mac_check, "probe_host", lambda: host("Linux", "6.1"))
    assert mac_check.main(["--backend", "hvf"]) == 2
    assert "needs macOS on Apple Silicon" in capsys.readouterr().err
    monkeypatch.setattr(mac_check, "missing_guest", lambda: ["guest/out/Image"])
    assert mac_check.main(["--backend", "emu", "--suites", "test_boot_e2e"]) == 1
    assert "guest/fetch.sh" in capsys.readouterr().err


def test_a_failed_emu_build_leaves_hvf_running_and_says_so(tmp_path, monkeypatch):
    def run(argv, log):
        argv = list(argv)
        if argv[:2] == ["cargo", "build"] and "--features" in argv:
            return 101
        for a in argv:
            if a.startswith("--junitxml="):
                junit(Path(a.split("=", 1)[1]), failing=False)
        return 0

    monkeypatch.setattr(mac_check, "run_conformance", lambda p, gic: [group("sgi")])
    r = check(plan(host(), benches=("boot",)), host(), tmp_path, [], run)
    assert [k for k in r.benches] == ["boot", "boot (hvf (in-kernel GIC))"], "no emu column"
    md = table(r)
    assert "| boot to login |" in md and "build with --features ignition-vmm/emu failed (build.log) ✗" in md
    assert not r.ok()
