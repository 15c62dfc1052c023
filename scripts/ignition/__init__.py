"""Ignition's Python harness: every e2e test in scripts/tests and every benchmark imports it.

Modules:
  console    drive any console on a pty (pexpect): spawn, expect, paced typing,
             login, shell commands with exit status, exit and kill
  attach     a client of a socket console (boot --console socket:PATH); also
             `python3 -m ignition.attach PATH`
  vm         Vm: one `boot` process (fresh boot or restore) with login, sh,
             snapshot (Ctrl-A s), quit (Ctrl-A x), poweroff, kill, branch; VmConfig
  branch     Child: a handle to one child of a branch (its control socket,
             guest agent, console socket), stop, kill
  loglines   the VMM's log lines: pexpect patterns and parsers to numbers
  timeouts   the one timeout policy, scaled by backend
  store      a snapshot store on disk: layers, work directories, `vmstore`, sizes
  registry   a throwaway OCI registry on 127.0.0.1 (docker-registry), optional
             htpasswd basic auth, auth files, for vmstore push/pull
  guest      the built guest: missing files, disk copies, in-guest probes
  qemu       the reference boot under qemu-system-aarch64
  conformance
             the conformance test images (guest/conformance/): build, run on boot
             and on QEMU, parse their console protocol
  paths      the repository, guest/out, target/release, bench-results
  stats      median/min/max summaries, file digests
  host       host facts for benchmark results
  diff_snapshot_report
             the diff-snapshot benchmark's plan, summaries and Markdown report

Front-ends, each run as `python3 -m ignition.<name>`:
  conformance    the conformance suite on Ignition and QEMU side by side
  qemu_boot      boot the guest under QEMU, run commands, power off
  cli_reference  write or check the book's command reference
  attach         attach this terminal to a socket console
  bench.*        the benchmarks (ignition.bench: boot, qemu_boot, snapshot,
                 diff_snapshot, restore_disk, net, oci, cpu)

Install it with `pip install -e ./scripts` (scripts/setup.sh and scripts/test.sh
do; the tests and front-ends find it only so) and `from ignition import Vm, VmConfig`:

    with Vm.boot(VmConfig(), disk="copy.ext4", store="vmstore", name="golden",
                 track_dirty=True, control=True) as vm:
        vm.login()
        print(vm.sh("uname -a"))
        layer = vm.snapshot("golden")        # over the control socket
    with Vm.restore(VmConfig(), "golden", store="vmstore") as vm:
        print(vm.restored.restore_ms)        # Restore-time, a number

The binaries and the guest are found from the repository this package lives
in (ignition.paths); an editable install keeps that link.
"""

from .branch import Child
from .console import ConsoleError
from .control import ControlClient, ControlError
from .timeouts import Timeouts
from .vm import Layer, Restored, Snapshot, Vm, VmConfig

__all__ = [
    "Child",
    "ControlClient",
    "ControlError",
    "ConsoleError",
    "Layer",
    "Restored",
    "Snapshot",
    "Timeouts",
    "Vm",
    "VmConfig",
]
