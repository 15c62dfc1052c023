"""virtio-net on the real guest, through passt (started by each test); guest commands run
through the guest agent.

The guest gets its address by DHCP (udhcpc, started by the guest's init),
fetches from and posts to an HTTP server on the host's loopback (passt
maps the gateway address to it), both checksummed, with checksum offload
negotiated; keeps working across a snapshot and a restore onto a new passt
and onto `--net passt` (a passt boot starts and stops) with another MAC
(`--mac`, which the guest agent has the guest learn); and a restore whose
device set differs from the command line is refused. As root, a TAP
interface in a network namespace the test makes carries a checksummed
download and upload too (the host kernel checks the TCP checksums the
device computed)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ignition import net
from ignition.branch import pid_alive
from ignition.vm import Vm

pytestmark = [
    pytest.mark.e2e,
    # passt is Linux's; a Mac's host end (socket_vmnet) needs root to set up, so the check
    # there skips these. On Linux a missing passt fails (scripts/setup.sh installs it).
    pytest.mark.skipif(
        sys.platform != "linux" and net.passt_bin() is None, reason="passt is Linux-only (a Mac has socket_vmnet)"
    ),
]

MEM = 512
BIG = 64 << 20


def wait_for_lease(vm: Vm) -> str:
    """Waits (bounded, generously) for eth0's DHCP lease; returns the gateway."""
    vm.run(net.LEASE_WAIT_CMD, timeout=120)
    gw = vm.run(net.GATEWAY_CMD)
    assert gw, "no default route from the lease"
    return gw


def test_dhcp_and_checksummed_transfers_both_ways(tmp_path, guest_disk, cfg):
    page = os.urandom(100_000)
    big = os.urandom(BIG)
    with net.Passt(tmp_path) as passt, net.LoopbackHttp() as http:
        page_sum = http.add("page", page)
        big_sum = http.add("big", big)
        with Vm.boot(
            cfg,
            agent=True,
            disk=guest_disk,
            mem=MEM,
            extra=["--net", f"stream:{passt.socket}"],
            log_path=tmp_path / "boot.log",
        ) as vm:
            vm.wait_ready()
            gw = wait_for_lease(vm)
            url = f"http://{gw}:{http.port}"
            assert vm.run(f"wget -q -O - {url}/page | sha256sum").split()[0] == page_sum
            # 64 MiB to the guest.
            assert vm.run(f"wget -q -O - {url}/big | sha256sum", timeout=900).split()[0] == big_sum
            # 64 MiB from the guest (random bytes but NUL: see net.LoopbackHttp).
            vm.run(f"tr -d '\\000' < /dev/urandom | head -c {BIG} > /dev/shm/up", timeout=300)
            up_sum = vm.run("sha256sum /dev/shm/up").split()[0]
            got = vm.run(f"wget -q -O - --post-file=/dev/shm/up {url}/up", timeout=900).split()
            assert got == [up_sum, str(BIG)]
            # passt's MTU (by DHCP), which mergeable receive buffers carry.
            assert "MTU:65520" in vm.run("ifconfig eth0")
            # The transfers above went with checksum offload both ways: the
            # driver negotiated VIRTIO_NET_F_CSUM and VIRTIO_NET_F_GUEST_CSUM
            # (the device's feature bits as Linux shows them, bit 0 first).
            assert vm.run("cat /sys/class/net/eth0/device/features")[:2] == "11"
            assert vm.quit() == 0


