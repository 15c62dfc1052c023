"""`boot --control PATH`: every command of the control socket, through a real VM, and the
inputs it must refuse without disturbing the VM."""

from __future__ import annotations

import shutil
import socket
import stat
import subprocess
import threading
import time

import pytest

from ignition import loglines
from ignition import store as vmstore
from ignition.control import ControlError
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 256


@pytest.fixture
def vm_and_socket(tmp_path, guest_out, cfg):
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    vm = Vm.boot(
        cfg,
        disk=disk,
        mem=MEM,
        store=tmp_path / "store",
        track_dirty=True,
        name="c",
        log_path=tmp_path / "c.log",
        agent=True,
    )
    try:
        vm.wait_ready()
        assert vm.control_path is not None
        yield vm, vm.control_path
    finally:
        vm.terminate()


def test_commands(vm_and_socket, tmp_path, cfg):
    vm, path = vm_and_socket
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with vm.control(path) as c:
        st = c.status()
        assert st["state"] == "running" and st["vcpus"] == 1 and st["parent"] is None
        assert st["restored_from"] is None and st["snapshot_in_progress"] is False

        first = c.snapshot()
        assert (first["name"], first["kind"]) == ("c", "full")
        # With tracking from boot, a full layer holds the pages ever written.
        assert 0 < first["pages"] < MEM * 1024 // 16
        assert c.status()["parent"] == "c"

        vm.run("echo 12345 > /dev/shm/marker")
        assert c.status()["dirty_pages"] > 0
        second = c.snapshot("c-two")
        assert (second["name"], second["kind"]) == ("c-two", "diff")
        assert 0 < second["pages"] < first["pages"]

        c.pause()
        assert c.status()["state"] == "paused"
        with pytest.raises(ControlError) as e:
            c.pause()
        assert e.value.code == "refused"
        # A snapshot of a paused VM leaves it paused.
        third = c.snapshot("c-paused")
        assert third["kind"] == "diff" and third["pause_us"] == 0
        assert c.status()["state"] == "paused"
        c.resume()
        with pytest.raises(ControlError) as e:
            c.resume()
        assert e.value.code == "refused"
        assert vm.run("cat /dev/shm/marker") == "12345"

        with pytest.raises(ControlError) as e:
            c.snapshot("c")
        assert e.value.code == "snapshot_failed" and "exists" in e.value.message
        c.quit()
    assert vm.wait_exit() == 0

    with Vm.restore(cfg, "c-two", store=tmp_path / "store", log_path=tmp_path / "r.log", agent=True) as r:
        with r.control() as c:
            assert c.status()["restored_from"] == "c-two"
        assert r.run("cat /dev/shm/marker") == "12345"
        assert r.quit() == 0


def test_exec_runs_a_command_through_the_agent(vm_and_socket):
    """`exec`: exit codes, a signal, binary stdin and stdout, stderr, the timeout; the agent's
    errors and a bad request are answered, and the connection serves on."""
    vm, path = vm_and_socket
    data = bytes(range(256)) * 64
    with vm.control(path) as c:
        r = c.exec(["sh", "-c", "cat; echo oops >&2; exit 3"], stdin=data)
        assert (r["exit_code"], r["signal"], r["timed_out"]) == (3, None, False)
        assert (r["stdout"], r["stderr"]) == (data, b"oops\n")
        r = c.exec(["sh", "-c", "kill -TERM $$"])
        assert (r["exit_code"], r["signal"]) == (None, 15)
        r = c.exec(["sleep", "100"], timeout_ms=500)
        assert (r["exit_code"], r["signal"], r["timed_out"]) == (None, 9, True)
        with pytest.raises(ControlError) as e:
            c.exec(["no-such-command"])
        assert e.value.code == "exec_failed" and "error 2" in e.value.message, e.value
        # Output over 1 MiB is refused, not buffered.
        with pytest.raises(ControlError) as e:
            c.exec(["head", "-c", str((1 << 20) + 1), "/dev/zero"])
        assert e.value.code == "exec_failed" and "exceeds" in e.value.message, e.value
        reply = c.raw(b'{"command": "exec", "argv": ["true"], "stdin": "not base64!"}')
        assert not reply["ok"] and reply["error"]["code"] == "bad_request", reply
        assert c.exec(["echo", "still"])["stdout"] == b"still\n"


