"""Headless VMs: `boot --console socket:PATH|file:PATH` and `--daemonize`, end to end.

A socket console (attached with `python3 -m ignition.attach PATH` on a pty): login through
it; a second client is refused while one is attached; Ctrl-A d detaches and the VM runs on;
output written while no one is attached is replayed to the next client; Ctrl-A s writes a
snapshot and its outcome shows on the console; Ctrl-A x quits (boot exits 0, its sockets
gone). A daemonized boot: the parent exits 0 once the VM runs, the pid file names the running
daemon, the log file has its log lines; driven over its control socket (status, snapshot)
and its console, then quit: the daemon exits, its pid file and sockets are removed. A daemon
that cannot start: the parent exits 1 with the error, nothing left behind; --daemonize
without a console of its own: exit 2. A file console: the guest's output appended.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from ignition import attach, console, loglines
from ignition import store as vmstore
from ignition.control import ControlClient
from ignition.vm import CTRL_A, VmConfig

pytestmark = pytest.mark.e2e

MEM = 256


@pytest.fixture
def sockdir() -> Iterator[Path]:
    """A short private directory for sockets (a Unix socket path has at most 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="ign-hl-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def boot_args(cfg: VmConfig, disk: Path, *extra: str) -> list[str]:
    return cfg.argv("--kernel", str(cfg.kernel), "--disk", str(disk), "--mem", str(MEM), *extra)


def wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.05)


def login(c: pexpect.spawn[str], cfg: VmConfig) -> None:
    """Logs in on an attached console (the login prompt may have gone by before attaching)."""
    assert cfg.timeouts is not None
    c.send("\r")
    i = console.expect(c, [console.LOGIN, console.PROMPT], cfg.timeouts.boot, "login: or a prompt")
    if i == 0:
        console.answer_login(c, cfg.timeouts.boot, "root", "")


