"""End-to-end: our `boot` runs the real guest over a pty.

The backend is a parameter: `pytest --backend hvf` runs the same suite on a
Mac (default: the platform default, emu on Linux). The binary is
target/release/boot unless IGNITION_BOOT names another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ignition import console as harness

BOOT_TIMEOUT = 120  # software CPU on a loaded 2-core CI runner
CMD_TIMEOUT = 60


@pytest.fixture
def disk(guest_out, tmp_path) -> Path:
    """A private copy of the root disk, so tests never change guest/out."""
    d = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", d)
    return d


def start(boot_bin, guest_out, disk, backend, tmp_path, *extra, log="console.log"):
    argv = [str(boot_bin), "--kernel", str(guest_out / "Image"), "--disk", str(disk), *extra]
    if backend:
        argv += ["--backend", backend]
    return harness.spawn(argv, log_path=tmp_path / log, timeout=BOOT_TIMEOUT)


def login(child):
    harness.login(child, timeout=BOOT_TIMEOUT)


def poweroff(child) -> int:
    harness.paced_send(child, "poweroff\n")
    return harness.wait_exit(child, CMD_TIMEOUT)


def test_boot_login_uname_poweroff(boot_bin, guest_out, disk, backend, tmp_path):
    child = start(boot_bin, guest_out, disk, backend, tmp_path)
    try:
        harness.expect(child, r"Guest-boot-time = (\d+) ms", BOOT_TIMEOUT, "the Guest-boot-time line")
        assert int(child.match.group(1)) > 0
        login(child)
        assert harness.run(child, "uname -m", CMD_TIMEOUT) == "aarch64"
        assert harness.run(child, "getconf PAGESIZE", CMD_TIMEOUT) == "16384"
        assert harness.run(child, "cat /proc/cmdline", CMD_TIMEOUT).find("root=/dev/vda") >= 0
        assert poweroff(child) == 0, "poweroff in the guest must end boot with status 0"
    finally:
        harness.terminate(child)


def test_root_disk_persists_across_boots(boot_bin, guest_out, disk, backend, tmp_path):
    child = start(boot_bin, guest_out, disk, backend, tmp_path, log="first.log")
    try:
        login(child)
        harness.run(child, "echo persisted-$((6*7)) > /root/marker && sync", CMD_TIMEOUT)
        assert poweroff(child) == 0
    finally:
        harness.terminate(child)
    child = start(boot_bin, guest_out, disk, backend, tmp_path, log="second.log")
    try:
        login(child)
        assert harness.run(child, "cat /root/marker", CMD_TIMEOUT) == "persisted-42"
        assert poweroff(child) == 0
    finally:
        harness.terminate(child)


def cpu_busy_ticks(child) -> dict[str, int]:
    """user+system ticks per CPU from /proc/stat."""
    ticks = {}
    for line in harness.run(child, "grep '^cpu[0-9]' /proc/stat", CMD_TIMEOUT).splitlines():
        name, user, nice, system, *_ = line.split()
        ticks[name] = int(user) + int(nice) + int(system)
    return ticks


def test_two_vcpus_both_run(boot_bin, guest_out, disk, backend, tmp_path):
    child = start(boot_bin, guest_out, disk, backend, tmp_path, "--cpus", "2")
    try:
        login(child)
        assert harness.run(child, "nproc", CMD_TIMEOUT) == "2"
        before = cpu_busy_ticks(child)
        assert set(before) == {"cpu0", "cpu1"}
        # Two busy loops; the scheduler spreads them over both CPUs.
        harness.run(child, "for i in 1 2; do (while :; do :; done) & done", CMD_TIMEOUT)
        time.sleep(3)
        after = cpu_busy_ticks(child)
        harness.run(child, "kill $(jobs -p)", CMD_TIMEOUT)
        for cpu in ("cpu0", "cpu1"):
            assert after[cpu] - before[cpu] >= 50, f"{cpu} did not run the busy loop: {before} -> {after}"
        assert poweroff(child) == 0
    finally:
        harness.terminate(child)


def test_ctrl_a_x_quits_promptly(boot_bin, guest_out, disk, backend, tmp_path):
    child = start(boot_bin, guest_out, disk, backend, tmp_path)
    try:
        login(child)
        child.send("\x01h")
        harness.expect(child, r"Ctrl-A x\s+quit", CMD_TIMEOUT, "the escape help")
        t0 = time.monotonic()
        child.send("\x01x")
        assert harness.wait_exit(child, 10) == 0
        assert time.monotonic() - t0 < 5, "Ctrl-A x should quit within a few seconds"
    finally:
        harness.terminate(child)


def run_boot(boot_bin, *args, timeout=30):
    return subprocess.run([str(boot_bin), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def test_bad_arguments_give_one_clear_line(boot_bin, guest_out, tmp_path):
    r = run_boot(boot_bin, "--kernel", str(tmp_path / "missing"), "--disk", str(guest_out / "rootfs.ext4"))
    assert r.returncode != 0 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    bad = tmp_path / "bad-image"
    bad.write_bytes(b"\0" * 4096)
    r = run_boot(boot_bin, "--kernel", str(bad), "--disk", str(guest_out / "rootfs.ext4"), "--backend", "emu")
    assert r.returncode != 0 and "magic" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    r = run_boot(boot_bin, "--cpus", "99")
    assert r.returncode == 2 and "--cpus" in r.stderr, r.stderr
    r = run_boot(boot_bin, "--backend", "kvm")
    assert r.returncode == 2 and "--backend" in r.stderr, r.stderr

    r = run_boot(boot_bin, "--help")
    assert r.returncode == 0
    for opt in ("--kernel", "--disk", "--mem", "--cpus", "--cmdline", "--backend", "--gic"):
        assert opt in r.stdout, opt


def test_in_kernel_gic_is_refused_on_emu(boot_bin, guest_out, tmp_path):
    """--gic hvf needs the hvf backend: one clear line, before anything starts."""
    for extra in (["--disk", str(guest_out / "rootfs.ext4")],
                  ["--restore", "golden", "--store", str(tmp_path / "store")]):
        r = run_boot(boot_bin, "--gic", "hvf", "--backend", "emu", *extra)
        assert r.returncode != 0, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "in-kernel GIC exists only on the hvf backend" in lines[0], r.stderr
    r = run_boot(boot_bin, "--gic", "vgic")
    assert r.returncode == 2 and "--gic" in r.stderr, r.stderr
    r = run_boot(boot_bin, "--help")
    assert "userspace" in r.stdout and "macOS 15" in r.stdout, r.stdout


def test_console_works_on_a_pipe(boot_bin, guest_out, disk, backend):
    """stdin and stdout are pipes (no terminal): login, a command, poweroff."""
    import subprocess
    import threading

    argv = [str(boot_bin), "--kernel", str(guest_out / "Image"), "--disk", str(disk)]
    if backend:
        argv += ["--backend", backend]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = bytearray()
    seen = threading.Condition()

    def reader():
        for chunk in iter(lambda: p.stdout.read1(4096), b""):
            with seen:
                out.extend(chunk)
                seen.notify_all()

    t = threading.Thread(target=reader, daemon=True)
    t.start()

    def wait_for(token: bytes, timeout: float):
        with seen:
            assert seen.wait_for(lambda: token in out, timeout), f"no {token!r} in: {bytes(out[-500:])!r}"

    def type_slowly(text: str):
        for i in range(0, len(text), 8):
            p.stdin.write(text[i:i + 8].encode())
            p.stdin.flush()
            time.sleep(0.02)

    try:
        wait_for(b"login:", BOOT_TIMEOUT)
        type_slowly("root\n")
        wait_for(b"# ", CMD_TIMEOUT)
        type_slowly("echo piped-$((40+2))\n")
        wait_for(b"piped-42", CMD_TIMEOUT)
        type_slowly("poweroff\n")
        assert p.wait(CMD_TIMEOUT) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_terminal_is_restored_after_sigterm(boot_bin, guest_out, disk, backend, tmp_path):
    """boot puts the tty in raw mode; SIGTERM must leave it canonical again."""
    import signal
    import subprocess

    extra = f" --backend {backend}" if backend else ""
    script = (f'"{boot_bin}" --kernel "{guest_out / "Image"}" --disk "{disk}"{extra}; '
              'echo "status=$?"; stty -a')
    child = harness.spawn(["sh", "-c", script], log_path=tmp_path / "console.log", timeout=BOOT_TIMEOUT)
    try:
        harness.expect(child, harness.LOGIN, BOOT_TIMEOUT, "login:")
        pids = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True, text=True).stdout.split()
        assert len(pids) == 1, pids
        os.kill(int(pids[0]), signal.SIGTERM)
        harness.expect(child, r"status=(\d+)", CMD_TIMEOUT, "boot's exit status")
        assert int(child.match.group(1)) == 128 + signal.SIGTERM
        harness.expect(child, r"(-?)icanon", CMD_TIMEOUT, "stty output")
        assert child.match.group(1) == "", "the terminal was left in raw mode (-icanon)"
        harness.wait_exit(child, CMD_TIMEOUT)
    finally:
        harness.terminate(child)
