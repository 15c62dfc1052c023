"""The architectural conformance suite (guest/conformance/, book/src/conformance.md).

Every group must pass on QEMU TCG, the reference: a failure there is a bug in the test image.
On Ignition each group is one case. A group that fails on the emu backend today lists its
failing checks in EMU_KNOWN_GAPS and is a strict xfail: it stays green while exactly those
checks fail, fails when another check breaks (a regression), and fails when a listed check
starts passing (shrink the list, or drop the group from it once it passes whole). Waits inside
the images are bounded (5 s of guest time, only to detect a lost interrupt); nothing depends
on the host's speed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ignition import conformance, paths, qemu, timeouts
from ignition.conformance import GROUPS, Result

EMU_KNOWN_GAPS: dict[str, tuple[set[str], str]] = {}
"""group -> (the checks that fail on emu today, the xfail reason naming what is missing)."""


class KnownGap(AssertionError):
    """Exactly the checks EMU_KNOWN_GAPS lists failed: the strict xfail's expected failure."""


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """The images: built from guest/conformance/ when the cross compiler is here, else the
    guest build's copy in guest/out/conformance; skips if neither (like an unbuilt guest)."""
    if conformance.cross_compiler():
        out = tmp_path_factory.mktemp("conformance")
        conformance.build(out)
        return out
    prebuilt = paths.GUEST_OUT / "conformance"
    if all(p.is_file() for p in conformance.images(prebuilt).values()):
        return prebuilt
    pytest.skip(f"no aarch64-linux-gnu-gcc and no images in {prebuilt}; run guest/build.sh")


@pytest.fixture(scope="module")
def qemu_results(images) -> dict[str, Result]:
    """Every group once on QEMU TCG. A missing QEMU fails rather than skips."""
    if shutil.which(qemu.QEMU) is None:
        pytest.fail(f"{qemu.QEMU} not installed (Debian package qemu-system-arm)")
    return {g: conformance.run_qemu(g, images) for g in GROUPS}


@pytest.mark.e2e
@pytest.mark.qemu
@pytest.mark.parametrize("group", list(GROUPS))
def test_qemu_reference(group, qemu_results):
    r = qemu_results[group]
    assert r.status == "pass", r.explain()


@pytest.mark.e2e
@pytest.mark.qemu
def test_qemu_enters_at_el1_with_psci_over_hvc(qemu_results):
    # What the images assume of both machines: EL1 entry, PSCI through HVC as the DTB says.
    for r in qemu_results.values():
        assert "EL1," in r.header and "PSCI conduit hvc (DTB method hvc)" in r.header, r.header


def run_cases():
    """(group, across a snapshot?): every group straight through; the paused ones also
    snapshotted at their pause point and restored."""
    return [(g, False) for g in GROUPS] + [(g, True) for g, grp in GROUPS.items() if grp.paused]


@pytest.mark.e2e
@pytest.mark.parametrize(
    "group,across_snapshot", run_cases(), ids=[f"{g}{'+snapshot' if s else ''}" for g, s in run_cases()]
)
def test_ignition(group, across_snapshot, images, boot_bin, backend, gic, request):
    on_emu = (backend or timeouts.default_backend()) == "emu"
    known, reason = EMU_KNOWN_GAPS.get(group, (set(), "")) if on_emu else (set(), "")
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=KnownGap, reason=reason))
    run = conformance.run_ignition_across_snapshot if across_snapshot else conformance.run_ignition
    r = run(group, images, boot_bin, backend, gic)
    # A lost wake-up fails the case even in a latency run, which is no check.
    assert not r.lost, "lost wake-ups (interrupts never taken within 5 s):\n" + r.explain()
    if r.status == "pass":
        return
    failed = set(r.failures)
    if known and failed == known and r.problem is None:
        raise KnownGap(r.explain())
    if known and failed < known:
        raise AssertionError(
            f"{', '.join(sorted(known - failed))} now pass: remove them from EMU_KNOWN_GAPS\n" + r.explain()
        )
    raise AssertionError(r.explain())


