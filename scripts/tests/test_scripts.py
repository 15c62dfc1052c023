"""scripts/test.sh and scripts/mac-check.sh on a simulated Mac: fake uname, sw_vers,
sysctl, cargo, codesign and pytest on PATH record what the scripts run, in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ignition.paths import SCRIPTS

FAKE_PYTEST = """#!/bin/sh
if [ "$1" = -m ] && [ "$2" = pip ]; then
    echo "pip $*" >> "$CALLS"
    exit 0
fi
if [ "$1" = -m ] && [ "$2" = pytest ]; then
    echo "pytest $*" >> "$CALLS"
    xml=; gic=; prev=
    for a in "$@"; do
        case "$a" in --junitxml=*) xml=${a#--junitxml=} ;; esac
        [ "$prev" = --gic ] && gic=$a
        prev=$a
    done
    [ -n "$xml" ] || exit 0
    # The in-kernel GIC fails one boot test and skips one snapshot test.
    fail=; skip=; rc=0
    if [ "$gic" = hvf ]; then
        fail='<failure message="x"/>'; skip='<skipped message="y"/>'; rc=1
    fi
    cat > "$xml" <<XML
<?xml version="1.0"?><testsuites><testsuite name="pytest">
<testcase classname="scripts.tests.test_boot_e2e" name="a"/>
<testcase classname="scripts.tests.test_boot_e2e" name="b">$fail</testcase>
<testcase classname="scripts.tests.test_snapshot_e2e" name="c">$skip</testcase>
<testcase classname="scripts.tests.test_snapshot_e2e" name="d"/>
<testcase classname="scripts.tests.test_crash_consistency" name="e"/>
</testsuite></testsuites>
XML
    exit $rc
fi
exec PYTHON "$@"
"""


def fake_mac(tmp_path: Path, macos: str = "15.1") -> dict[str, str]:
    """A PATH whose uname says Darwin arm64 and whose build, sign and pytest tools only record
    their arguments in $CALLS; returns the environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tools = {
        "uname": 'case "$1" in -m) echo arm64 ;; *) echo Darwin ;; esac\n',
        "sw_vers": f'case "$1" in -productVersion) echo {macos} ;; *) echo 24B83 ;; esac\n',
        "sysctl": "echo Apple M2\n",
        "cargo": 'echo "cargo $*" >> "$CALLS"\n',
        "codesign": 'echo "codesign $*" >> "$CALLS"\n',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / "python3").write_text(FAKE_PYTEST.replace("PYTHON", sys.executable))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    calls = tmp_path / "calls"
    calls.write_text("")
    return dict(
        os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", CALLS=str(calls), MAC_CHECK_OUT=str(tmp_path / "out")
    )


def calls(env) -> list[str]:
    return Path(env["CALLS"]).read_text().splitlines()


def run(script: str, env=None, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPTS / script), *args], capture_output=True, text=True, timeout=120, env=env, stdin=subprocess.DEVNULL
    )


def test_test_sh_signs_boot_after_the_last_build_on_macos(tmp_path, boot_bin):
    env = fake_mac(tmp_path)
    r = run("test.sh", env)
    assert r.returncode == 0, r.stdout + r.stderr
    c = calls(env)
    sign = [i for i, line in enumerate(c) if line.startswith("codesign")]
    assert len(sign) == 1 and "target/release/boot" in c[sign[0]], c
    assert all(line.startswith("cargo") for line in c[: sign[0]]) and sign[0] >= 2, c
    assert c[sign[0] + 1 :] == [
        "pip -m pip install -q ./snapshot-store/python",
        "pip -m pip install -q -e ./scripts",
        "pytest -m pytest -q -p no:cacheprovider snapshot-store/python/tests",
        "pytest -m pytest -q scripts/tests",
    ], c


def test_test_sh_passes_its_arguments_to_pytest(tmp_path):
    env = fake_mac(tmp_path)
    (tmp_path / "bin" / "uname").write_text("#!/bin/sh\necho Linux\n")
    r = run("test.sh", env, "-m", "not e2e", "-k", "a b")
    assert r.returncode == 0, r.stdout + r.stderr
    assert calls(env)[-1] == "pytest -m pytest -q scripts/tests -m not e2e -k a b", calls(env)


def test_test_sh_does_not_sign_on_linux(tmp_path):
    env = fake_mac(tmp_path)
    (tmp_path / "bin" / "uname").write_text("#!/bin/sh\necho Linux\n")
    r = run("test.sh", env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [line for line in calls(env) if line.startswith("codesign")]


def test_mac_check_refuses_other_hosts():
    if sys.platform == "darwin":
        pytest.skip("this host is a Mac")
    r = run("mac-check.sh")
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "needs macOS on Apple Silicon" in r.stderr, r.stderr


@pytest.mark.parametrize("macos", ["15.1", "14.6"])
def test_mac_check_builds_signs_runs_both_gics_and_summarizes(tmp_path, guest_out, boot_bin, macos):
    env = fake_mac(tmp_path, macos)
    r = run("mac-check.sh", env, "-x")
    c = calls(env)
    assert c[0] == "pip -m pip install -q -e ./scripts -r scripts/requirements-dev.txt", c
    assert c[1] == "cargo build --release --workspace --bins", c
    assert c[2].startswith("codesign ") and c[2].endswith("target/release/boot"), c
    suites = " ".join(
        f"scripts/tests/{t}.py"
        for t in ("test_boot_e2e", "test_snapshot_e2e", "test_crash_consistency", "test_kvm_unit_tests_e2e")
    )
    out = tmp_path / "out"
    runs = [
        f"pytest -m pytest -q {suites} --backend hvf --gic {g} --junitxml={out}/gic-{g}.xml -x"
        for g in (["userspace", "hvf"] if macos.startswith("15") else ["userspace"])
    ]
    assert c[3:] == runs, c

    summary = (out / "summary.md").read_text()
    assert summary.strip() in r.stdout, "the summary is printed too"
    assert f"macOS {macos} (24B83), Apple M2" in summary
    assert "| test_boot_e2e | userspace | 2 | 0 | 0 | 0 |" in summary
    assert "| test_snapshot_e2e | userspace | 2 | 0 | 0 | 0 |" in summary
    assert "| test_crash_consistency | userspace | 1 | 0 | 0 | 0 |" in summary
    if macos.startswith("15"):
        assert r.returncode == 1, "a failed suite fails the check"
        assert "| test_boot_e2e ✗ | hvf (in-kernel) | 1 | 1 | 0 | 0 |" in summary
        assert "| test_snapshot_e2e | hvf (in-kernel) | 1 | 0 | 0 | 1 |" in summary
    else:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "| all | hvf (in-kernel) | not run: needs macOS 15 | | | |" in summary