def test_quit_during_an_exec_answers_it(vm_and_socket):
    """A `quit` while another connection's `exec` waits for a command with an hour's timeout:
    the exec is answered (the VM has ended) and boot exits."""
    vm, path = vm_and_socket
    answers: list[dict] = []
    with vm.control(path) as c, vm.control(path) as other:
        running = threading.Thread(
            target=lambda: answers.append(
                c.raw(b'{"command": "exec", "argv": ["sleep", "100000"], "timeout_ms": 3600000}')
            )
        )
        running.start()
        # The command runs in the guest before the quit.
        deadline = time.monotonic() + 120
        while "sleep 100000" not in vm.run("ps -o args"):
            assert time.monotonic() < deadline, "the exec never started"
            time.sleep(0.1)
        other.quit()
        running.join(timeout=300)
        assert not running.is_alive()
    assert vm.wait_exit() == 0
    assert answers and not answers[0]["ok"], answers
    assert answers[0]["error"]["code"] == "exec_failed" and "ended" in answers[0]["error"]["message"], answers


def test_bad_requests_change_nothing(vm_and_socket):
    vm, path = vm_and_socket
    with vm.control(path) as c, vm.control(path) as other:
        cases = [
            (b"{", "bad_request"),
            (b"[1, 2]", "bad_request"),
            (b'{"command": 5}', "bad_request"),
            (b'{"command": "pause", "force": true}', "bad_request"),
            (b'{"command": "snapshot", "name": 7}', "bad_request"),
            (b'{"command": "reboot"}', "unknown_command"),
            # A key given twice: not the last one winning (this would quit).
            (b'{"command": "status", "command": "quit"}', "bad_request"),
            (b'{"command": "snapshot", "name": "a", "name": "b"}', "bad_request"),
            (b'{"command": "snapshot", "name": "' + b"x" * 70000 + b'"}', "too_large"),
        ]
        for line, code in cases:
            reply = c.raw(line)
            assert not reply["ok"] and reply["error"]["code"] == code, (line[:40], reply)
            # Another client is served meanwhile, and the VM runs.
            assert other.status()["state"] == "running"
        # A client that goes away mid-request.
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(path))
        s.sendall(b'{"command": "pau')
        s.close()
        assert c.status()["state"] == "running"
        assert c.status()["parent"] is None, "nothing was snapshotted"
    assert vm.run("echo alive") == "alive"


def test_clients_are_capped_and_a_stalled_line_times_out(vm_and_socket):
    """64 clients at once are served; the next gets one `too_many_clients` line and is closed;
    a client that stops in the middle of a line gets `timeout` and is closed, an idle one stays."""
    vm, path = vm_and_socket
    held = [vm.control(path) for _ in range(64)]
    try:
        for c in held:
            assert c.status()["state"] == "running"
        extra = socket.socket(socket.AF_UNIX)
        extra.settimeout(30)
        extra.connect(str(path))
        refused = extra.makefile("rb").read()
        extra.close()
        assert refused.count(b"\n") == 1 and b'"too_many_clients"' in refused, refused
        held.pop().close()
        deadline = time.monotonic() + 60
        while True:
            # The closed client's seat is given back once its thread sees the close.
            try:
                with vm.control(path) as c:
                    assert c.status()["state"] == "running"
                    break
            except ControlError as e:
                assert e.code == "too_many_clients", e
                assert time.monotonic() < deadline, "no seat came free"
                time.sleep(0.05)
    finally:
        for c in held:
            c.close()
    with vm.control(path) as idle:
        stalled = socket.socket(socket.AF_UNIX)
        stalled.settimeout(60)
        stalled.connect(str(path))
        stalled.sendall(b'{"command": "qu')
        reply = stalled.makefile("rb").read()
        stalled.close()
        assert b'"timeout"' in reply, reply
        # The idle connection was never timed out.
        assert idle.status()["state"] == "running"
    assert vm.run("echo alive") == "alive"