def test_the_network_works_after_restore_on_a_new_host_end(tmp_path, guest_disk, cfg):
    store = tmp_path / "store"
    page = os.urandom(50_000)
    with net.LoopbackHttp() as http:
        page_sum = http.add("page", page)
        with (
            net.Passt(tmp_path, "a.sock") as a,
            Vm.boot(
                cfg,
                agent=True,
                disk=guest_disk,
                mem=MEM,
                store=store,
                track_dirty=True,
                name="netbase",
                extra=["--net", f"stream:{a.socket}"],
                log_path=tmp_path / "boot.log",
            ) as vm,
        ):
            vm.wait_ready()
            gw = wait_for_lease(vm)
            mac = vm.run("cat /sys/class/net/eth0/address")
            vm.snapshot("netbase", "full")
            assert vm.quit() == 0
        # passt a is gone; b is new, at another path.
        with (
            net.Passt(tmp_path, "b.sock") as b,
            Vm.restore(
                cfg,
                "netbase",
                store=store,
                agent=True,
                extra=["--net", f"stream:{b.socket}"],
                log_path=tmp_path / "restore.log",
            ) as vm,
        ):
            assert vm.run("cat /sys/class/net/eth0/address") == mac
            # (timeout, not wget -T: busybox 1.35's wget crashes with -T,
            # under QEMU as here.)
            got = vm.run(f"timeout 60 wget -q -O - http://{gw}:{http.port}/page | sha256sum", timeout=120)
            assert got.split()[0] == page_sum
            assert vm.quit() == 0

        # Asked for, another MAC: the guest agent has the driver read it before the new
        # lease; on a passt boot starts (and stops: it is gone with the VM).
        other = "52:54:00:00:00:01"
        with Vm.restore(
            cfg,
            "netbase",
            store=store,
            agent=True,
            extra=["--net", "passt", "--mac", other],
            log_path=tmp_path / "restore-mac.log",
        ) as vm:
            assert vm.run("cat /sys/class/net/eth0/address") == other
            gw = wait_for_lease(vm)
            got = vm.run(f"timeout 60 wget -q -O - http://{gw}:{http.port}/page | sha256sum", timeout=120)
            assert got.split()[0] == page_sum
            passts = net.passt_pids(vm.pid)
            assert len(passts) == 1, passts
            assert vm.quit() == 0
        assert not any(pid_alive(p) for p in passts)

    # The device set must match the snapshot's.
    boot = cfg.argv("--restore", "netbase", "--store", str(store))
    r = subprocess.run(boot, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"has a network device (MAC {mac})" in r.stderr and "--net" in r.stderr, r.stderr


def test_host_end_errors_are_clear(tmp_path, guest_disk, cfg):
    base = cfg.argv("--kernel", str(cfg.kernel), "--disk", str(guest_disk))
    r = subprocess.run([*base, "--net", f"stream:{tmp_path}/absent.sock"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"--net stream:{tmp_path}/absent.sock: cannot connect" in r.stderr, r.stderr
    for bad, says in [("udp:1.2.3.4", "not a host end"), ("tap:", "not a host end")]:
        r = subprocess.run([*base, "--net", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr, r.stderr
    r = subprocess.run([*base, "--mac", "52:54:00:00:00:01"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--mac needs a network device" in r.stderr, r.stderr
    r = subprocess.run(
        [*base, "--net", "stream:x", "--mac", "01:00:00:00:00:01"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "multicast" in r.stderr, r.stderr


def test_without_net_the_guest_has_no_network_device(tmp_path, guest_disk, cfg):
    with Vm.boot(cfg, agent=True, disk=guest_disk, mem=256, log_path=tmp_path / "boot.log") as vm:
        vm.wait_ready()
        assert vm.run_status("test -e /sys/class/net/eth0")[0] != 0
        assert vm.run("ifconfig lo | grep -c 'inet addr:127.0.0.1'") == "1"
        assert vm.quit() == 0


def in_netns(name: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", name, *argv], capture_output=True, text=True, check=check, timeout=60)


@pytest.fixture
def netns():
    """A network namespace of this test's (root only), removed afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("a TAP interface in a network namespace needs root and iproute2")
    name = f"ignition-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], timeout=60)


def test_tap_in_a_network_namespace(tmp_path, guest_disk, cfg, netns):
    # The TAP interface and a web server in the namespace; boot runs there too.
    in_netns(netns, "ip", "tuntap", "add", "tap0", "mode", "tap")
    in_netns(netns, "ip", "addr", "add", "10.0.2.1/24", "dev", "tap0")
    in_netns(netns, "ip", "link", "set", "tap0", "up")
    page = os.urandom(200_000)
    (tmp_path / "page").write_bytes(page)
    # The test's HTTP server (which answers a POST with its body's SHA-256), in the namespace.
    serve = (
        "import sys; from pathlib import Path; from ignition import net; "
        "s = net.LoopbackHttp(('10.0.2.1', 8080)); s.add('page', Path(sys.argv[1]).read_bytes()); "
        "s.serve_forever()"
    )
    server = subprocess.Popen(
        ["ip", "netns", "exec", netns, sys.executable, "-c", serve, str(tmp_path / "page")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(Path(net.__file__).parents[1])},
    )
    wrapper = tmp_path / "boot-in-netns"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {netns} {cfg.boot} "$@"\n')
    wrapper.chmod(0o755)
    try:
        with Vm.boot(
            dataclasses.replace(cfg, boot=wrapper),
            agent=True,
            disk=guest_disk,
            mem=256,
            extra=["--net", "tap:tap0", "--mac", "52:54:00:aa:bb:cc"],
            log_path=tmp_path / "boot.log",
        ) as vm:
            vm.wait_ready()
            assert vm.run("cat /sys/class/net/eth0/address") == "52:54:00:aa:bb:cc"
            vm.run("ifconfig eth0 10.0.2.15 netmask 255.255.255.0 up")
            got = vm.run(
                "timeout 60 sh -c 'until wget -q -O - http://10.0.2.1:8080/page; do sleep 0.2; done' | sha256sum",
                timeout=120,
            )
            assert got.split()[0] == hashlib.sha256(page).hexdigest()
            # An upload: the host kernel checks the TCP checksum of every frame from a TAP
            # interface, and with checksum offload the device computed them.
            up = 8 << 20
            vm.run(f"tr -d '\\000' < /dev/urandom | head -c {up} > /dev/shm/up", timeout=300)
            up_sum = vm.run("sha256sum /dev/shm/up").split()[0]
            got = vm.run("wget -q -O - --post-file=/dev/shm/up http://10.0.2.1:8080/up", timeout=300)
            assert got.split() == [up_sum, str(up)]
            assert vm.run("cat /sys/class/net/eth0/device/features")[:2] == "11"
            assert vm.quit() == 0
    finally:
        server.terminate()
        server.wait(10)


def test_frames_received_during_and_after_a_snapshot_reach_the_layers(tmp_path, guest_disk, cfg):
    """A background snapshot taken while 64 MiB arrive: the VM keeps receiving; a diff taken
    after holds every page received since (restored, the file is whole), and the first
    layer restores to a working network."""
    store = tmp_path / "store"
    big = os.urandom(BIG)
    with net.LoopbackHttp() as http:
        big_sum = http.add("big", big)
        with (
            net.Passt(tmp_path, "a.sock") as a,
            Vm.boot(
                cfg,
                agent=True,
                disk=guest_disk,
                mem=MEM,
                store=store,
                track_dirty=True,
                name="busy",
                extra=["--net", f"stream:{a.socket}"],
                log_path=tmp_path / "boot.log",
            ) as vm,
        ):
            vm.wait_ready()
            gw = wait_for_lease(vm)
            vm.run(
                f"wget -q -O /dev/shm/big http://{gw}:{http.port}/big && sha256sum /dev/shm/big > /dev/shm/big.sum &"
            )
            # Once some of it has arrived, snapshot mid-transfer.
            vm.run(
                "i=0; until [ -s /dev/shm/big ]; do i=$((i+1)); [ $i -lt 600 ] || exit 1; sleep 0.1; done", timeout=120
            )
            vm.snapshot("busy", "full")
            vm.run(
                "i=0; until [ -s /dev/shm/big.sum ]; do i=$((i+1)); [ $i -lt 6000 ] || exit 1; sleep 0.1; done",
                timeout=900,
            )
            assert vm.run("cut -d' ' -f1 /dev/shm/big.sum") == big_sum
            vm.snapshot("busy.2", "diff")
            assert vm.quit() == 0
        with net.Passt(tmp_path, "b.sock") as b:
            net_args = ["--net", f"stream:{b.socket}"]
            with Vm.restore(cfg, "busy.2", store=store, agent=True, extra=net_args, log_path=tmp_path / "r2.log") as vm:
                assert vm.run("sha256sum /dev/shm/big").split()[0] == big_sum
                assert vm.quit() == 0
            with Vm.restore(cfg, "busy", store=store, agent=True, extra=net_args, log_path=tmp_path / "r1.log") as vm:
                # The transfer's connection did not survive (a new passt); the network does.
                vm.run("pkill wget; true")
                got = vm.run(f"timeout 600 wget -q -O - http://{gw}:{http.port}/big | sha256sum", timeout=900)
                assert got.split()[0] == big_sum
                assert vm.quit() == 0
