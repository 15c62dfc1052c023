"""virtio-net on the real guest, through passt (started by each test).

The guest gets its address by DHCP (udhcpc, started by the guest's init),
fetches from and posts to an HTTP server on the host's loopback (passt
maps the gateway address to it), both checksummed, keeps working across a
snapshot and a restore onto a new passt, and a restore whose device set
differs from the command line is refused.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

from ignition import net
from ignition.vm import Vm

MEM = 512
BIG = 64 << 20

def disk_copy(guest_out, tmp_path):
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    return disk


def wait_for_lease(vm: Vm) -> str:
    """Waits (bounded, generously) for eth0's DHCP lease; returns the gateway."""
    vm.sh("i=0; until ifconfig eth0 | grep -q 'inet addr'; do "
          "i=$((i+1)); [ $i -lt 600 ] || exit 1; sleep 0.1; done", timeout=120)
    gw = vm.sh(net.GATEWAY_CMD)
    assert gw, "no default route from the lease"
    return gw


def test_dhcp_and_checksummed_transfers_both_ways(tmp_path, guest_out, cfg):
    page = os.urandom(100_000)
    big = os.urandom(BIG)
    with net.Passt(tmp_path) as passt, net.LoopbackHttp() as http:
        page_sum = http.add("page", page)
        big_sum = http.add("big", big)
        with Vm.boot(cfg, disk=disk_copy(guest_out, tmp_path), mem=MEM,
                     extra=["--net", f"stream:{passt.socket}"],
                     log_path=tmp_path / "boot.log") as vm:
            vm.login()
            gw = wait_for_lease(vm)
            url = f"http://{gw}:{http.port}"
            assert vm.sh(f"wget -q -O - {url}/page | sha256sum").split()[0] == page_sum
            # 64 MiB to the guest.
            assert vm.sh(f"wget -q -O - {url}/big | sha256sum", timeout=900).split()[0] == big_sum
            # 64 MiB from the guest (random bytes but NUL: see net.LoopbackHttp).
            vm.sh(f"tr -d '\\000' < /dev/urandom | head -c {BIG} > /dev/shm/up", timeout=300)
            up_sum = vm.sh("sha256sum /dev/shm/up").split()[0]
            got = vm.sh(f"wget -q -O - --post-file=/dev/shm/up {url}/up", timeout=900).split()
            assert got == [up_sum, str(BIG)]
            # The MTU stays the device's (passt offers 65520).
            assert "MTU:1500" in vm.sh("ifconfig eth0")
            assert vm.quit() == 0


def test_the_network_works_after_restore_on_a_new_host_end(tmp_path, guest_out, cfg):
    store = tmp_path / "store"
    page = os.urandom(50_000)
    with net.LoopbackHttp() as http:
        page_sum = http.add("page", page)
        with net.Passt(tmp_path, "a.sock") as a:
            with Vm.boot(cfg, disk=disk_copy(guest_out, tmp_path), mem=MEM, store=store,
                         track_dirty=True, name="netbase",
                         extra=["--net", f"stream:{a.socket}"],
                         log_path=tmp_path / "boot.log") as vm:
                vm.login()
                gw = wait_for_lease(vm)
                mac = vm.sh("cat /sys/class/net/eth0/address")
                vm.snapshot("netbase", "full")
                assert vm.quit() == 0
        # passt a is gone; b is new, at another path.
        with net.Passt(tmp_path, "b.sock") as b:
            with Vm.restore(cfg, "netbase", store=store, extra=["--net", f"stream:{b.socket}"],
                            log_path=tmp_path / "restore.log") as vm:
                assert vm.sh("cat /sys/class/net/eth0/address") == mac
                # (timeout, not wget -T: busybox 1.35's wget crashes with -T,
                # under QEMU as here.)
                got = vm.sh(f"timeout 60 wget -q -O - http://{gw}:{http.port}/page | sha256sum",
                            timeout=120)
                assert got.split()[0] == page_sum
                assert vm.quit() == 0

    # The device set must match the snapshot's, and the MAC is the snapshot's.
    boot = cfg.argv("--restore", "netbase", "--store", str(store))
    r = subprocess.run(boot, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"has a network device (MAC {mac})" in r.stderr and "--net" in r.stderr, r.stderr
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(tmp_path / "l.sock"))
        listener.listen()
        r = subprocess.run([*boot, "--net", f"stream:{tmp_path}/l.sock", "--mac",
                            "52:54:00:00:00:01"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "cannot restore virtio-net" in r.stderr, r.stderr
    assert f"MAC {mac}, the command line asks for 52:54:00:00:00:01" in r.stderr, r.stderr


def test_host_end_errors_are_clear(tmp_path, guest_out, cfg):
    disk = disk_copy(guest_out, tmp_path)
    base = cfg.argv("--kernel", str(cfg.kernel), "--disk", str(disk))
    r = subprocess.run([*base, "--net", f"stream:{tmp_path}/absent.sock"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"--net stream:{tmp_path}/absent.sock: cannot connect" in r.stderr, r.stderr
    for bad, says in [("udp:1.2.3.4", "not a host end"), ("tap:", "not a host end")]:
        r = subprocess.run([*base, "--net", bad], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and says in r.stderr, r.stderr
    r = subprocess.run([*base, "--mac", "52:54:00:00:00:01"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "--mac needs a network device" in r.stderr, r.stderr
    r = subprocess.run([*base, "--net", "stream:x", "--mac", "01:00:00:00:00:01"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "multicast" in r.stderr, r.stderr


def test_without_net_the_guest_has_no_network_device(tmp_path, guest_out, cfg):
    with Vm.boot(cfg, disk=disk_copy(guest_out, tmp_path), mem=256,
                 log_path=tmp_path / "boot.log") as vm:
        vm.login()
        assert vm.sh_status("test -e /sys/class/net/eth0")[0] != 0
        assert vm.sh("ifconfig lo | grep -c 'inet addr:127.0.0.1'") == "1"
        assert vm.quit() == 0
