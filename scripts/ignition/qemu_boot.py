"""Boot the guest from guest/out under QEMU (the reference boot, not our VMM).

Boots to login:, logs in as root, runs the given command(s), prints their
output, powers off and exits with QEMU's exit status (1 if a guest command
failed or the console timed out). The disk is a temporary copy, so the build
output is never modified.

    python3 -m ignition.qemu_boot                          # runs `uname -a`
    python3 -m ignition.qemu_boot --cmd 'cat /proc/cpuinfo' --cmd 'df -h'
    python3 -m ignition.qemu_boot --interactive            # your terminal; Ctrl-A x quits
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ignition import console, paths, qemu, timeouts
from ignition.guest import disk_copy

TIMEOUTS = timeouts.for_backend("qemu")


def boot_and_run(
    argv: Sequence[str],
    cmds: Sequence[str],
    boot_timeout: float = TIMEOUTS.boot,
    cmd_timeout: float = TIMEOUTS.cmd,
    log_path: os.PathLike[str] | str | None = None,
) -> tuple[int, list[tuple[str, int, str]]]:
    """Boot argv, log in, run cmds, power off. Returns (QEMU status, [(cmd, status, output)])."""
    child = console.spawn(argv, log_path=log_path)
    try:
        console.login(child, timeout=boot_timeout)
        results = []
        for cmd in cmds:
            status, output = console.run_status(child, cmd, timeout=cmd_timeout)
            results.append((cmd, status, output))
        console.paced_send(child, "poweroff\n")
        return console.wait_exit(child, timeout=cmd_timeout), results
    finally:
        console.terminate(child)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.qemu_boot", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--kernel", type=Path, default=paths.KERNEL, help="kernel Image (default: guest/out/Image)")
    p.add_argument(
        "--disk",
        type=Path,
        default=paths.ROOTFS,
        help="root disk image, copied before boot (default: guest/out/rootfs.ext4)",
    )
    p.add_argument("--cpus", type=int, default=1, help="vCPUs (default: 1)")
    p.add_argument("--mem", type=int, default=512, help="memory in MiB (default: 512)")
    p.add_argument("--cpu", default="max", help="QEMU CPU model (default: max; a 16K kernel needs the 16K granule)")
    p.add_argument(
        "--append", default=qemu.DEFAULT_APPEND, help=f"kernel command line (default: {qemu.DEFAULT_APPEND!r})"
    )
    p.add_argument(
        "--cmd",
        action="append",
        dest="cmds",
        metavar="CMD",
        help="shell command to run after login; repeatable (default: 'uname -a')",
    )
    p.add_argument(
        "--timeout", type=float, default=TIMEOUTS.boot, help=f"seconds to wait for login: (default: {TIMEOUTS.boot:g})"
    )
    p.add_argument("--log", type=Path, help="write the console transcript to this file")
    p.add_argument("--interactive", action="store_true", help="attach QEMU to this terminal instead")
    args = p.parse_args(argv)
    if args.cpus < 1 or args.mem < 64:
        p.error("--cpus must be >= 1 and --mem >= 64")

    err = qemu.check_inputs(args.kernel, args.disk)
    if err:
        print(f"qemu_boot: {err}", file=sys.stderr)
        return 1
    with disk_copy(args.disk) as disk:
        qargv = qemu.qemu_argv(args.kernel, disk, args.cpus, args.mem, args.append, args.cpu)
        if args.interactive:
            return subprocess.call(qargv)
        try:
            status, results = boot_and_run(qargv, args.cmds or ["uname -a"], args.timeout, log_path=args.log)
        except console.ConsoleError as e:
            print(f"qemu_boot: {e}", file=sys.stderr)
            return 1
    failed = False
    for cmd, cmd_status, output in results:
        if len(results) > 1:
            print(f"# {cmd}")
        if output:
            print(output)
        if cmd_status != 0:
            print(f"qemu_boot: {cmd!r} exited with status {cmd_status}", file=sys.stderr)
            failed = True
    if status != 0:
        print(f"qemu_boot: QEMU exited with status {status}", file=sys.stderr)
        return status
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
