"""End-to-end: our `boot` runs the real guest over a pty.

The backend is a parameter: `pytest --backend hvf` runs the same suite on a
Mac (default: the platform default, emu on Linux), and `--gic hvf` with the
in-kernel GIC. The binary is target/release/boot unless IGNITION_BOOT names
another.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import threading
import time

import pytest

from ignition import console
from ignition.guest import cpu_busy_ticks
from ignition.vm import CTRL_A, Vm

pytestmark = pytest.mark.e2e


def test_boot_login_uname_poweroff(cfg, disk, tmp_path):
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "console.log") as vm:
        assert vm.guest_boot_time_ms() > 0
        vm.login()
        assert vm.sh("uname -m") == "aarch64"
        assert vm.sh("getconf PAGESIZE") == "16384"
        assert vm.sh("cat /proc/cmdline").find("root=/dev/vda") >= 0
        assert vm.poweroff() == 0, "poweroff in the guest must end boot with status 0"


def test_root_disk_persists_across_boots(cfg, disk, tmp_path):
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "first.log") as vm:
        vm.login()
        vm.sh("echo persisted-$((6*7)) > /root/marker && sync")
        assert vm.poweroff() == 0
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "second.log") as vm:
        vm.login()
        assert vm.sh("cat /root/marker") == "persisted-42"
        assert vm.poweroff() == 0


def test_two_vcpus_both_run(cfg, disk, tmp_path):
    with Vm.boot(cfg, disk=disk, cpus=2, log_path=tmp_path / "console.log") as vm:
        vm.login()
        assert vm.sh("nproc") == "2"
        before = cpu_busy_ticks(vm.sh)
        assert set(before) == {"cpu0", "cpu1"}
        # Two busy loops; the scheduler spreads them over both CPUs.
        vm.sh("for i in 1 2; do (while :; do :; done) & done")
        time.sleep(3)
        after = cpu_busy_ticks(vm.sh)
        vm.sh("kill $(jobs -p)")
        for cpu in ("cpu0", "cpu1"):
            assert after[cpu] - before[cpu] >= 50, f"{cpu} did not run the busy loop: {before} -> {after}"
        assert vm.poweroff() == 0


def test_ctrl_a_x_quits_promptly(cfg, disk, tmp_path):
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "console.log") as vm:
        vm.login()
        vm.send(CTRL_A + "h")
        vm.expect(r"Ctrl-A x\s+quit", "the escape help")
        t0 = time.monotonic()
        vm.send(CTRL_A + "x")
        assert vm.wait_exit(10) == 0
        assert time.monotonic() - t0 < 5, "Ctrl-A x should quit within a few seconds"


def run_boot(boot_bin, *args, timeout=30):
    return subprocess.run(
        [str(boot_bin), *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_bad_arguments_give_one_clear_line(boot_bin, guest_out, tmp_path):
    r = run_boot(boot_bin, "--kernel", str(tmp_path / "missing"), "--disk", str(guest_out / "rootfs.ext4"))
    assert r.returncode != 0 and "not found" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr

    bad = tmp_path / "bad-image"
    bad.write_bytes(b"\0" * 4096)
    r = run_boot(boot_bin, "--kernel", str(bad), "--disk", str(guest_out / "rootfs.ext4"), "--backend", "emu")
    assert r.returncode != 0 and "magic" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    # What is there instead of a kernel or a disk image is named, not called missing.
    disk = str(guest_out / "rootfs.ext4")
    for args, said in (
        (["--kernel", str(tmp_path), "--disk", disk], f"kernel {tmp_path} is a directory"),
        (["--kernel", "/dev/zero", "--disk", disk], "kernel /dev/zero is not a regular file (a character device)"),
        (["--kernel", str(guest_out / "Image"), "--disk", str(tmp_path)], f"disk image {tmp_path} is a directory"),
        (
            ["--kernel", str(guest_out / "Image"), "--disk", "/dev/zero"],
            "disk image /dev/zero is not a regular file (a character device)",
        ),
    ):
        r = run_boot(boot_bin, *args, "--backend", "emu")
        assert r.returncode != 0 and said in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    # A kernel cut short (its header intact) is refused, not run.
    cut = tmp_path / "cut-image"
    cut.write_bytes((guest_out / "Image").read_bytes()[:100])
    r = run_boot(boot_bin, "--kernel", str(cut), "--disk", disk, "--backend", "emu", timeout=60)
    assert r.returncode != 0 and "truncated arm64 Image: the file is 100 bytes" in r.stderr, r.stderr

    # A store that is a file is refused at start, not at the first snapshot.
    store = tmp_path / "store-file"
    store.write_text("")
    kernel = str(guest_out / "Image")
    r = run_boot(boot_bin, "--kernel", kernel, "--disk", disk, "--name", "s", "--store", str(store), "--backend", "emu")
    assert r.returncode != 0 and "is not a directory (it is a regular file)" in r.stderr, r.stderr

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
    for extra in (
        ["--disk", str(guest_out / "rootfs.ext4")],
        ["--restore", "golden", "--store", str(tmp_path / "store")],
    ):
        r = run_boot(boot_bin, "--gic", "hvf", "--backend", "emu", *extra)
        assert r.returncode != 0, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "in-kernel GIC exists only on the hvf backend" in lines[0], r.stderr
    r = run_boot(boot_bin, "--gic", "vgic")
    assert r.returncode == 2 and "--gic" in r.stderr, r.stderr
    r = run_boot(boot_bin, "--help")
    assert "userspace" in r.stdout and "macOS 15" in r.stdout, r.stdout


def test_console_works_on_a_pipe(cfg, disk):
    """stdin and stdout are pipes (no terminal): login, a command, poweroff."""
    argv = cfg.argv("--kernel", str(cfg.kernel), "--disk", str(disk))
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert p.stdin is not None and isinstance(p.stdout, io.BufferedReader)
    stdin, stdout = p.stdin, p.stdout
    out = bytearray()
    seen = threading.Condition()

    def reader():
        for chunk in iter(lambda: stdout.read1(4096), b""):
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
            stdin.write(text[i : i + 8].encode())
            stdin.flush()
            time.sleep(0.02)

    try:
        wait_for(b"login:", cfg.timeouts.boot)
        type_slowly("root\n")
        wait_for(b"# ", cfg.timeouts.cmd)
        type_slowly("echo piped-$((40+2))\n")
        wait_for(b"piped-42", cfg.timeouts.cmd)
        type_slowly("poweroff\n")
        assert p.wait(cfg.timeouts.cmd) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_terminal_is_restored_after_sigterm(cfg, disk, tmp_path):
    """boot puts the tty in raw mode; SIGTERM (a clean quit, status 0) must leave it canonical
    again."""
    boot = " ".join(f'"{a}"' for a in cfg.argv("--kernel", str(cfg.kernel), "--disk", str(disk)))
    script = f'{boot}; echo "status=$?"; stty -a'
    t = cfg.timeouts
    child = console.spawn(["sh", "-c", script], log_path=tmp_path / "console.log", timeout=t.boot)
    try:
        console.expect(child, console.LOGIN, t.boot, "login:")
        pids = subprocess.run(["pgrep", "-P", str(child.pid)], capture_output=True, text=True).stdout.split()
        assert len(pids) == 1, pids
        os.kill(int(pids[0]), signal.SIGTERM)
        console.expect(child, r"status=(\d+)", t.cmd, "boot's exit status")
        assert int(console.match(child).group(1)) == 0
        console.expect(child, r"(-?)icanon", t.cmd, "stty output")
        assert console.match(child).group(1) == "", "the terminal was left in raw mode (-icanon)"
        console.wait_exit(child, t.cmd)
    finally:
        console.terminate(child)
