"""Boot the built guest under QEMU over a pty and check each step of a session."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from ignition import console, qemu, timeouts

pytestmark = [pytest.mark.e2e, pytest.mark.qemu]

TIMEOUTS = timeouts.for_backend("qemu")
BOOT_TIMEOUT = TIMEOUTS.boot
CMD_TIMEOUT = TIMEOUTS.cmd
QEMU_BOOT = [sys.executable, "-m", "ignition.qemu_boot"]


@pytest.fixture(autouse=True)
def qemu_installed(guest_out):
    # A missing QEMU fails rather than skips: only an unbuilt guest may skip.
    if shutil.which(qemu.QEMU) is None:
        pytest.fail(f"{qemu.QEMU} not installed (Debian package qemu-system-arm)")


def boot(guest_out, tmp_path, append=qemu.DEFAULT_APPEND):
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    argv = qemu.qemu_argv(guest_out / "Image", disk, append=append)
    return console.spawn(argv, log_path=tmp_path / "console.log")


def test_boot_login_run_poweroff(guest_out, tmp_path):
    page_bytes = json.loads((guest_out / "guest.json").read_text())["page_size_bytes"]
    child = boot(guest_out, tmp_path)
    try:
        console.expect(child, console.LOGIN, BOOT_TIMEOUT, "login:")
        console.paced_send(child, "root\n")
        i = console.expect(child, [console.PROMPT, console.PASSWORD], CMD_TIMEOUT, "shell prompt after 'root'")
        assert i == 0, "root was asked for a password; it should log in without one"

        assert console.run(child, "uname -m", CMD_TIMEOUT) == "aarch64"
        assert console.run(child, "id -u", CMD_TIMEOUT) == "0"
        assert console.run(child, "hostname", CMD_TIMEOUT) == "ignition"
        assert console.run(child, "getconf PAGESIZE", CMD_TIMEOUT) == str(page_bytes)
        assert console.run(child, "getconf PAGE_SIZE", CMD_TIMEOUT) == str(page_bytes)

        mounts = {}
        for line in console.run(child, "cat /proc/mounts", CMD_TIMEOUT).splitlines():
            _dev, point, fstype, *_ = line.split()
            mounts[point] = fstype
        assert mounts.get("/dev/shm") == "tmpfs", mounts
        assert mounts.get("/tmp") == "tmpfs", mounts
        assert mounts.get("/dev") == "devtmpfs", mounts
        assert mounts.get("/dev/pts") == "devpts", mounts
        assert mounts.get("/proc") == "proc", mounts
        assert mounts.get("/sys") == "sysfs", mounts
        assert mounts.get("/") == "ext4", mounts

        # The shell really runs in the guest: a failing command reports its status.
        status, out = console.run_status(child, "ls /nonexistent", CMD_TIMEOUT)
        assert status != 0 and "nonexistent" in out

        console.paced_send(child, "poweroff\n")
        assert console.wait_exit(child, CMD_TIMEOUT) == 0, "QEMU should exit 0 after guest poweroff (PSCI SYSTEM_OFF)"
    finally:
        console.terminate(child)


def test_reboot_exits_qemu(guest_out, tmp_path):
    # qemu_argv passes -no-reboot, so a guest reboot (PSCI SYSTEM_RESET) ends QEMU.
    child = boot(guest_out, tmp_path)
    try:
        console.login(child, BOOT_TIMEOUT)
        console.paced_send(child, "reboot\n")
        console.expect(child, r"reboot: Restarting system", CMD_TIMEOUT, "the kernel's restart message")
        assert console.wait_exit(child, CMD_TIMEOUT) == 0
    finally:
        console.terminate(child)


# mem=448M keeps the kernel out of the top 64 MiB of QEMU's RAM, so init's
# boot-timer byte can land there and be read back through /dev/mem.
@pytest.mark.parametrize("boottimer, expected", [("0x5f000000", "0x7B"), ("off", "0x00")])
def test_boottimer_cmdline(guest_out, tmp_path, boottimer, expected):
    append = f"console=ttyAMA0 root=/dev/vda rw mem=448M boottimer={boottimer}"
    child = boot(guest_out, tmp_path, append=append)
    try:
        console.login(child, BOOT_TIMEOUT)
        assert console.run(child, "devmem 0x5f000000 8", CMD_TIMEOUT) == expected
        assert console.run(child, "devmem 0x5f000001 8", CMD_TIMEOUT) == "0x00", "init must write one byte only"
        console.paced_send(child, "poweroff\n")
        assert console.wait_exit(child, CMD_TIMEOUT) == 0
    finally:
        console.terminate(child)


def test_qemu_boot_script(guest_out):
    """python3 -m ignition.qemu_boot end to end: runs the commands, prints output, exits 0, leaves guest/out alone."""
    r = subprocess.run(
        [*QEMU_BOOT, "--cmd", "echo hello-$((6*7))", "--cmd", "uname -m", "--cmd", "touch /written-by-test"],
        capture_output=True,
        text=True,
        timeout=BOOT_TIMEOUT + 60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "# echo hello-$((6*7))",
        "hello-42",
        "# uname -m",
        "aarch64",
        "# touch /written-by-test",
    ]
    manifest = json.loads((guest_out / "guest.json").read_text())
    digest = hashlib.sha256((guest_out / "rootfs.ext4").read_bytes()).hexdigest()
    assert digest == manifest["files"]["rootfs.ext4"]["sha256"], "qemu.py modified guest/out/rootfs.ext4"


def test_qemu_boot_script_reports_failed_command(guest_out):
    r = subprocess.run(
        [*QEMU_BOOT, "--cmd", "exit_code_test() { return 7; }; exit_code_test"],
        capture_output=True,
        text=True,
        timeout=BOOT_TIMEOUT + 60,
    )
    assert r.returncode == 1
    assert "exited with status 7" in r.stderr