def test_a_socket_console_attaches_detaches_replays_and_refuses_a_second_client(cfg, disk, tmp_path, sockdir):
    sock = sockdir / "console.sock"
    log = open(tmp_path / "boot.log", "w")  # noqa: SIM115
    assert cfg.timeouts is not None
    store = tmp_path / "store"
    boot = subprocess.Popen(
        boot_args(cfg, disk, "--console", f"socket:{sock}", "--store", str(store), "--name", "s"),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(sock, cfg.timeouts.boot)
        assert sock.stat().st_mode & 0o777 == 0o600
        a = attach.spawn(sock, timeout=cfg.timeouts.cmd, log_path=tmp_path / "a.log")
        console.expect(a, "attached", cfg.timeouts.cmd, "the attach banner")
        login(a, cfg)
        assert console.run(a, "echo $((6 * 7))", cfg.timeouts.cmd) == "42"
        # A second client while one is attached: told so and closed.
        b = attach.spawn(sock, timeout=cfg.timeouts.cmd)
        console.expect(b, r"busy: another client is attached", cfg.timeouts.cmd, "the busy line")
        assert console.wait_exit(b, cfg.timeouts.cmd) == 0
        # Output written while detached: the next client gets it.
        console.paced_send(a, "(sleep 3; echo tick-$((40 + 2))) &\n")
        console.expect(a, console.PROMPT, cfg.timeouts.cmd, "the prompt")
        a.send(CTRL_A + "d")
        console.expect(a, r"\[console\] detached", cfg.timeouts.cmd, "the detach line")
        assert console.wait_exit(a, cfg.timeouts.cmd) == 0
        assert boot.poll() is None, "the VM runs on after a detach"
        time.sleep(4)
        c = attach.spawn(sock, timeout=cfg.timeouts.cmd, log_path=tmp_path / "c.log")
        console.expect(c, "tick-42", cfg.timeouts.cmd, "the output written while detached")
        login(c, cfg)
        # The escapes work through the socket: a snapshot, its outcome on the console.
        c.send(CTRL_A + "s")
        console.expect(c, loglines.snapshot_written("s"), cfg.timeouts.boot, "the [snapshot] line")
        assert vmstore.layer_names(store) == ["s"]
        c.send(CTRL_A + "x")
        assert boot.wait(cfg.timeouts.cmd) == 0
        c.expect(pexpect.EOF, timeout=cfg.timeouts.cmd)
        assert not sock.exists(), "the console socket is removed at exit"
    finally:
        if boot.poll() is None:
            boot.kill()
            boot.wait()
        log.close()


def test_a_daemonized_boot_runs_behind_its_sockets_until_quit(cfg, disk, tmp_path, sockdir):
    assert cfg.timeouts is not None
    sock, ctl, pid_file, log = sockdir / "c.sock", sockdir / "ctl.sock", tmp_path / "boot.pid", tmp_path / "boot.log"
    store = tmp_path / "store"
    args = boot_args(cfg, disk, "--daemonize", "--console", f"socket:{sock}", "--control", str(ctl))
    args += ["--pid-file", str(pid_file), "--log-file", str(log), "--store", str(store), "--name", "d"]
    t = time.monotonic()
    parent = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=cfg.timeouts.boot)
    assert parent.returncode == 0, parent.stderr
    print(f"parent exited after {time.monotonic() - t:.2f} s")
    # Once the parent has exited, the daemon runs and its sockets listen.
    pid = int(pid_file.read_text())
    assert pid != os.getpid()
    try:
        os.kill(pid, 0)
        assert sock.exists() and ctl.exists()
        ctl_client = ControlClient(ctl, cfg.timeouts.boot)
        assert ctl_client.status()["state"] == "running"
        c = attach.spawn(sock, timeout=cfg.timeouts.cmd, log_path=tmp_path / "console.log")
        console.expect(c, "attached", cfg.timeouts.cmd, "the attach banner")
        login(c, cfg)
        console.run(c, "echo daemonized > /root/d.txt && sync", cfg.timeouts.cmd)
        layer = ctl_client.snapshot("d")
        assert layer["name"] == "d" and layer["kind"] == "full"
        ctl_client.quit()
        ctl_client.close()
        c.expect(pexpect.EOF, timeout=cfg.timeouts.cmd)
        deadline = time.monotonic() + cfg.timeouts.cmd
        while _alive(pid):
            assert time.monotonic() < deadline, "the daemon did not exit"
            time.sleep(0.05)
    finally:
        if _alive(pid):
            os.kill(pid, 9)
    assert not pid_file.exists() and not sock.exists() and not ctl.exists()
    text = log.read_text(errors="replace")
    assert "Guest-boot-time" in text and "[snapshot] full 'd'" in text, text
    assert vmstore.layer_names(store) == ["d"]


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie counts as gone: its parent, init, reaps it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_a_daemon_that_cannot_start_fails_its_parent(cfg, tmp_path, sockdir):
    assert cfg.timeouts is not None
    pid_file = tmp_path / "boot.pid"
    (tmp_path / "store").mkdir()
    args = cfg.argv("--restore", "missing", "--store", str(tmp_path / "store"), "--daemonize")
    args += ["--console", f"socket:{sockdir / 'c.sock'}", "--pid-file", str(pid_file)]
    r = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=cfg.timeouts.boot)
    assert r.returncode == 1, r
    assert r.stderr.startswith("boot: ") and "'missing' not found" in r.stderr, r.stderr
    assert not pid_file.exists() and not (sockdir / "c.sock").exists()
    # A daemon has no terminal: a console of its own is needed.
    r = subprocess.run(cfg.argv("--daemonize"), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--daemonize needs --console" in r.stderr, r


def test_a_file_console_gets_the_guest_s_output(cfg, disk, tmp_path, sockdir):
    assert cfg.timeouts is not None
    out, ctl = tmp_path / "console.txt", sockdir / "ctl.sock"
    out.write_text("kept\n")
    boot = subprocess.Popen(
        boot_args(cfg, disk, "--console", f"file:{out}", "--control", str(ctl)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + cfg.timeouts.boot
        while "login:" not in out.read_text(errors="replace"):
            assert time.monotonic() < deadline, "no login prompt in the console file"
            time.sleep(0.1)
        assert out.read_text().startswith("kept\n"), "appended, not overwritten"
        assert out.stat().st_mode & 0o777 == 0o644, "an existing file keeps its mode"
        ControlClient(ctl, cfg.timeouts.boot).quit()
        assert boot.wait(cfg.timeouts.cmd) == 0
    finally:
        if boot.poll() is None:
            boot.kill()
            boot.wait()
