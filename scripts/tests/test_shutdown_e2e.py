"""Every way a VM ends winds it down the same way: a snapshot under way is committed before
`boot` exits, and the files the VM made on the host (the control socket, the vsock socket, a
restored VM's working directory) are removed.

Each pairing of what starts the snapshot (the console's Ctrl-A s, the control socket's
`snapshot`) with what ends the VM (Ctrl-A x, the socket's `quit`, SIGTERM, SIGINT, SIGHUP, the
guest's `poweroff`) runs on a VM restored from one golden layer. The layer's writer is held at
the test hook's gate (IGNITION_TEST_SNAPSHOT_GATE) until the VM has ended and `boot` says it is
finishing the snapshot, so the end always lands mid-write, whatever this machine's speed.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import threading
from pathlib import Path

import pytest

from ignition import loglines
from ignition import store as vmstore
from ignition.vm import CTRL_A, Vm

pytestmark = pytest.mark.e2e

MEM = 256
GATE_ENV = "IGNITION_TEST_SNAPSHOT_GATE"
STARTERS = ["console", "socket"]
ENDERS = ["ctrl-a-x", "quit", "SIGTERM", "SIGINT", "SIGHUP", "poweroff"]


@pytest.fixture(scope="module")
def golden(tmp_path_factory, cfg, guest_out) -> Path:
    """A store holding `golden`, a full layer of a logged-in guest with a vsock device."""
    d = tmp_path_factory.mktemp("golden")
    disk = d / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    store = d / "store"
    with Vm.boot(
        cfg,
        disk=disk,
        mem=MEM,
        store=store,
        track_dirty=True,
        name="golden",
        control=True,
        log_path=d / "g.log",
        extra=["--vsock-uds", str(d / "g.sock")],
    ) as vm:
        vm.login()
        vm.snapshot("golden")
        assert vm.quit() == 0
    return store


def private_store(golden: Path, tmp_path: Path) -> Path:
    store = tmp_path / "store"
    shutil.copytree(golden, store)
    return store


def work_dirs(store: Path) -> list[str]:
    """The store's work directories: layers being written (.tmp-NAME-*) and restored VMs'
    working disks (.tmp-run-*)."""
    return sorted(p.name for p in store.iterdir() if p.name.startswith(".tmp-"))


def restore(cfg, store: Path, tmp_path: Path, vsock: Path) -> Vm:
    return Vm.restore(
        cfg,
        "golden",
        store=store,
        name="p",
        track_dirty=True,
        control=True,
        log_path=tmp_path / "p.log",
        extra=["--vsock-uds", str(vsock)],
    )


def end(vm: Vm, ender: str) -> None:
    """Ends the VM as `ender` does."""
    if ender == "ctrl-a-x":
        vm.send(CTRL_A + "x")
    elif ender == "quit":
        with vm.control() as c:
            c.quit()
    elif ender == "poweroff":
        vm.type("poweroff\n")
    else:
        os.kill(vm.pid, getattr(signal, ender))
        vm.expect(loglines.QUIT_SIGNAL, f"boot's answer to {ender}")
        assert vm.match.group(1) == ender


@pytest.mark.parametrize("ender", ENDERS)
@pytest.mark.parametrize("starter", STARTERS)
def test_a_snapshot_under_way_is_committed_whatever_ends_the_vm(golden, tmp_path, cfg, monkeypatch, starter, ender):
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    store = private_store(golden, tmp_path)
    vsock = tmp_path / "v.sock"
    vm = restore(cfg, store, tmp_path, vsock)
    answers: list[dict] = []
    try:
        control = vm.control_path
        assert control is not None and control.exists() and vsock.exists()
        assert [d for d in work_dirs(store) if d.startswith(".tmp-run-")], "a restored VM has a working directory"
        if starter == "console":
            vm.send(CTRL_A + "s")
            client = None
        else:
            client = threading.Thread(target=lambda: answers.append(vm.control().raw(b'{"command": "snapshot"}')))
            client.start()
        # The guest runs again; the layer's writer waits at the gate.
        vm.expect(loglines.SNAPSHOT_PAUSE_TIME, "the snapshot's pause")
        end(vm, ender)
        vm.expect(loglines.SNAPSHOT_WAIT_AT_EXIT, "boot finishing the snapshot", vm.timeouts.boot)
        assert vm.child.isalive(), "boot exited with the layer's writer held"
        gate.write_text("")
        vm.expect(loglines.snapshot_written("p"), "the layer committed")
        assert vm.wait_exit() == 0
        if client is not None:
            client.join(timeout=vm.timeouts.cmd)
            assert answers and answers[0]["ok"], answers
            assert answers[0]["result"]["name"] == "p"
        # (Before terminate(), which removes the control socket's directory.)
        assert not control.exists(), "the control socket was left"
        assert not vsock.exists(), "the vsock socket was left"
    finally:
        vm.terminate()
    assert not gate.exists(), "the writer passed the gate"
    r = vmstore.vmstore(store, "verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "p" in vmstore.vmstore(store, "list").stdout
    assert work_dirs(store) == [], "a work directory was left"


def test_a_second_signal_ends_boot_at_once(golden, tmp_path, cfg, monkeypatch):
    """SIGTERM, then SIGTERM again while the snapshot is held: boot ends at once with 128+15;
    the layer is not committed and its work directory is left for `vmstore gc`."""
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    store = private_store(golden, tmp_path)
    vsock = tmp_path / "v.sock"
    vm = restore(cfg, store, tmp_path, vsock)
    try:
        vm.send(CTRL_A + "s")
        vm.expect(loglines.SNAPSHOT_PAUSE_TIME, "the snapshot's pause")
        end(vm, "SIGTERM")
        vm.expect(loglines.SNAPSHOT_WAIT_AT_EXIT, "boot finishing the snapshot", vm.timeouts.boot)
        os.kill(vm.pid, signal.SIGTERM)
        vm.expect(r"\[boot\] SIGTERM again: ending at once", "the second signal's line")
        assert vm.wait_exit() == 128 + signal.SIGTERM
    finally:
        vm.terminate()
    assert "p" not in vmstore.vmstore(store, "list").stdout
    left = work_dirs(store)
    assert any(d.startswith(".tmp-p-") for d in left), left
    r = vmstore.vmstore(store, "gc")
    assert r.returncode == 0, r.stdout + r.stderr
    assert work_dirs(store) == []
    r = vmstore.vmstore(store, "verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr


def test_host_sockets_are_owner_only_and_removed(golden, tmp_path, cfg):
    """Under umask 000 the control and vsock sockets are still mode 0600; a plain SIGTERM (no
    snapshot) removes them and the restore's working directory, and exits 0."""
    store = private_store(golden, tmp_path)
    vsock = tmp_path / "v.sock"
    old = os.umask(0)
    try:
        vm = restore(cfg, store, tmp_path, vsock)
    finally:
        os.umask(old)
    try:
        assert vm.control_path is not None
        control = vm.control_path
        for path in (control, vsock):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, (path, oct(path.stat().st_mode))
        end(vm, "SIGTERM")
        assert vm.wait_exit() == 0
        assert not vsock.exists() and not control.exists()
    finally:
        vm.terminate()
    assert work_dirs(store) == []
