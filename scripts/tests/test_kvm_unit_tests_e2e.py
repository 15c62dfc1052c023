"""kvm-unit-tests on `boot`: every gating entry (ignition.kvm_unit_tests.GATING) that QEMU
passes in the recorded verdicts (third_party/kvm-unit-tests/qemu-verdicts.json) must pass on
Ignition, the migration entries across a snapshot and restore. One case per entry; a failure
shows the test's report lines and the console's tail. Per-entry timeouts are the package's
policy (timeouts.py), and the suite's one timing check (the timer's 10 ms latency) is retried,
so a slow, loaded machine does not fail a correct run."""

from __future__ import annotations

import pytest

from ignition import kvm_unit_tests as kut


@pytest.fixture(scope="module")
def qemu_verdicts() -> dict[str, kut.Outcome]:
    return kut.record_outcomes(kut.load_record(), kut.DEFAULT_MAX_SMP)


@pytest.fixture(scope="module")
def entries() -> dict[str, kut.Entry]:
    return {e.name: e for e in kut.load_entries()}


@pytest.mark.e2e
@pytest.mark.parametrize("name", kut.GATING)
def test_gating_entry_passes_where_qemu_does(name, entries, qemu_verdicts, boot_bin, backend, gic, tmp_path):
    qemu = qemu_verdicts[name]
    if qemu.verdict != "PASS":
        pytest.skip(f"QEMU does not pass {name} ({qemu.verdict}: {qemu.summary}); not gating")
    out = kut.run_ignition(entries[name], boot_bin, tmp_path, backend, gic=gic)
    tail = "\n".join("  | " + t for t in out.console.replace("\r", "").strip().splitlines()[-25:])
    assert out.verdict == "PASS", (
        f"{name}: Ignition {out.verdict} ({out.summary}), QEMU PASS ({qemu.summary})\n"
        f"failed: {out.failures}\nproblem: {out.problem}\nconsole (tail):\n{tail}"
    )
