"""The guest agent on the real guest (Vm(agent=True): a vsock device and the VMM's readiness).

exec's exit codes, signals, stdin, timeout and pty mode; 16 MiB of binary stdout; 32 execs at
once; a 64 MiB file written and read back, checksummed; stat, list and errors; a guest HTTP
server reached from the host through expose (TCP and Unix socket); malformed and oversized
frames closing only their own connection; an agent killed in the guest reported, not hung
on, and respawned by init. Identity: two restores of one snapshot get two generation IDs and
machine IDs, and (as root, TAP interfaces on a bridge in a network namespace) the addresses
the host sends them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import socket
import struct
import threading
import time
import urllib.request

import pytest

from ignition import agent as ag
from ignition import loglines, net
from ignition.agent import AgentError
from ignition.control import ControlError
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 512
BIG_STDOUT = 16 << 20
BIG_FILE = 64 << 20
CONCURRENT = 32


@pytest.fixture
def vm(tmp_path, guest_disk, cfg):
    with Vm.boot(cfg, disk=guest_disk, mem=MEM, agent=True, log_path=tmp_path / "boot.log") as vm:
        status = vm.wait_ready()
        assert status["agent"] == "ready" and status["ready"], status
        yield vm


def test_exec_exit_codes_signals_stdin_timeout_and_pty(vm):
    r = vm.exec(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.stdout, r.stderr, r.exit_code, r.timed_out) == (b"out\n", b"err\n", 7, False)
    assert vm.exec(["true"]).exit_code == 0
    assert vm.exec(["false"]).exit_code == 1
    # Killed by a signal: -N.
    assert vm.exec(["sh", "-c", "kill -TERM $$"]).exit_code == -signal.SIGTERM
    # stdin, binary and larger than a frame.
    data = os.urandom(3 << 20)
    r = vm.exec(["sha256sum"], input=data)
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    # env and cwd.
    r = vm.exec(["sh", "-c", 'echo "$A:$PWD"'], env={"A": "b c"}, cwd="/tmp")
    assert r.stdout == b"b c:/tmp\n"
    # The exec's timeout kills the process group.
    r = vm.exec(["sh", "-c", "sleep 100; echo never"], timeout=1)
    assert (r.exit_code, r.timed_out, r.stdout) == (-signal.SIGKILL, True, b"")
    # A command that does not exist: the agent's error, with errno.
    with pytest.raises(AgentError) as e:
        vm.exec(["no-such-command"])
    assert e.value.code == 2
    # Streaming: output as it comes, a signal to a running command.
    with vm.exec_stream(["sh", "-c", "echo started; sleep 100"]) as ex:
        stream, first = next(iter(ex))
        assert (stream, first) == ("stdout", b"started\n")
        ex.signal(signal.SIGINT)
        done = ex.wait()
    assert done.exit_code == -signal.SIGINT
    # pty mode: a shell on a terminal of the asked size.
    with vm.exec_stream(["sh"], pty=(30, 100)) as ex:
        ex.send_stdin(b"stty size; tty; exit 3\n")
        done = ex.wait()
    assert done.exit_code == 3
    assert b"30 100" in done.stdout and b"/dev/pts/" in done.stdout, done.stdout
    # pty mode: the end of stdin is the terminal's end of file, after a whole line and after
    # a partial one (cat ends on it).
    for data in (b"whole line\n", b"partial"):
        with vm.exec_stream(["cat"], pty=(24, 80), timeout=vm.timeouts.cmd) as ex:
            ex.send_stdin(data)
            ex.close_stdin()
            done = ex.wait()
        assert done.exit_code == 0 and not done.timed_out, done
        assert done.stdout.replace(b"\r\n", b"\n").count(data.strip()) == 2, done.stdout  # echo and cat


def test_16_mib_of_binary_stdout_and_32_execs_at_once(vm):
    vm.exec(["sh", "-c", f"head -c {BIG_STDOUT} /dev/urandom > /tmp/big"], timeout=300).check()
    want = vm.exec(["sha256sum", "/tmp/big"]).check().stdout.split()[0].decode()
    r = vm.exec(["cat", "/tmp/big"], timeout=600)
    assert r.exit_code == 0 and len(r.stdout) == BIG_STDOUT
    assert hashlib.sha256(r.stdout).hexdigest() == want

    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            data = os.urandom(64 << 10)
            r = vm.exec(["sh", "-c", f"echo {i}; sha256sum; exit {i}"], input=data, timeout=600)
            assert r.exit_code == i, (i, r)
            lines = r.stdout.split(b"\n")
            assert lines[0] == str(i).encode() and lines[1].split()[0].decode() == hashlib.sha256(data).hexdigest()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(CONCURRENT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_files_64_mib_checksummed_atomic_with_mode_stat_and_list(vm):
    data = os.urandom(BIG_FILE)
    vm.write_file("/tmp/f", data, mode=0o640)
    assert vm.exec(["sha256sum", "/tmp/f"], timeout=300).stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    assert vm.read_file("/tmp/f") == data
    st = vm.agent.stat("/tmp/f")
    assert (st.size, st.mode & 0o7777, st.is_dir) == (BIG_FILE, 0o640, False)
    # A rewrite replaces the file whole; no temporary file is left.
    vm.write_file("/tmp/f", b"small", mode=0o600)
    assert vm.read_file("/tmp/f") == b"small"
    names = sorted(e.name for e in vm.agent.list("/tmp"))
    assert names == ["f"], names
    assert vm.agent.stat("/tmp").is_dir
    # Errors carry errno: no such file, a directory read as a file, a missing directory.
    for call, code in [
        (lambda: vm.read_file("/nope"), 2),
        (lambda: vm.read_file("/tmp"), 21),
        (lambda: vm.write_file("/nope/f", b"x"), 2),
        (lambda: vm.agent.list("/nope"), 2),
        (lambda: vm.agent.stat("/nope"), 2),
    ]:
        with pytest.raises(AgentError) as e:
            call()
        assert e.value.code == code, e.value
    # A read bounded by the caller.
    with pytest.raises(AgentError, match="exceeds"):
        vm.read_file("/tmp/f", max_bytes=2)


def test_expose_a_guest_http_server(vm):
    page = os.urandom(300_000)
    vm.exec(["mkdir", "-p", "/tmp/www"]).check()
    vm.write_file("/tmp/www/page", page)
    # busybox httpd on the guest's loopback only (it daemonizes).
    vm.exec(["httpd", "-p", "127.0.0.1:8080", "-h", "/tmp/www"]).check()
    with vm.expose(8080) as ex:
        host, port = ex.address
        for _ in range(3):
            with urllib.request.urlopen(f"http://{host}:{port}/page", timeout=60) as resp:
                assert resp.read() == page
    with vm.expose(8080, host="unix") as ex:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(ex.address)
            s.sendall(b"GET /page HTTP/1.0\r\n\r\n")
            got = b""
            while b := s.recv(1 << 16):
                got += b
        assert got.startswith(b"HTTP/1.") and got.endswith(page)
    # Nothing listens on a port: the agent's error (ECONNREFUSED).
    with pytest.raises(AgentError) as e:
        vm.agent.open_port(8081)
    assert e.value.code == 111


def test_malformed_frames_close_only_their_connection(vm):
    with vm.exec_stream(["sh", "-c", "read x; echo got $x"], stdin=True) as running:
        for bad in [
            b"\x07" + bytes(7),  # another protocol version
            ag.HEADER.pack(1, ag.INFO, 1, 0),  # reserved bits
            ag.HEADER.pack(1, 0x7F, 0, 0),  # unknown request
            ag.HEADER.pack(1, ag.EXEC, 0, ag.MAX_PAYLOAD + 1),  # oversized
            ag.frame(ag.EXEC, b"\x00" * 7),  # truncated payload
            ag.frame(ag.EXEC, struct.pack("<IIHHII", 0, 0, 0, 0, 1, 0) + struct.pack("<I", 99)),
        ]:
            with vm.agent.connect() as c:
                c.sock.sendall(bad)
                with pytest.raises(AgentError) as e:
                    c.recv("a bad request")
                assert e.value.code in (ag.BAD_REQUEST, ag.UNSUPPORTED), e.value
        # The exec in flight is untouched.
        running.send_stdin(b"on\n")
        assert running.wait().stdout == b"got on\n"
    assert vm.exec(["true"]).exit_code == 0


def test_an_agent_killed_in_the_guest_is_reported_and_respawned(vm):
    with vm.exec_stream(["sleep", "1000"]) as pending:
        # Kill every agent process: the listener, this exec's and the one asking.
        with pytest.raises(AgentError, match="closed the connection"):
            vm.exec(["sh", "-c", "kill -9 $(pidof ignition-agent)"])
        with pytest.raises(AgentError, match="closed the connection"):
            pending.wait()
    # init respawns it.
    vm.agent.wait_listening(vm.timeouts.cmd)
    assert vm.exec(["echo", "back"]).stdout == b"back\n"


def test_two_restores_of_one_snapshot_are_two_identities(tmp_path, guest_disk, cfg):
    store = tmp_path / "store"
    with Vm.boot(
        cfg, disk=guest_disk, mem=MEM, agent=True, store=store, name="golden", log_path=tmp_path / "golden.log"
    ) as vm:
        st = vm.wait_ready()
        golden = vm.agent.info()
        # A fresh boot's agent takes the boot's ID without rotating.
        assert (golden.generation, golden.generation_id) == (0, st["generation_id"])
        assert vm.read_file("/run/ignition/generation") == f"{golden.generation_id} 0\n".encode()
        assert len(golden.machine_id) == 32
        vm.snapshot("golden")
    clones = []
    for i in range(2):
        log = tmp_path / f"clone{i}.log"
        with Vm.restore(cfg, "golden", store=store, agent=True, log_path=log) as vm:
            st = vm.control().status()
            info = vm.agent.info()
            # The clone's agent rotated once, to the ID the VMM published through vmgenid.
            assert info.generation == 1 and info.generation_id == st["generation_id"] != golden.generation_id
            assert vm.read_file("/run/ignition/generation") == f"{info.generation_id} 1\n".encode()
            assert vm.read_file("/etc/machine-id") == f"{info.machine_id}\n".encode()
            assert info.machine_id != golden.machine_id and len(info.machine_id) == 32
            # The same kernel boot goes on in the clone.
            assert info.boot_id == golden.boot_id
            # The kernel's vmgenid driver reseeded its RNG from the same ID.
            assert b"crng reseeded due to virtual machine fork" in vm.exec(["dmesg"]).stdout
            vm.expect(loglines.AGENT_READY_TIME, "Agent-ready-time")
            clones.append(info)
    assert clones[0].generation_id != clones[1].generation_id
    assert clones[0].machine_id != clones[1].machine_id


def test_no_agent_asked_is_ready_when_the_vcpus_run(tmp_path, guest_disk, cfg):
    """--no-agent: the VMM does not contact port 1024 (a guest with another service there)."""
    uds = tmp_path / "v.sock"
    log = tmp_path / "boot.log"
    with Vm.boot(
        cfg, disk=guest_disk, mem=MEM, control=True, log_path=log, extra=["--vsock-uds", str(uds), "--no-agent"]
    ) as vm:
        st = vm.wait_ready()
        assert st["agent"] == "absent" and st["ready"]
        with vm.control() as c, pytest.raises(ControlError) as e:
            c.exec(["true"])
        assert e.value.code == "refused", e.value
        assert vm.quit() == 0
    assert "Agent-" not in log.read_text()


def agent_settles(vm: Vm) -> list[dict]:
    """The VM's statuses, polled until its agent is no longer waiting (boot's own timeout ends
    the wait)."""
    seen = []
    with vm.control() as c:
        while True:
            st = c.status()
            seen.append(st)
            if st["agent"] != "waiting":
                return seen
            assert vm.child.isalive(), "boot exited"
            time.sleep(0.1)


# A guest without the agent: the real guest with a shell for init (no inittab, so no agent).
NO_AGENT_CMDLINE = "console=ttyAMA0 root=/dev/vda rw rootwait boottimer=0x9100000 init=/bin/sh"


def test_a_guest_without_agent_needs_no_flag(tmp_path, guest_disk, cfg):
    """A fresh boot with a vsock device and no agent in the guest is ready when its vCPUs run;
    the agent is reported absent after --agent-timeout. A snapshot of it records that no
    agent answered: its restore is ready when the vCPUs run too."""
    store = tmp_path / "store"
    log = tmp_path / "boot.log"
    extra = ["--cmdline", NO_AGENT_CMDLINE, "--agent-timeout", "5"]
    with Vm.boot(cfg, disk=guest_disk, mem=MEM, agent=True, store=store, log_path=log, extra=extra) as vm:
        st = vm.wait_ready(agent=False)
        assert st["ready"] and st["agent"] in ("waiting", "absent"), st
        seen = agent_settles(vm)
        assert all(s["ready"] for s in seen), seen
        assert seen[-1]["agent"] == "absent" and seen[-1]["agent_error"] is None, seen[-1]
        vm.expect(loglines.AGENT_ABSENT, "Agent-absent")
        # Asking for the agent is an error, not a hang.
        with pytest.raises(AgentError, match="no guest agent"):
            vm.wait_ready()
        vm.snapshot("bare")
    assert "Agent-failed" not in log.read_text()
    with Vm.restore(
        cfg, "bare", store=store, agent=True, wait=False, log_path=tmp_path / "r.log", extra=["--agent-timeout", "5"]
    ) as vm:
        vm.wait_restored(prompt=False)
        st = vm.wait_ready(agent=False)
        assert st["ready"] and st["agent"] in ("waiting", "absent"), st
        seen = agent_settles(vm)
        assert all(s["ready"] for s in seen) and seen[-1]["agent"] == "absent", seen


# The guest agent's listener (its parent is init), stopped: it takes no connection.
STOP_AGENT = "for p in $(pidof ignition-agent); do [ $(cut -d' ' -f4 /proc/$p/stat) = 1 ] && kill -STOP $p; done"


def test_a_restore_waits_for_the_agent_its_snapshot_had(tmp_path, guest_disk, cfg):
    """A snapshot taken after its agent answered records it: its restore is not ready until
    the agent answers, and one whose agent cannot answer is reported failed (not hung on),
    the VM running on."""
    store = tmp_path / "store"
    with Vm.boot(cfg, disk=guest_disk, mem=MEM, agent=True, store=store, log_path=tmp_path / "g.log") as vm:
        vm.wait_ready()
        vm.run(STOP_AGENT)
        vm.snapshot("stopped")
    with Vm.restore(
        cfg,
        "stopped",
        store=store,
        agent=True,
        wait=False,
        log_path=tmp_path / "r.log",
        extra=["--agent-timeout", "15"],
    ) as vm:
        vm.wait_restored(prompt=False)
        seen = agent_settles(vm)
        assert not any(s["ready"] for s in seen), seen
        assert seen[-1]["agent"] == "failed" and "no answer within 15 s" in seen[-1]["agent_error"], seen[-1]
        assert seen[-1]["state"] == "running"
        vm.expect(loglines.AGENT_FAILED, "Agent-failed")
        with pytest.raises(AgentError, match="failed"):
            vm.wait_ready()


@pytest.fixture
def bridge(tmp_path, cfg):
    """A network namespace of this test's (root only) with a bridge br0 (10.0.3.1/24) and two
    TAP interfaces on it, tap0 and tap1; yields a VmConfig whose boot runs in it."""
    if not net.Bridge.available():
        pytest.skip("TAP interfaces on a bridge in a network namespace need root and iproute2")
    with net.Bridge(tmp_path, ("tap0", "tap1"), name=f"ignition-agent-{os.getpid()}") as b:
        yield b.name, dataclasses.replace(cfg, boot=b.wrap(cfg.boot))


def ping_bridge(vm: Vm) -> None:
    """The guest reaches the namespace's bridge (10.0.3.1) from its address, and back."""
    vm.exec(["ping", "-c", "1", "-w", "60", "10.0.3.1"], timeout=120).check()


