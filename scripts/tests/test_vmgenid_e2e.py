"""The VM generation ID across restores, on the real guest.

Every restore of a snapshot publishes a new VM generation ID and raises its
interrupt; the guest's `vmgenid` driver then reseeds the kernel's RNG, so
two VMs restored from one snapshot read different /dev/urandom bytes. (The
kernel also reseeds on its own schedule, from the first seconds of uptime
up to once a minute, so a young snapshot's restores may differ even without
the ID; the driver's reseed, which its log line shows, is what makes it
certain at any age.)
"""

from __future__ import annotations

import shutil

import pytest

from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 256
RESEEDED = "crng reseeded due to virtual machine fork"


def urandom_digest(vm: Vm) -> str:
    return vm.run("head -c 64 /dev/urandom | sha256sum").split()[0]


def test_each_restore_reseeds_the_guest_rng(tmp_path, guest_out, cfg):
    store = tmp_path / "store"
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    with Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="base", agent=True, log_path=tmp_path / "base.log"
    ) as vm:
        vm.wait_ready()
        # The driver bound to the device tree's node at boot, and nothing
        # has reseeded yet.
        assert vm.run("ls /sys/bus/platform/drivers/vmgenid/ | grep -c '[.]vmgenid$'") == "1"
        assert vm.run_status(f"dmesg | grep -c '{RESEEDED}'")[1] == "0"
        vm.snapshot("base", "full")
        assert vm.quit() == 0

    seen = []
    for n in range(2):
        with Vm.restore(cfg, "base", store=store, agent=True, log_path=tmp_path / f"r{n}.log") as vm:
            # The interrupt is pending from the start; the agent answers after it.
            assert vm.run(f"dmesg | grep -c '{RESEEDED}'") == "1"
            seen.append(urandom_digest(vm))
            assert vm.quit() == 0
    assert seen[0] != seen[1], "two restores of one snapshot read the same random bytes"
