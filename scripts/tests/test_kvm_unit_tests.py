"""The kvm-unit-tests runner's parsers (ignition.kvm_unit_tests): unittests.cfg, $MAX_SMP
arithmetic, the suite's output and exit status, the Image wrapper, the QEMU record.
No VM runs here (the gating run is test_kvm_unit_tests_e2e.py)."""

from __future__ import annotations

import json
import struct

import pytest

from ignition import kvm_unit_tests as kut
from ignition.kvm_unit_tests import CfgError, Outcome, Row

CFG = """
##############################
# a comment
[selftest-setup]
file = selftest.flat
smp = 2
test_args = 'setup smp=2 mem=256'
qemu_params = -m 256
groups = selftest

[gicv2-ipi]
file = gic.flat
smp = $((($MAX_SMP < 8)?$MAX_SMP:8))
test_args = ipi
qemu_params = -machine gic-version=2
groups = gic

[timer]
file = timer.flat
groups = timer
timeout = 10s
arch = arm64

[debug-ss-migration]
file = debug.flat
test_args = ss-migration
groups = debug migration
disabled_if = [[ "$TARGET" != qemu ]]

[old-style]
file = selftest.flat
smp = $MAX_SMP
extra_params = -append "vectors-user x" -machine gic-version=3
accel = kvm
"""


def test_cfg_entries_fields_and_defaults():
    es = {e.name: e for e in kut.parse_cfg(CFG)}
    assert list(es) == ["selftest-setup", "gicv2-ipi", "timer", "debug-ss-migration", "old-style"]
    s = es["selftest-setup"]
    assert (s.file, s.cpus(4), s.test_args, s.groups, s.mem_mib()) == (
        "selftest.flat",
        2,
        "setup smp=2 mem=256",
        ["selftest"],
        256,
    )
    assert s.extra_qemu_args() == [] and s.unsupported_on_ignition() is None
    t = es["timer"]
    assert (t.cpus(4), t.test_args, t.timeout_s, t.mem_mib(), t.arch) == (1, "", 10.0, 512, "arm64")
    d = es["debug-ss-migration"]
    assert d.migration and not t.migration
    assert d.disabled_if == '[[ "$TARGET" != qemu ]]'
    g = es["gicv2-ipi"]
    assert g.extra_qemu_args() == ["-machine", "gic-version=2"]
    assert "gic-version=2" in (g.unsupported_on_ignition() or "")
    o = es["old-style"]
    assert o.test_args == "vectors-user x"
    assert o.extra_qemu_args() == ["-machine", "gic-version=3"]
    assert o.unsupported_on_ignition() is None, "the GIC version boot has"
    assert o.accel == "kvm" and o.cpus(3) == 3


@pytest.mark.parametrize(
    "bad",
    [
        "file = x.flat\n",  # a key outside a section
        "[a]\nsmp = 1\n",  # no file
        "[a]\nfile = a.flat\n[a]\nfile = b.flat\n",  # the same name twice
        "[a]\nfile = a.flat\ntimeout = soon\n",
        "[a]\nfile = a.flat\nthis is not a key\n",
    ],
)
def test_cfg_errors(bad):
    with pytest.raises(CfgError):
        kut.parse_cfg(bad)


@pytest.mark.parametrize(
    "expr, max_smp, want",
    [
        ("1", 8, 1),
        ("$MAX_SMP", 2, 2),
        ("${MAX_SMP}", 6, 6),
        ("$((($MAX_SMP < 8)?$MAX_SMP:8))", 2, 2),
        ("$((($MAX_SMP < 8)?$MAX_SMP:8))", 64, 8),
        ("$((($MAX_SMP < 3)?$MAX_SMP:3))", 4, 3),
        ("$(($MAX_SMP / 2 + 1))", 4, 3),
        ("$(($MAX_SMP >= 4 && $MAX_SMP % 2 == 0 ? 4 : 1))", 6, 4),
    ],
)
def test_smp_arithmetic(expr, max_smp, want):
    assert kut.eval_smp(expr, max_smp) == want


@pytest.mark.parametrize("expr", ["$(( 1 / 0 ))", "$((2 - 2))", "nproc", "$((1 +))", "$(((1))"])
def test_smp_arithmetic_errors(expr):
    with pytest.raises(CfgError):
        kut.eval_smp(expr, 2)


