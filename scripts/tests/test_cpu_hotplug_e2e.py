"""End-to-end CPU hotplug: PSCI CPU_OFF, then CPU_ON of the same vCPU.

A 2-vCPU guest takes cpu1 offline and back online several times (Linux
calls PSCI CPU_OFF on cpu1, then CPU_ON from cpu0, which must start cpu1
in its reset state: MMU and caches off), and cpu1 must keep working. Then
the same across a snapshot: cpu1 offline when the snapshot is taken,
onlined in the restored VM.

Uses the harness's `Vm` (boot, restore, the guest agent's run and run_status, snapshot,
quit) and `guest.cpu_busy_ticks`. Needs a guest kernel with
CONFIG_HOTPLUG_CPU=y; skips on one without.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from ignition.guest import cpu_busy_ticks
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

CYCLES = 3
ONLINE = "/sys/devices/system/cpu/cpu1/online"
# What a kernel prints when something went wrong.
TROUBLE = re.compile(
    r"Oops|Internal error|Kernel panic|BUG:|WARNING:|Unable to handle|"
    r"failed to come online|rcu_sched self-detected|rcu: INFO"
)


def ready(vm: Vm):
    """Waits for the guest agent; skips the test if the guest kernel cannot take CPUs offline."""
    vm.wait_ready()
    status, _ = vm.run_status(f"test -e {ONLINE}")
    if status != 0:
        pytest.skip(
            f"the guest kernel has no CPU hotplug ({ONLINE} missing): "
            "build it with CONFIG_HOTPLUG_CPU=y (guest/kernel.fragment)"
        )


def set_cpu1(vm: Vm, online: bool):
    """Writes cpu1's `online` file; the write fails if the CPU does not come up."""
    status, out = vm.run_status(f"echo {int(online)} > {ONLINE}")
    assert status == 0, f"echo {int(online)} > {ONLINE} failed: {out}"
    assert vm.run(f"cat {ONLINE}") == str(int(online))
    assert vm.run("cat /sys/devices/system/cpu/online") == ("0-1" if online else "0")


def no_trouble(text: str, where: str):
    trouble = [line for line in text.splitlines() if TROUBLE.search(line)]
    assert not trouble, f"kernel trouble in {where}:\n" + "\n".join(trouble)


def cpu1_works(vm: Vm):
    """cpu1 runs work: a task pinned to it with busybox `taskset` if the
    guest has it (the task reports the CPU it ran on), and cpu1's ticks grow
    under two busy loops. No kernel trouble in the guest's log."""
    status, _ = vm.run_status("command -v taskset")
    if status == 0:
        # Field 39 of /proc/self/stat: the CPU the task last ran on.
        cpu = vm.run(
            "taskset 2 sh -c 'i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; cut -d\" \" -f39 /proc/self/stat'"
        )
        assert cpu == "1", f"a task pinned to cpu1 ran on cpu{cpu}"
    before = cpu_busy_ticks(vm.run)["cpu1"]
    vm.run("for i in 1 2; do (while :; do :; done) & echo $! >> /tmp/busy; done")
    time.sleep(2)
    after = cpu_busy_ticks(vm.run)["cpu1"]
    vm.run("kill $(cat /tmp/busy); rm /tmp/busy")
    assert after - before >= 30, f"cpu1 is not running: {before} -> {after} ticks"
    no_trouble(vm.run("dmesg"), "dmesg")


def console_clean(log: Path):
    no_trouble(log.read_text(errors="replace"), f"the console log {log}")


def test_cpu1_offline_online_cycles(cfg, disk, tmp_path):
    log = tmp_path / "console.log"
    with Vm.boot(cfg, disk=disk, cpus=2, agent=True, log_path=log) as vm:
        ready(vm)
        for _ in range(CYCLES):
            set_cpu1(vm, False)
            set_cpu1(vm, True)
        cpu1_works(vm)
        assert vm.quit() == 0
    console_clean(log)


def test_cpu1_offline_across_a_snapshot_comes_back_online(cfg, disk, tmp_path):
    store = tmp_path / "store"
    log = tmp_path / "before.log"
    with Vm.boot(cfg, disk=disk, cpus=2, store=store, name="cpu1-off", agent=True, log_path=log) as vm:
        ready(vm)
        set_cpu1(vm, False)
        vm.snapshot("cpu1-off", "full")
        assert vm.quit() == 0
    console_clean(log)

    log = tmp_path / "after.log"
    with Vm.restore(cfg, "cpu1-off", store=store, agent=True, log_path=log) as vm:
        assert vm.run("cat /sys/devices/system/cpu/online") == "0"
        set_cpu1(vm, True)
        cpu1_works(vm)
        set_cpu1(vm, False)
        set_cpu1(vm, True)
        assert vm.quit() == 0
    console_clean(log)
