"""Background snapshots on the real guest (the default with --track-dirty).

The writer of a background layer is held at a gate (the test hook
IGNITION_TEST_SNAPSHOT_GATE) while the guest and the devices change pages,
and the guest rewrites a file on its disk, all of which the layer must hold
as they were at the pause; the restored guest must see them as they were. A
layer whose write fails (a full file system) leaves nothing behind and loses
no dirty page: the next snapshot holds them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from ignition import loglines
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 256
GATE_ENV = "IGNITION_TEST_SNAPSHOT_GATE"
BIG = 8 * 1024 * 1024


def fill(vm: Vm, path: str, byte: str, sync: bool = False) -> None:
    """Writes BIG bytes of `byte` to `path` in large blocks (a `yes | head` pipe makes a
    system call per line, which the emu backend takes tens of seconds for)."""
    vm.run(f"head -c {BIG} /dev/zero | tr '\\0' '{byte}' > {path}" + (" && sync" if sync else ""))


def sha(vm: Vm, path: str) -> str:
    return vm.run(f"sha256sum {path}").split()[0]


def open_gate(gate):
    """Lets the held writer go; it removes the gate file when it passes."""
    gate.write_text("")


def test_the_layer_holds_ram_as_it_was_at_the_pause(tmp_path, guest_out, cfg, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    store = tmp_path / "store"
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    with Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="bg", agent=True, log_path=tmp_path / "bg.log"
    ) as vm:
        vm.wait_ready()
        fill(vm, "/dev/shm/a", "b")
        fill(vm, "/root/d", "d", sync=True)
        before = sha(vm, "/dev/shm/a")
        on_disk = sha(vm, "/root/d")
        busybox = sha(vm, "/bin/busybox")
        for name, kind, byte in (("bg", "full", "1"), ("bg.2", "diff", "2")):
            pending = vm.snapshot_start(name)
            # The guest runs; the writer waits at the gate. The guest
            # rewrites the file, the disk is read into freed pages, and a
            # file on the disk is rewritten.
            fill(vm, "/dev/shm/a", byte)
            vm.run("echo 3 > /proc/sys/vm/drop_caches && cat /bin/busybox /etc/* > /dev/null 2>&1; true")
            fill(vm, "/root/d", byte, sync=True)
            assert sha(vm, "/dev/shm/a") != before
            open_gate(gate)
            snap = vm.snapshot_finish(pending, kind)
            assert snap.saved_early is not None, "a background snapshot logs its pages saved early"
            by_guest, by_devices = snap.saved_early
            assert by_guest > 0, "no page was saved before a guest write"
            assert by_devices > 0, "no page was saved before a device write"
            if kind == "full":
                # Only the pages written since the VM started; the rest are
                # zero and holes in the layer.
                assert 0 < snap.pages < MEM * 1024 // 16, snap
            if snap.disk.method == "sparse copy":
                # Copied while the guest ran: the rewrite had to wait for
                # the chunks it reached to be copied first.
                assert snap.disk.copied_before_write > 0, snap.disk
            # The next layer starts from the changed RAM and disk.
            fill(vm, "/dev/shm/a", "b")
            fill(vm, "/root/d", "d", sync=True)
        assert vm.quit() == 0
    assert not gate.exists()

    for spec in ("bg", "bg+1"):
        with Vm.restore(cfg, spec, store=store, agent=True, log_path=tmp_path / f"r-{spec}.log") as vm:
            assert sha(vm, "/dev/shm/a") == before
            assert sha(vm, "/bin/busybox") == busybox
            # From the layer's disk, not the page cache restored with RAM.
            vm.run("echo 3 > /proc/sys/vm/drop_caches")
            assert sha(vm, "/root/d") == on_disk
            assert vm.quit() == 0


def mount_tmpfs(path, size: str):
    path.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for a full store (needs root): {r.stderr.strip()}")


def test_a_failed_layer_leaves_nothing_and_loses_no_dirty_page(tmp_path, guest_out, cfg, monkeypatch):
    gate = tmp_path / "gate"
    monkeypatch.setenv(GATE_ENV, str(gate))
    small = tmp_path / "small"
    mount_tmpfs(small, "512m")
    try:
        store = small / "store"
        disk = tmp_path / "rootfs.ext4"
        shutil.copyfile(guest_out / "rootfs.ext4", disk)
        ballast = small / "ballast"
        with Vm.boot(
            cfg, disk=disk, mem=128, store=store, track_dirty=True, name="f", agent=True, log_path=tmp_path / "f.log"
        ) as vm:
            vm.wait_ready()
            pending = vm.snapshot_start("f")
            open_gate(gate)
            vm.snapshot_finish(pending, "full")

            vm.run("echo one > /dev/shm/m1")
            pending = vm.snapshot_start("f.2")
            # Fill the store's file system while the writer waits.
            subprocess.run(["dd", "if=/dev/zero", f"of={ballast}", "bs=1M"], capture_output=True)
            open_gate(gate)
            vm.expect(loglines.SNAPSHOT_FAILED, "the failure of 'f.2'")
            assert "No space left" in vm.match.group(0)
            assert sorted(os.listdir(store)) == ["f"], "the failed layer left something behind"

            ballast.unlink()
            vm.run("echo two > /dev/shm/m2")
            pending = vm.snapshot_start("f.2")
            open_gate(gate)
            vm.snapshot_finish(pending, "diff")
            assert vm.quit() == 0

        with Vm.restore(cfg, "f+1", store=store, agent=True, log_path=tmp_path / "r.log") as vm:
            # m1 was dirtied before the failed layer: the next one holds it.
            assert vm.run("cat /dev/shm/m1 /dev/shm/m2").split() == ["one", "two"]
            assert vm.quit() == 0
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)