def test_the_vendored_cfg_parses_and_names_every_gating_entry():
    entries = {e.name: e for e in kut.load_entries()}
    assert set(kut.GATING) <= set(entries)
    assert entries["pl031"].file == "pl031.flat", "the runner's own entry"
    for e in entries.values():
        assert (kut.FLAT_DIR / e.file).is_file(), e.file
        assert 1 <= e.cpus(kut.DEFAULT_MAX_SMP) <= 8
    assert entries["gicv3-ipi"].cpus(2) == 2 and entries["selftest-setup"].mem_mib() == 256


PASSED = """\
PASS: gicv3: ipi: self: Interrupts received
INFO: gicv3: ipi: target-list: sending...
SKIP: gicv3: ipi: something
SUMMARY: 3 tests, 1 skipped

EXIT: STATUS=1
"""


def test_output_pass_fail_skip_and_exit_status():
    o = kut.parse_output(PASSED.replace("\n", "\r\n"))
    assert (o.verdict, o.exit_status, o.summary) == ("PASS", 1, "3 tests, 1 skipped")
    assert [k for k, _ in o.reports] == ["PASS", "SKIP"] and o.failures == []

    o = kut.parse_output("FAIL: ss: single step\nSUMMARY: 1 tests, 1 unexpected failures\nEXIT: STATUS=3\n")
    assert (o.verdict, o.failures, o.summary) == ("FAIL", ["ss: single step"], "1 tests, 1 unexpected failures")

    o = kut.parse_output("SKIP: no PMU\nSUMMARY: 1 tests, 1 skipped\nEXIT: STATUS=77\n")
    assert o.verdict == "SKIP"
    # Exit 0 after nothing but a skip (arm/pl031.c without a device) is no pass.
    assert kut.parse_output("SKIP: No device present.\n\nEXIT: STATUS=1\n").verdict == "SKIP"

    # A FAIL line fails the run whatever the status says; so does XPASS.
    assert kut.parse_output("FAIL: x\nEXIT: STATUS=1\n").verdict == "FAIL"
    assert kut.parse_output("XPASS: x\nEXIT: STATUS=1\n").verdict == "FAIL"
    assert kut.parse_output("XFAIL: x\nSUMMARY: 1 tests, 1 expected failures\nEXIT: STATUS=1\n").verdict == "PASS"
    # Any other status fails (an abort exits 1: STATUS=3; a crash, 127...).
    assert kut.parse_output("ABORT: boom\nEXIT: STATUS=3\n").verdict == "FAIL"
    assert kut.parse_output("EXIT: STATUS=255\n").summary == "EXIT: STATUS=255"


def test_output_without_an_exit_line_fails_with_the_reason():
    o = kut.parse_output("PASS: a\nINFO: waiting for interrupt...\n", "timed out after 60 s")
    assert (o.verdict, o.problem, o.exit_status) == ("FAIL", "timed out after 60 s", None)
    assert o.summary.startswith("timed out after 60 s")
    o = kut.parse_output("SUMMARY: 2 tests\n")
    assert (o.verdict, o.problem) == ("FAIL", "no EXIT line")


def test_timing_only_failures_are_told_apart():
    timing = kut.parse_output("FAIL: vtimer-busy-loop: latency within 10 ms\nEXIT: STATUS=3\n")
    assert timing.timing_only
    both = kut.parse_output(
        "FAIL: vtimer-busy-loop: latency within 10 ms\nFAIL: vtimer-busy-loop: interrupt received\nEXIT: STATUS=3\n"
    )
    assert not both.timing_only
    assert not kut.parse_output(PASSED).timing_only
    assert not kut.parse_output("", "timed out").timing_only


def test_timing_retries_rerun_only_timing_failures():
    runs = iter(["FAIL: t: latency within 10 ms\nEXIT: STATUS=3\n", PASSED])
    out = kut.with_timing_retries(lambda: kut.parse_output(next(runs)))
    assert (out.verdict, out.retries) == ("PASS", 1)
    calls = []

    def always_late():
        calls.append(1)
        return kut.parse_output("FAIL: t: latency within 10 ms\nEXIT: STATUS=3\n")

    out = kut.with_timing_retries(always_late)
    assert (out.verdict, out.retries, len(calls)) == ("FAIL", kut.TIMING_RETRIES, kut.TIMING_RETRIES + 1)
    calls.clear()

    def real_failure():
        calls.append(1)
        return kut.parse_output("FAIL: ss: single step\nEXIT: STATUS=3\n")

    assert kut.with_timing_retries(real_failure).retries == 0 and len(calls) == 1