def test_the_socket_path_is_checked(vm_and_socket, tmp_path, cfg, guest_out):
    vm, path = vm_and_socket
    disk = tmp_path / "other.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    # A live socket is not taken over; a file that is not a socket is not removed.
    plain = tmp_path / "plain"
    plain.write_text("keep")
    for target, why in ((path, "in use"), (plain, "not a socket")):
        r = subprocess.run(
            cfg.argv("--kernel", str(cfg.kernel), "--disk", str(disk), "--control", str(target)),
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode != 0 and why in r.stderr, r.stderr
    assert plain.read_text() == "keep"
    with vm.control(path) as c:
        assert c.status()["state"] == "running"


def test_vm_snapshot_over_the_control_socket(tmp_path, cfg, disk):
    """The harness's Vm.snapshot(name) goes through the socket of a VM started with control=True."""
    store = tmp_path / "store"
    with Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="h", agent=True, log_path=tmp_path / "h.log"
    ) as vm:
        vm.wait_ready()
        vm.run("echo via-control > /root/m && sync")
        first = vm.snapshot("h")
        assert (first.name, first.kind) == ("h", "full") and first.pages > 0
        second = vm.snapshot("h-two")
        assert (second.name, second.kind) == ("h-two", "diff")
        assert vm.quit() == 0
    with Vm.restore(cfg, "h+1", store=store, log_path=tmp_path / "r.log", agent=True) as vm:
        assert vm.restored is not None and vm.restored.restore_ms >= 0
        assert vm.run("cat /root/m") == "via-control"
        assert vm.quit() == 0


def quit_during_a_socket_snapshot(tmp_path, cfg, disk, monkeypatch, gate_env: str, quit_and_open) -> None:
    """A `quit` on one connection while another's `snapshot` is held at the test hook gate
    `gate_env` names: `quit_and_open(vm, other_connection, gate)` quits and opens the gate.
    The layer is committed and its client answered before `boot` exits, and `status` is not
    held back meanwhile."""
    gate = tmp_path / "gate"
    monkeypatch.setenv(gate_env, str(gate))
    store = tmp_path / "store"
    vm = Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="q", log_path=tmp_path / "q.log", agent=True
    )
    path = vm.control_path
    try:
        vm.wait_ready()
        answers: list[dict] = []
        with vm.control(path) as c, vm.control(path) as other:
            writer = threading.Thread(target=lambda: answers.append(c.raw(b'{"command": "snapshot"}')))
            writer.start()
            deadline = time.monotonic() + 120
            while not other.status()["snapshot_in_progress"]:
                assert time.monotonic() < deadline, "the snapshot never started"
                time.sleep(0.05)
            quit_and_open(vm, other, gate)
            writer.join(timeout=300)
            assert not writer.is_alive()
        assert vm.wait_exit() == 0
    finally:
        vm.terminate()
    assert answers and answers[0]["ok"], answers
    assert (answers[0]["result"]["name"], answers[0]["result"]["kind"]) == ("q", "full")
    r = vmstore.vmstore(store, "verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [p for p in store.iterdir() if p.name.startswith(".tmp-")]


def test_quit_during_a_socket_snapshot_loses_nothing(tmp_path, cfg, disk, monkeypatch):
    """The quit lands mid-write (the layer's writer is held at the test hook's gate)."""

    def quit_and_open(vm, other, gate):
        other.quit()
        gate.write_text("")

    quit_during_a_socket_snapshot(tmp_path, cfg, disk, monkeypatch, "IGNITION_TEST_SNAPSHOT_GATE", quit_and_open)


def test_quit_before_a_started_snapshots_pause_waits_for_it(tmp_path, cfg, disk, monkeypatch):
    """The quit lands after the snapshot has started but before it has paused the VM (held at
    the test hook's pause gate, its layer's work directory made): it waits for that pause, and
    the snapshot is never refused because the VM is shutting down."""

    def quit_and_open(vm, other, gate):
        quitter = threading.Thread(target=other.quit)
        quitter.start()
        vm.expect(loglines.SNAPSHOT_QUIT_WAITS, "the quit waiting for the snapshot's pause")
        gate.write_text("")
        quitter.join(timeout=300)
        assert not quitter.is_alive()

    quit_during_a_socket_snapshot(tmp_path, cfg, disk, monkeypatch, "IGNITION_TEST_SNAPSHOT_PAUSE_GATE", quit_and_open)