def test_images_are_arm64_images(images):
    # Documentation/arch/arm64/booting.rst: branch, text_offset 0x80000, image_size covering the
    # BSS, flags 0 (little-endian, page size unspecified), magic "ARM\x64".
    for g, path in conformance.images(images).items():
        data = path.read_bytes()
        header = {
            k: int.from_bytes(data[o : o + n], "little")
            for k, o, n in (("code0", 0, 4), ("text_offset", 8, 8), ("image_size", 16, 8), ("flags", 24, 8))
        }
        assert header["code0"] >> 26 == 0b000101, f"{g}: code0 is not a B instruction"
        assert header["text_offset"] == 0x80000, g
        assert header["image_size"] >= len(data), g
        assert header["flags"] == 0, g
        assert data[0x38:0x3C] == b"ARM\x64", g


def test_build_is_reproducible(images, tmp_path):
    if not conformance.cross_compiler():
        pytest.skip("no aarch64-linux-gnu-gcc")
    again = conformance.build(tmp_path)
    for g, path in conformance.images(images).items():
        assert again[g].read_bytes() == path.read_bytes(), f"{g}.Image differs between two builds"


CONSOLE = """\
# conformance group demo: EL1, MMU on (4K identity map), PSCI conduit hvc (DTB method hvc), CNTFRQ 1000000 Hz
# check a
PASS a
# check b
FAIL b: first
#   also: second
ID ID_AA64PFR0_EL1 0x0000000001002222
LAT irq hz=1000000 ticks=1,2,3,100
RESULT pass=1 fail=1
"""


def test_parse_console():
    r = conformance.parse(Result("demo", "qemu", exit_code=0), CONSOLE)
    assert r.status == "fail" and r.problem is None
    assert r.checks == {"a": None, "b": "first; second"}
    assert r.ids == {"ID_AA64PFR0_EL1": 0x1002222}
    assert r.latency["irq"]["n"] == 4 and r.latency["irq"]["median_ns"] == 2500
    assert r.latency["irq"]["p99_ns"] == 100_000 and r.header.startswith("conformance group demo: EL1")
    passing = CONSOLE.replace("FAIL b: first\n#   also: second\n", "PASS b\n").replace("fail=1", "fail=0")
    assert passing.count("PASS") == 2
    assert conformance.parse(Result("demo", "qemu", exit_code=0), passing.replace("pass=1", "pass=2")).status == "pass"


def test_parse_reports_lost_wake_ups():
    # A latency run's lost sample is no check failure, yet it is reported.
    console = "PASS a\nLOST sgi-cross-cpu intid=5 cpu=1\nLAT sgi-cross-cpu hz=10 ticks=1\nRESULT pass=1 fail=0\n"
    r = conformance.parse(Result("demo", "hvf", exit_code=0), console)
    assert r.status == "pass" and r.lost == ["sgi-cross-cpu intid=5 cpu=1"]
    assert r.summary() == "pass 1/1; LOST 1: sgi-cross-cpu intid=5 cpu=1"
    assert r.as_json()["lost"] == r.lost and "LOST sgi-cross-cpu" in r.explain()


def test_parse_names_the_check_a_run_died_in():
    # Killed (hang) or exited without RESULT: the check that had started fails with the reason.
    hung = conformance.parse(
        Result("demo", "emu", problem="killed after 60 s (hang)"), "# check a\nPASS a\n# check b\n"
    )
    assert hung.status == "fail" and hung.checks == {"a": None, "b": "killed after 60 s (hang)"}
    crashed = conformance.parse(Result("demo", "emu", exit_code=1), "# check a\n")
    assert crashed.status == "fail" and crashed.checks == {"a": "no RESULT line (exit status 1)"}
    # A RESULT that disagrees with the lines, or a non-zero exit after it, is not a pass.
    assert conformance.parse(Result("d", "emu", exit_code=0), "PASS a\nRESULT pass=2 fail=0\n").status == "fail"
    assert conformance.parse(Result("d", "emu", exit_code=3), "PASS a\nRESULT pass=1 fail=0\n").status == "fail"
    assert conformance.parse(Result("d", "emu", exit_code=0), "PASS a\nRESULT pass=1 fail=0\n").status == "pass"
