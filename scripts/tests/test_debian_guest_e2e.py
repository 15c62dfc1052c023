"""End-to-end: Debian's stock arm64 cloud kernel (4 KiB pages, its virtio drivers as modules)
with the initramfs ignition.debian_guest makes, on the project's root disk: it boots to the
guest agent, snapshots and restores; and on a Debian root file system (ignition.debian_rootfs:
bash, coreutils and their libraries, unpacked from apt's packages), where it also branches, and
(as root) branches on a bridge into children that lease addresses of their own.

The packages come from apt (arm64 a dpkg foreign architecture, as guest/build.sh needs too),
cached in ~/.cache/ignition-guest/debian; the test is skipped only where apt has no arm64
packages.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from ignition import debian_guest, image, net
from ignition import debian_rootfs as debian_rootfs_mod
from ignition.branch import Child
from ignition.vm import Vm

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def debian(tmp_path_factory) -> tuple[Path, dict[str, object]]:
    if shutil.which("apt-cache") is None:
        pytest.skip("no apt: Debian's packages are out of reach")
    try:
        debian_guest.resolve()
    except debian_guest.DebianGuestError as e:
        pytest.skip(str(e))
    out = tmp_path_factory.mktemp("debian")
    return out, debian_guest.build(out, debian_guest.cache_dir())


def test_the_record_names_a_4k_kernel_and_its_modules(debian):
    _, record = debian
    assert record["page_size_bytes"] == 4096
    modules = record["modules"]
    assert isinstance(modules, list)
    for m in debian_guest.MODULES:
        assert m in modules
    # Each module after what it depends on.
    assert modules.index("virtio") < modules.index("virtio_mmio") < modules.index("virtio_blk")
    assert modules.index("vsock") < modules.index("vmw_vsock_virtio_transport")


def test_debian_kernel_boots_the_guest_and_restores(cfg, disk, debian, tmp_path):
    out, record = debian
    cfg = dataclasses.replace(cfg, kernel=out / "Image")
    store = tmp_path / "store"
    extra = ["--initrd", str(out / "initrd.cpio")]
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "console.log", store=store, agent=True, extra=extra) as vm:
        vm.wait_ready()
        assert vm.run("uname -r") == record["kernel_release"]
        assert vm.run("getconf PAGESIZE") == "4096"
        loaded = vm.run("cut -d' ' -f1 /proc/modules").split()
        assert set(debian_guest.MODULES) <= set(loaded), loaded
        vm.run("echo kept-$((6*7)) > /root/marker && sync")
        assert vm.snapshot("debian").kind == "full"
        assert vm.quit() == 0
    with Vm.restore(cfg, "debian", store=store, log_path=tmp_path / "restored.log", agent=True) as vm:
        assert vm.run("uname -r") == record["kernel_release"]
        assert vm.run("cat /root/marker") == "kept-42"
        assert vm.quit() == 0


@pytest.fixture(scope="module")
def debian_rootfs(debian, tmp_path_factory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("debian-rootfs")
    return out / "rootfs.ext4", debian_rootfs_mod.build(out, debian_guest.cache_dir())


def test_debian_kernel_boots_a_debian_root_file_system_and_branches(cfg, debian, debian_rootfs, tmp_path):
    out, record = debian
    disk, rootfs_record = debian_rootfs
    packages = rootfs_record["packages"]
    assert isinstance(packages, dict) and {"bash", "coreutils", "libc6"} <= set(packages)
    cfg = dataclasses.replace(cfg, kernel=out / "Image")
    store = tmp_path / "store"
    extra = ["--initrd", str(out / "initrd.cpio")]
    with Vm.boot(
        cfg,
        disk=disk,
        mem=256,
        log_path=tmp_path / "console.log",
        store=store,
        name="deb",
        track_dirty=True,
        agent=True,
        extra=extra,
    ) as vm:
        vm.wait_ready()
        assert vm.run("uname -r") == record["kernel_release"]
        assert vm.run("cat /etc/debian_version").split(".")[0].isdigit()
        assert vm.exec(["bash", "-c", "echo $BASH_VERSION"]).check().stdout.decode().startswith("5.")
        assert "GNU coreutils" in vm.run("ls --version")
        assert vm.run("id -un") == "root"
        vm.run("echo kept > /root/marker && sync")
        (child,) = vm.branch(1, name="b")
        assert child.run("cat /root/marker") == "kept"
        assert child.run("uname -r") == record["kernel_release"]
        assert vm.quit() == 0
    with Vm.restore(cfg, "b", store=store, log_path=tmp_path / "restored.log", agent=True) as vm:
        assert vm.run("cat /root/marker") == "kept"
        assert vm.quit() == 0


def test_branch_children_of_the_debian_guest_on_a_bridge_lease_their_own_addresses(
    cfg, debian, debian_rootfs, tmp_path
):
    """The Debian guest (Debian's kernel, virtio_net a module, on the Debian root disk) on a
    bridge (TAP interfaces in a network namespace: root only): the source serves DHCP from a
    fixed address and branches into two children, each on a TAP interface of its own; each
    child's eth0 has the MAC the branch gave it and a lease of its own (the agent rebinds the
    module's driver and asks with /.ignition's udhcpc), and the children reach each other."""
    if not net.Bridge.available():
        pytest.skip("TAP interfaces on a bridge in a network namespace need root and iproute2")
    out, _ = debian
    disk, _ = debian_rootfs
    store = tmp_path / "store"
    bb = image.BUSYBOX
    children: list[Child] = []
    with net.Bridge(tmp_path, ("tap0", "vm1", "vm2"), name=f"ignition-debian-{os.getpid()}") as br:
        bcfg = dataclasses.replace(cfg, kernel=out / "Image", boot=br.wrap(cfg.boot))
        with Vm.boot(
            bcfg,
            disk=disk,
            mem=256,
            store=store,
            name="src",
            track_dirty=True,
            agent=True,
            extra=["--initrd", str(out / "initrd.cpio"), "--net", "tap:tap0"],
            log_path=tmp_path / "src.log",
        ) as vm:
            vm.wait_ready()
            try:
                source_mac = net.serve_dhcp_on_bridge(vm, bb)
                children = vm.branch(2, name="t", net="tap:vm{i}")
                net.check_bridge_children(children, source_mac, bb)
            finally:
                for c in children:
                    c.stop()