def eth0_addresses(info: ag.Info) -> list[str]:
    return [a.split()[1] for a in info.addresses if a.startswith("eth0 ") and "." in a]


def test_clones_on_one_bridge_take_the_addresses_the_host_sends(tmp_path, guest_disk, bridge):
    _, cfg = bridge
    store = tmp_path / "store"
    with Vm.boot(
        cfg, disk=guest_disk, mem=MEM, agent=True, store=store, name="golden", extra=["--net", "tap:tap0"]
    ) as vm:
        vm.wait_ready()
        vm.exec(["ip", "addr", "add", "10.0.3.9/24", "dev", "eth0"]).check()
        ping_bridge(vm)
        vm.snapshot("golden")
    # Two clones at once, one per TAP interface, each given its address by the host.
    with Vm.restore(
        cfg,
        "golden",
        store=store,
        agent=True,
        log_path=tmp_path / "a.log",
        extra=["--net", "tap:tap0", "--agent-address", "10.0.3.2/24,10.0.3.1"],
    ) as a:
        info_a = a.agent.info()
        assert eth0_addresses(info_a) == ["10.0.3.2/24"], info_a.addresses
        assert b"default via 10.0.3.1" in a.exec(["ip", "route"]).stdout
        ping_bridge(a)
        with Vm.restore(
            cfg,
            "golden",
            store=store,
            agent=True,
            log_path=tmp_path / "b.log",
            extra=["--net", "tap:tap1", "--agent-address", "10.0.3.3/24"],
        ) as b:
            info_b = b.agent.info()
            assert eth0_addresses(info_b) == ["10.0.3.3/24"], info_b.addresses
            # The clones keep the snapshot's MAC (boot keeps it on a restore): the bridge
            # answers each at its own address as it last heard from it.
            ping_bridge(b)
            assert info_a.machine_id != info_b.machine_id
            assert info_a.generation_id != info_b.generation_id


