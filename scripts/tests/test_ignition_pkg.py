"""The ignition package's pure parts (no guest): log-line parsers, the timeout policy, store listing."""

from __future__ import annotations

import re
import socket
import threading

import pytest

from ignition import loglines, store, timeouts
from ignition.control import ControlClient, ControlError
from ignition.vm import VmConfig


def test_disk_clone_lines():
    d = loglines.parse_disk_clone("sparse copy (34 of 256 chunks hashed)")
    assert d == loglines.DiskClone("sparse copy", 34, 256, False, 0)
    d = loglines.parse_disk_clone("sparse copy (40 of 256 chunks hashed: 3 copied before a guest write)")
    assert d == loglines.DiskClone("sparse copy", 40, 256, False, 3)
    d = loglines.parse_disk_clone("disk diff (0 of 256 chunks hashed: unchanged since the parent, its digests reused)")
    assert d == loglines.DiskClone("disk diff", 0, 256, True, 0)
    d = loglines.parse_disk_clone("disk diff (3 of 256 chunks hashed: 1 copied before a guest write)")
    assert d == loglines.DiskClone("disk diff", 3, 256, False, 1)
    for bad in ("sparse copy", "copy (x of 2 chunks hashed)", "a (b) (1 of 2 chunks hashed)"):
        with pytest.raises(ValueError):
            loglines.parse_disk_clone(bad)


def test_restore_lines():
    line = (
        "Restore-stages: total 3944 us, resolve 181 us, verify wait 156 us (verify 99 us), map base 20 us, "
        "overlay 1 us, state 182 us, VM create 21 us, GIC 1 us, devices 16 us, vCPUs 3279 us\r\n"
    )
    m = re.search(loglines.RESTORE_STAGES, line)
    assert m
    st = loglines.parse_restore_stages(m.group(1))
    assert st.total_us == 3944
    assert list(st.stages_us) == [
        "resolve",
        "verify wait",
        "map base",
        "overlay",
        "state",
        "VM create",
        "GIC",
        "devices",
        "vCPUs",
    ]
    assert st.stages_us["verify wait"] == 156 and st.parallel_us == {"verify": 99}
    with pytest.raises(ValueError, match="lacks the total"):
        loglines.parse_restore_stages("resolve 1 us, vCPUs 2 us")
    with pytest.raises(ValueError, match="cannot parse"):
        loglines.parse_restore_stages("total 1 us, resolve soon")
    m = re.search(loglines.RESTORE_DISK, "Restore-disk = 85 us (overlay on 3 layers)")
    assert m and m.groups() == ("85", "3")
    m = re.search(loglines.RESTORE_DISK, "Restore-disk = 40 us (overlay on 1 layer)")
    assert m and m.groups() == ("40", "1")


def test_snapshot_lines():
    m = re.search(loglines.snapshot_written("d.2"), "[snapshot] diff 'd.2' (685 pages, 10.7 MiB) written")
    assert m and m.groups() == ("diff", "685", "10.7")
    assert not re.search(loglines.snapshot_written("d.2"), "[snapshot] diff 'dx2' (685 pages, 10.7 MiB) written")
    assert re.search(loglines.snapshot_failed("x"), "[snapshot] 'x' failed, nothing was written: exists")
    assert re.search(loglines.SNAPSHOT_FAILED, "[snapshot] refused: no snapshot name (start boot with --name NAME)")


