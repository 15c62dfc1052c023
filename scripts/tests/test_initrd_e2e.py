"""End-to-end: `boot --initrd` and `boot --kernel Image.gz` with the guest's kernel.

The initramfs is built here (ignition.initrd: a newc cpio with the guest's busybox and a
small /init), and the kernel gzipped here, so nothing but guest/out is needed.
"""

from __future__ import annotations

import dataclasses
import gzip
import subprocess

import pytest

from ignition import console, initrd
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

NOTE = b"from-the-initrd\n"


@pytest.fixture(scope="module")
def busybox(guest_out) -> bytes:
    return initrd.busybox_from_rootfs(guest_out / "rootfs.ext4")


def archive(busybox: bytes, script: str) -> bytes:
    return initrd.busybox_initrd(busybox, script, [initrd.file("note", NOTE)])


@pytest.mark.parametrize("packed", ["raw", "gzip"])
def test_init_from_the_initrd_runs_and_powers_off(cfg, disk, busybox, tmp_path, packed):
    # The marker is computed by the guest's shell: only /init running prints it.
    cpio = archive(busybox, 'echo "initrd-init: $((6*7)) $(cat /note)"; poweroff -f')
    path = tmp_path / "initrd.cpio"
    if packed == "gzip":
        # Image.gz decompressed by boot, and a gzip initramfs decompressed by the kernel.
        kernel = tmp_path / "Image.gz"
        kernel.write_bytes(gzip.compress(cfg.kernel.read_bytes(), compresslevel=1))
        cfg = dataclasses.replace(cfg, kernel=kernel)
        cpio = gzip.compress(cpio)
    path.write_bytes(cpio)
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "console.log", extra=["--initrd", str(path)]) as vm:
        vm.expect("Unpacking initramfs", "the kernel unpacking the initrd")
        vm.expect(r"initrd-init: 42 from-the-initrd", "the marker of the initrd's /init")
        assert vm.wait_exit() == 0, "poweroff -f in /init must end boot with status 0"
    log = (tmp_path / "console.log").read_text(errors="replace")
    assert "Freeing initrd memory" in log, log[-2000:]


def test_a_vm_booted_from_an_initrd_restores_without_the_file(cfg, disk, busybox, tmp_path):
    path = tmp_path / "initrd.cpio"
    path.write_bytes(archive(busybox, "echo initrd-shell-$((6*7)); export PS1='initrd# '; exec sh"))
    store = tmp_path / "store"
    log = tmp_path / "console.log"
    with Vm.boot(cfg, disk=disk, log_path=log, store=store, control=True, extra=["--initrd", str(path)]) as vm:
        vm.expect("initrd-shell-42", "the initrd's /init")
        vm.expect(console.PROMPT, "the initrd's shell prompt")
        assert vm.sh("cat /note") == NOTE.decode().strip()
        assert vm.sh("echo state-$((3*5)) > /kept && cat /kept") == "state-15"
        assert vm.snapshot("from-initrd").kind == "full"
        assert vm.quit() == 0
    # The initramfs is in guest RAM, so in the snapshot: the restore needs no initrd file.
    path.unlink()
    with Vm.restore(cfg, "from-initrd", store=store, log_path=tmp_path / "restored.log") as vm:
        assert vm.sh("cat /note") == NOTE.decode().strip()
        assert vm.sh("cat /kept") == "state-15"
        vm.type("poweroff -f\n")
        assert vm.wait_exit() == 0


def run_boot(boot_bin, *args):
    return subprocess.run([str(boot_bin), *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_bad_initrds_and_kernels_give_one_clear_line(boot_bin, guest_out, tmp_path):
    disk = str(guest_out / "rootfs.ext4")
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    # 60 MiB fit in 64 MiB of RAM, but not above the kernel and the DTB; 65 MiB do not fit at all.
    near = tmp_path / "near-ram-size"
    with open(near, "wb") as f:
        f.truncate(60 << 20)
    over = tmp_path / "over-ram-size"
    with open(over, "wb") as f:
        f.truncate(65 << 20)
    for args, said in (
        (["--initrd", str(tmp_path / "missing")], f"initrd {tmp_path / 'missing'} not found"),
        (["--initrd", str(tmp_path)], f"initrd {tmp_path} is a directory"),
        (["--initrd", "/dev/zero"], "initrd /dev/zero is not a regular file (a character device)"),
        (["--initrd", str(empty)], f"initrd {empty} is empty"),
        (["--mem", "64", "--initrd", str(near)], "no room for the 62914560-byte initrd at 0x40a00000"),
        (["--mem", "64", "--initrd", str(over)], "is 68157440 bytes, more than the guest's 67108864 bytes of RAM"),
    ):
        r = run_boot(boot_bin, *args, "--disk", disk, "--backend", "emu")
        assert r.returncode == 1 and said in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr

    # Compressed kernels: gzip is decompressed (see above); the others are named and refused.
    image = (guest_out / "Image").read_bytes()
    for name, magic in (("zstd", b"\x28\xb5\x2f\xfd"), ("xz", b"\xfd7zXZ\x00"), ("lz4", b"\x02\x21\x4c\x18")):
        k = tmp_path / f"Image.{name}"
        k.write_bytes(magic + image[:4096])
        r = run_boot(boot_bin, "--kernel", str(k), "--disk", disk, "--backend", "emu")
        assert r.returncode == 1 and f"the kernel is {name}-compressed" in r.stderr, r.stderr
    zboot = tmp_path / "vmlinuz.efi"
    zboot.write_bytes(b"MZ\0\0zimg" + b"\0" * 16 + b"gzip" + b"\0" * 4096)
    r = run_boot(boot_bin, "--kernel", str(zboot), "--disk", disk, "--backend", "emu")
    assert r.returncode == 1 and "EFI zboot image (gzip-compressed" in r.stderr, r.stderr
    # A gzip stream cut short is an error, not a short kernel.
    cut = tmp_path / "Image.gz"
    cut.write_bytes(gzip.compress(image, compresslevel=1)[:100_000])
    r = run_boot(boot_bin, "--kernel", str(cut), "--disk", disk, "--backend", "emu")
    assert r.returncode == 1 and "cannot decompress the gzip-compressed kernel" in r.stderr, r.stderr

    # A 64 KiB-page kernel (Image header flags bits 1-2 = 3) would stop silently: refused.
    flags = int.from_bytes(image[0x18:0x20], "little")
    k64 = tmp_path / "Image-64k"
    k64.write_bytes(image[:0x18] + ((flags & ~6) | 3 << 1).to_bytes(8, "little") + image[0x20:])
    r = run_boot(boot_bin, "--kernel", str(k64), "--disk", disk, "--backend", "emu")
    assert r.returncode == 1 and "uses 64 KiB pages (its Image header)" in r.stderr, r.stderr

    # A restore takes its initrd from the snapshot's RAM.
    r = run_boot(boot_bin, "--restore", "x", "--initrd", str(empty))
    assert r.returncode == 2 and "cannot be used with" in r.stderr, r.stderr