def test_wrap_flat_is_an_image_boot_accepts():
    flat = bytes(range(256)) * 300  # 76800 bytes
    img = kut.wrap_flat(flat)
    code0, code1, text_offset, image_size, flags = struct.unpack_from("<IIQQQ", img, 0)
    assert struct.unpack_from("<I", img, 0x38)[0] == 0x644D5241, "ARM\\x64"
    assert code0 == 0x14000000 | (kut.FLAT_PAD // 4), "b over the pad"
    assert (code1, flags) == (0, 0)
    # The flat lands at RAM + 0x80000, where QEMU puts a raw -kernel (64 KiB aligned).
    assert text_offset + kut.FLAT_PAD == 0x80000
    assert img[kut.FLAT_PAD :] == flat and len(img) == kut.FLAT_PAD + len(flat)
    assert image_size >= kut.FLAT_PAD + len(flat) + 0x10000, "room for BSS and the boot stack"
    assert image_size % 0x10000 == 0


def test_the_record_matches_this_suite_and_gates():
    rec = kut.load_record()
    outcomes = kut.record_outcomes(rec, kut.DEFAULT_MAX_SMP)
    entries = {e.name for e in kut.load_entries()}
    assert set(outcomes) == entries, "re-record: " + kut.RECORD_COMMAND
    assert all(o.verdict in kut.VERDICTS for o in outcomes.values())
    # QEMU passes every gating entry at this commit.
    assert [g for g in kut.GATING if outcomes[g].verdict != "PASS"] == []
    with pytest.raises(ValueError, match="record-qemu"):
        kut.record_outcomes(rec, kut.DEFAULT_MAX_SMP + 1)
    with pytest.raises(ValueError):
        kut.record_outcomes(dict(rec, suite_commit="0" * 40), kut.DEFAULT_MAX_SMP)


def test_gate_and_table():
    e = {x.name: x for x in kut.load_entries()}
    ok, bad = Outcome(verdict="PASS", summary="3 tests"), Outcome(verdict="FAIL", summary="boom")
    rows = [
        Row(e["gicv3-ipi"], bad, ok),
        Row(e["gicv2-ipi"], Outcome(verdict="n/a"), ok),
        Row(e["pmu-event-introspection"], Outcome(verdict="SKIP"), bad),
        Row(e["timer"], ok, bad),
    ]
    assert [r.gate_failed for r in rows] == [True, False, False, False]
    t = kut.table(rows, "emu").splitlines()
    assert [c.strip() for c in t[0].split("|")[1:5]] == ["entry", "Ignition (emu)", "QEMU", "summary"]
    assert "gicv3-ipi *" in t[2] and "gicv2-ipi *" not in t[3]
    assert kut.counts(rows, "qemu") == {"PASS": 2, "FAIL": 2}
    assert kut.counts(rows, "ignition") == {"FAIL": 1, "n/a": 1, "SKIP": 1, "PASS": 1}


def test_main_gates_on_the_record(tmp_path, monkeypatch):
    """main() with the VM runs replaced: exit 1 when a gating entry QEMU passes fails."""
    boot = tmp_path / "boot"
    boot.write_text("")
    verdict = {"timer": "FAIL"}

    def fake_run(entry, *a, **k):
        return Outcome(verdict=verdict.get(entry.name, "PASS"), summary="fake")

    monkeypatch.setattr(kut, "run_ignition", fake_run)
    out = tmp_path / "r.json"
    args = ["--entries", "timer,cache,micro-bench", "--boot", str(boot), "--json", str(out)]
    assert kut.main(args) == 1
    j = json.loads(out.read_text())
    assert j["gate_failures"] == ["timer"] and j["entries"]["micro-bench"]["gating"] is False
    verdict.clear()
    assert kut.main(args) == 0
    with pytest.raises(SystemExit):
        kut.main(["--entries", "no-such-test", "--boot", str(boot)])