def test_timeouts_scale_by_backend(monkeypatch):
    monkeypatch.delenv(timeouts.SCALE_ENV, raising=False)
    assert timeouts.for_backend("emu") == timeouts.BASE
    assert timeouts.for_backend("qemu") == timeouts.BASE
    hvf = timeouts.for_backend("hvf")
    assert hvf.boot == timeouts.BASE.boot * timeouts.SCALE["hvf"] < timeouts.BASE.boot
    assert timeouts.for_backend(None) == timeouts.for_backend(timeouts.default_backend())
    monkeypatch.setenv(timeouts.SCALE_ENV, "3")
    assert timeouts.for_backend("emu").cmd == 3 * timeouts.BASE.cmd
    assert VmConfig(backend="hvf").timeouts == timeouts.Timeouts(3 * hvf.boot, 3 * hvf.cmd)
    monkeypatch.setenv(timeouts.SCALE_ENV, "0")
    with pytest.raises(ValueError):
        timeouts.for_backend("emu")
    with pytest.raises(ValueError):
        timeouts.for_backend("kvm")


def test_hang_limits_follow_the_policy(monkeypatch):
    monkeypatch.delenv(timeouts.SCALE_ENV, raising=False)
    assert timeouts.hang_limit("emu") == timeouts.TEST_BOOTS * timeouts.BASE.boot >= 600
    assert timeouts.hang_limit("hvf") == timeouts.SCALE["hvf"] * timeouts.hang_limit("emu")
    monkeypatch.setenv(timeouts.SCALE_ENV, "2")
    assert timeouts.hang_limit("qemu") == 2 * timeouts.TEST_BOOTS * timeouts.BASE.boot


def test_each_test_gets_its_backends_hang_limit(request, backend):
    """conftest.py gives every test without a limit of its own the policy's (pytest-timeout)."""
    (limit,) = request.node.get_closest_marker("timeout").args
    assert limit == timeouts.hang_limit(backend)


def test_vm_config_argv(tmp_path):
    cfg = VmConfig(boot=tmp_path / "boot", backend="hvf", gic="hvf")
    assert cfg.argv("--restore", "a") == [str(tmp_path / "boot"), "--restore", "a", "--backend", "hvf", "--gic", "hvf"]
    assert VmConfig(boot=tmp_path / "boot").argv() == [str(tmp_path / "boot")]


def test_store_listing(tmp_path):
    for d in ("golden", "d1", ".tmp-d2-4242-00ff", ".tmp-run-4242-00ff", ".del-x-1-ab", "-bad"):
        (tmp_path / d).mkdir()
    (tmp_path / "stray").write_text("")
    (tmp_path / "d1" / ".verified.json.tmp-4242-00ff").write_text("")
    assert store.layer_names(tmp_path) == ["d1", "golden"]
    assert store.work_entries(tmp_path) == [
        ".del-x-1-ab",
        ".tmp-d2-4242-00ff",
        ".tmp-run-4242-00ff",
        "d1/.verified.json.tmp-4242-00ff",
    ]


def test_the_package_builds_as_a_wheel(tmp_path):
    """`pip install -e ./scripts` installs this package: its wheel holds every module."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from ignition.paths import SCRIPTS

    # From a copy: setuptools builds in the source tree.
    src = tmp_path / "src"
    shutil.copytree(SCRIPTS / "ignition", src / "ignition", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SCRIPTS / "pyproject.toml", src)
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    (wheel,) = tmp_path.glob("ignition-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(SCRIPTS).as_posix() for p in (SCRIPTS / "ignition").rglob("*.py")}
    assert modules <= names, modules - names


def test_a_refusal_sent_before_the_request_is_read_still_reaches_the_client(tmp_path):
    """The VM answers `too_many_clients` and closes without reading: the client's write then fails
    with EPIPE, yet the refusal is in its receive buffer and must surface as a ControlError."""
    path = tmp_path / "ctl.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.listen(1)

    def refuse() -> None:
        conn, _ = server.accept()
        conn.sendall(b'{"ok": false, "error": {"code": "too_many_clients", "message": "full"}}\n')
        conn.close()

    t = threading.Thread(target=refuse)
    t.start()
    client = ControlClient(path, timeout=10)
    t.join()
    try:
        with pytest.raises(ControlError) as e:
            client.status()
        assert e.value.code == "too_many_clients"
    finally:
        client.close()
        server.close()
