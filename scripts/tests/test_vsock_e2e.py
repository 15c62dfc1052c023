"""virtio-vsock on the real guest, with the Unix-socket host end (guest commands run
through the guest agent, which the same device carries).

Host programs connect to `--vsock-uds PATH` with `CONNECT <port>`; guest
connections to host port P arrive at `PATH_P`. Echo round trips of 16 MiB
each way are checksummed, 32 connections run at once each way, a restored
VM gets the transport reset (old connections drop, new ones work at once,
a new CID reaches the guest), and a restore whose device set differs from
the command line is refused.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import threading

import pytest

from ignition import vsock
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 512
BIG = 16 << 20
CONCURRENT = 32
EACH = 256 << 10


def concurrent_echoes(uds, port: int) -> None:
    """CONCURRENT host connections to the guest's echo server at once, each
    EACH random bytes, every echo checked."""
    errors: list[BaseException] = []

    def one(i: int):
        try:
            data = os.urandom(EACH)
            with vsock.connect(uds, port) as s:
                assert vsock.echo_round_trip(s, data) == hashlib.sha256(data).hexdigest(), i
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CONCURRENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_echo_both_ways_checksummed_and_concurrent(tmp_path, guest_disk, cfg):
    with Vm.boot(cfg, disk=guest_disk, mem=MEM, agent=True, log_path=tmp_path / "boot.log") as vm:
        vm.wait_ready()
        uds = vm.vsock_path
        assert uds is not None
        assert vm.run("vsock cid") == "3"
        vm.run("vsock echo-server 5000 &")
        # Host to guest and back: 16 MiB.
        big = os.urandom(BIG)
        with vsock.connect(uds, 5000, timeout=120) as s:
            assert vsock.echo_round_trip(s, big) == hashlib.sha256(big).hexdigest()
        concurrent_echoes(uds, 5000)
        # Guest to host and back: 16 MiB, and 32 connections at once.
        with vsock.PortServer(uds, 6000, vsock.echo) as server:
            vm.run(f"head -c {BIG} /dev/urandom > /dev/shm/big", timeout=300)
            sums = vm.run(
                "sha256sum < /dev/shm/big; vsock connect 2 6000 < /dev/shm/big | sha256sum", timeout=600
            ).split()
            assert sums[0] == sums[2] and len(sums) == 4, sums
            vm.run(f"head -c {EACH} /dev/urandom > /dev/shm/each")
            # (wait for these only: the echo server is a job of this shell too)
            out = vm.run(
                f"pids=; for i in $(seq {CONCURRENT}); do "
                'vsock connect 2 6000 < /dev/shm/each > /dev/shm/out.$i & pids="$pids $!"; '
                "done; wait $pids; "
                "sha256sum < /dev/shm/each; cat /dev/shm/out.* | wc -c; "
                "for f in /dev/shm/out.*; do sha256sum < $f; done | sort -u",
                timeout=600,
            )
            lines = out.split("\n")
            want = lines[0].split()[0]
            assert lines[1].strip() == str(CONCURRENT * EACH), out
            assert [ln.split()[0] for ln in lines[2:]] == [want], out
            assert server.connections == 1 + CONCURRENT
            assert not server.errors, server.errors
        # No listener at a host port: the guest's connect is refused.
        status, out = vm.run_status("vsock connect 2 6001 < /dev/null")
        assert status == 1 and "Connection reset" in out, out
        # Nor on a guest port: the host program is closed without an OK line.
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(uds))
            s.sendall(b"CONNECT 7777\n")
            s.settimeout(60)
            assert s.recv(64) == b""
        assert vm.quit() == 0


def test_a_restore_resets_connections_and_new_ones_work(tmp_path, guest_disk, cfg):
    store = tmp_path / "store"
    with Vm.boot(
        cfg,
        disk=guest_disk,
        mem=MEM,
        store=store,
        track_dirty=True,
        name="vbase",
        agent=True,
        log_path=tmp_path / "boot.log",
    ) as vm:
        vm.wait_ready()
        uds = vm.vsock_path
        assert uds is not None
        vm.run("vsock echo-server 5000 &")
        with vsock.PortServer(uds, 6000, vsock.echo):
            # A guest connection open across the snapshot (its reader waits).
            # (stdin a FIFO a sleeping writer holds open: no data, no end)
            vm.run(
                "mkfifo /dev/shm/idle; (vsock connect 2 6000 < /dev/shm/idle; "
                'echo "exit $?" > /dev/shm/held) & sleep 1000 > /dev/shm/idle &'
            )
            held = vsock.connect(uds, 5000)
            vm.snapshot("vbase", "full")
            # The running VM keeps its connections.
            assert vsock.echo_round_trip(held, b"still here") == hashlib.sha256(b"still here").hexdigest()
        assert vm.quit() == 0
        assert not uds.exists(), "the host socket is removed on exit"

    # Restored with a new socket (the Vm's own) and a new CID.
    with Vm.restore(
        cfg,
        "vbase",
        store=store,
        agent=True,
        extra=["--vsock-cid", "42"],
        log_path=tmp_path / "restore.log",
    ) as vm:
        uds2 = vm.vsock_path
        assert uds2 is not None
        # The transport reset dropped the guest's connection, and the guest
        # took the new CID.
        vm.run("i=0; until [ -e /dev/shm/held ] || [ $i -ge 600 ]; do i=$((i+1)); sleep 0.1; done", timeout=120)
        assert vm.run("cat /dev/shm/held") == "exit 1"
        assert vm.run("vsock cid") == "42"
        # The listener survived; new connections work at once, both ways.
        data = os.urandom(1 << 20)
        with vsock.connect(uds2, 5000, timeout=10) as s:
            assert vsock.echo_round_trip(s, data) == hashlib.sha256(data).hexdigest()
        with vsock.PortServer(uds2, 6000, vsock.echo):
            assert vm.run("echo ping | vsock connect 2 6000") == "ping"
        assert vm.quit() == 0

    # The device set must match the snapshot's.
    boot = cfg.argv("--restore", "vbase", "--store", str(store))
    r = subprocess.run(boot, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "has a vsock device (CID 3)" in r.stderr and "--vsock-uds" in r.stderr, r.stderr


def test_vsock_errors_are_clear(tmp_path, guest_disk, cfg):
    base = cfg.argv("--kernel", str(cfg.kernel), "--disk", str(guest_disk))
    for cid in ["2", "0", "4294967295", "x"]:
        r = subprocess.run(
            [*base, "--vsock-uds", str(tmp_path / "v.sock"), "--vsock-cid", cid],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and "--vsock-cid" in r.stderr, r.stderr
    r = subprocess.run([*base, "--vsock-cid", "5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--vsock-uds" in r.stderr, r.stderr
    # A path in use by a live listener, and a path that is not a socket.
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(str(tmp_path / "live.sock"))
        live.listen()
        r = subprocess.run(
            [*base, "--vsock-uds", str(tmp_path / "live.sock")], capture_output=True, text=True, timeout=60
        )
    assert r.returncode == 1 and "another process is listening on it" in r.stderr, r.stderr
    (tmp_path / "file").write_text("")
    r = subprocess.run([*base, "--vsock-uds", str(tmp_path / "file")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "not a socket" in r.stderr, r.stderr