def test_a_clone_asks_for_a_new_dhcp_lease(tmp_path, guest_disk, cfg):
    """Through passt (which leases one address): the clone's agent stops the snapshot's udhcpc
    and is bound to a new lease, asked for with the new machine ID as client identifier,
    before the VM is ready."""
    if net.passt_bin() is None:
        pytest.skip("passt not installed")
    store = tmp_path / "store"
    with (
        net.Passt(tmp_path, "golden.sock") as passt,
        Vm.boot(
            cfg,
            disk=guest_disk,
            mem=MEM,
            agent=True,
            store=store,
            name="golden",
            extra=["--net", f"stream:{passt.socket}"],
        ) as vm,
    ):
        vm.wait_ready()
        vm.run(net.LEASE_WAIT_CMD, timeout=120)
        old_dhcp = vm.read_file("/run/udhcpc.eth0.pid").strip()
        vm.snapshot("golden")
    with (
        net.Passt(tmp_path, "clone.sock") as passt,
        Vm.restore(
            cfg,
            "golden",
            store=store,
            agent=True,
            extra=["--net", f"stream:{passt.socket}"],
            log_path=tmp_path / "c.log",
        ) as vm,
    ):
        info = vm.agent.info()
        assert info.generation == 1
        assert len(eth0_addresses(info)) == 1, info.addresses
        new_dhcp = vm.read_file("/run/udhcpc.eth0.pid").strip()
        assert new_dhcp != old_dhcp
        args = vm.read_file(f"/proc/{new_dhcp.decode()}/cmdline").split(b"\0")
        assert f"0x3d:00{info.machine_id}".encode() in args, args
        assert vm.run(net.GATEWAY_CMD), "a default route from the new lease"
