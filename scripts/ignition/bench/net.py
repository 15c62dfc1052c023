"""Benchmark (not a test): guest<->host TCP throughput through passt, Ignition
against QEMU TCG's virtio-net on the same passt, guest and machine, in one run;
and Ignition's vsock throughput in the same run.

Each VMM boots the built guest with a virtio-mmio network device on its own
passt (QEMU: `-netdev stream`), takes its DHCP lease, then for each of N runs
downloads a blob from an HTTP server on the host's loopback (`wget -O
/dev/null`) and uploads one (`wget --post-file` from /dev/shm). The server
times each body from its first byte to its last; MB/s = 10^6 bytes per
second. Beside each, the VMM process's CPU time over the transfer (user +
system, all threads, from /proc/PID/stat), per MiB: how much host CPU the
VMM and its guest spend on the bytes, which a loaded host changes much less
than the throughput. Prints medians and the Ignition/QEMU ratio; writes
bench-results/net.json, with the 1-minute load average at the start and the
end.

Both devices offer mergeable receive buffers, so both guests take passt's
65520-byte MTU by DHCP (the JSON records each guest's MTU).

vsock (Ignition only: QEMU's vsock needs the host kernel's vhost-vsock): to
the guest, a host program sends the same size to `vsock sink` in the guest,
timed until the guest's byte count comes back; to the host, the guest pipes
zeros (`dd`) into `vsock connect 2 P`, timed on the host from the first byte to the
end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from ignition import console, host, net, paths, qemu, timeouts, vsock
from ignition.guest import disk_copy
from ignition.paths import DEFAULT_BOOT, RESULTS_DIR
from ignition.stats import sha256, stats, write_report
from ignition.vm import Vm, VmConfig


def measure(run: Callable[[str, float], str], http: net.LoopbackHttp, mib: int, runs: int, pid: int) -> dict[str, Any]:
    """Down and up MB/s, and the CPU ms per MiB of process `pid` (the VMM), over `runs`
    transfers of `mib` MiB each; `run(cmd, timeout)` runs a guest shell command (Ignition:
    through the guest agent; QEMU: on its console)."""
    run(net.LEASE_WAIT_CMD, 120)
    url = f"http://{run(net.GATEWAY_CMD, 30)}:{http.port}"
    size = mib << 20
    run(f"tr -d '\\000' < /dev/urandom | head -c {size} > /dev/shm/up", 600)
    down: list[float] = []
    up: list[float] = []
    down_cpu: list[float] = []
    up_cpu: list[float] = []

    def timed(cmd: str, method: str, mb_s: list[float], cpu: list[float]) -> str:
        n = len(http.transfers)
        before = host.process_cpu_ms(pid)
        answer = run(cmd, 900)
        after = host.process_cpu_ms(pid)
        got_method, got, secs = http.transfers[n]
        assert got_method == method and got == size
        assert before is not None and after is not None, "the VMM is gone"
        mb_s.append(size / secs / 1e6)
        cpu.append((after - before) / mib)
        return answer

    for _ in range(runs):
        timed(f"wget -q -O /dev/null {url}/blob", "GET", down, down_cpu)
        answer = timed(f"wget -q -O - --post-file=/dev/shm/up {url}/up", "POST", up, up_cpu).split()
        assert answer[1] == str(size), answer
    return {
        "down_mb_s": stats(down),
        "up_mb_s": stats(up),
        "down_cpu_ms_per_mib": stats(down_cpu),
        "up_cpu_ms_per_mib": stats(up_cpu),
        "mtu": run("cat /sys/class/net/eth0/mtu", 30),
    }


def measure_vsock(vm: Vm, uds: Path, mib: int, runs: int) -> dict[str, Any]:
    """vsock MB/s to the guest and to the host over `runs` transfers of `mib` MiB each."""
    size = mib << 20
    to_guest, to_host = [], []
    counter = vsock.TimedCount()
    with vsock.PortServer(uds, 7001, counter) as server:
        for i in range(runs):
            vm.run("vsock sink 7000 > /dev/null &")
            to_guest.append(size / vsock.send_timed(uds, 7000, size) / 1e6)
            # (dd: busybox head -c is slower than the transfer under TCG)
            got = vm.run(f"dd if=/dev/zero bs=65536 count={size >> 16} 2>/dev/null | vsock connect 2 7001", timeout=900)
            assert got == str(size), got
            n, secs = counter.transfers[i]
            assert n == size
            to_host.append(size / secs / 1e6)
        assert not server.errors, server.errors
    return {"to_guest_mb_s": stats(to_guest), "to_host_mb_s": stats(to_host)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.net", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=3, help="transfers each way per VMM (default: 3)")
    p.add_argument("--mib", type=int, default=64, help="MiB per transfer (default: 64)")
    p.add_argument("--boot", type=Path, default=DEFAULT_BOOT)
    p.add_argument("--backend", default="emu", choices=["emu", "hvf"])
    p.add_argument("--kernel", type=Path, default=paths.KERNEL)
    p.add_argument("--disk", type=Path, default=paths.ROOTFS)
    p.add_argument("--mem", type=int, default=512, help="MiB (default: 512)")
    p.add_argument("--no-qemu", action="store_true", help="skip the QEMU comparison")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "net.json")
    args = p.parse_args(argv)
    if args.runs < 1 or args.mib < 1:
        p.error("--runs and --mib must be >= 1")
    if net.passt_bin() is None:
        print("net_bench: passt not found (apt install passt)", file=sys.stderr)
        return 1
    err = qemu.check_inputs(args.kernel, args.disk)
    if err and not (args.no_qemu and err.startswith(qemu.QEMU)):
        print(f"net_bench: {err}", file=sys.stderr)
        return 1
    logs = RESULTS_DIR / "logs" / "net"
    logs.mkdir(parents=True, exist_ok=True)
    cfg = VmConfig(boot=args.boot, backend=args.backend, kernel=args.kernel)
    result: dict[str, Any] = {
        "benchmark": "net_throughput_passt",
        "config": {
            "mib": args.mib,
            "runs": args.runs,
            "mem_mib": args.mem,
            "kernel_sha256": sha256(args.kernel),
            "disk_sha256": sha256(args.disk),
        },
        "host": host.summary(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg_start": os.getloadavg()[0],
    }
    blob = os.urandom(args.mib << 20)
    with net.LoopbackHttp() as http:
        http.add("blob", blob)
        with (
            disk_copy(args.disk) as disk,
            net.Passt(logs, "ignition.sock") as passt,
            Vm.boot(
                cfg,
                disk=disk,
                mem=args.mem,
                agent=True,
                extra=["--net", f"stream:{passt.socket}"],
                log_path=logs / "ignition.log",
            ) as vm,
        ):
            vm.wait_ready()
            assert vm.vsock_path is not None
            result["ignition"] = {
                "backend": args.backend,
                **measure(lambda c, t: vm.run(c, timeout=t), http, args.mib, args.runs, vm.pid),
            }
            result["ignition_vsock"] = measure_vsock(vm, vm.vsock_path, args.mib, args.runs)
            vm.quit()
        if not args.no_qemu:
            qto = timeouts.for_backend("qemu")
            with disk_copy(args.disk) as disk, net.Passt(logs, "qemu.sock") as passt:
                argv = qemu.qemu_argv(args.kernel, disk, mem_mib=args.mem, net_socket=passt.socket)
                child = console.spawn(argv, log_path=logs / "qemu.log")
                try:
                    console.login(child, qto.boot)
                    assert child.pid is not None, "spawned"
                    result["qemu_tcg"] = measure(
                        lambda c, t: console.run(child, c, t), http, args.mib, args.runs, child.pid
                    )
                finally:
                    console.terminate(child)
    result["loadavg_end"] = os.getloadavg()[0]
    ig = result["ignition"]
    vs = result["ignition_vsock"]

    def line(name: str, r: dict[str, Any]) -> str:
        return (
            f"{name} (MTU {r['mtu']}): down {r['down_mb_s']['median']} MB/s "
            f"({r['down_cpu_ms_per_mib']['median']} CPU ms/MiB), up {r['up_mb_s']['median']} MB/s "
            f"({r['up_cpu_ms_per_mib']['median']} CPU ms/MiB)"
        )

    lines = [
        line(f"ignition ({args.backend})", ig),
        f"ignition vsock: to the guest {vs['to_guest_mb_s']['median']} MB/s, "
        f"to the host {vs['to_host_mb_s']['median']} MB/s",
    ]
    if "qemu_tcg" in result:
        q = result["qemu_tcg"]
        lines.append(line("qemu tcg", q))
        result["ratio_ignition_to_qemu"] = {
            d: round(ig[f"{d}_mb_s"]["median"] / q[f"{d}_mb_s"]["median"], 3) for d in ("down", "up")
        }
        lines.append(
            f"ratio ignition/qemu: down {result['ratio_ignition_to_qemu']['down']}x, "
            f"up {result['ratio_ignition_to_qemu']['up']}x"
        )
    lines.append(
        f"load average (1 min): {result['loadavg_start']:.1f} at the start, {result['loadavg_end']:.1f} at the end"
    )
    write_report(args.out, result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
