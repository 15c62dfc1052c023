"""The control socket's `branch`, end to end (Vm.branch, `boot branch`).

A source VM (with the guest agent) writes known data to a tmpfs file (RAM) and to its disk,
then branches into children: every child is ready when the answer comes, sees the data, has
its own generation ID (the answer's, its status's and its agent's agree), machine ID and vsock
CID (the guest's own, as `vsock cid` reads it), answers on vsock, and writes to its own disk
without its siblings or the source seeing it (read back after dropping the guest's page cache,
so from the disk). The source runs on and its next snapshot is a diff on the branch layer; a
child branches in turn; `vmstore verify --all` passes. Refusals: a name that exists, a count of 0 or above the limit,
a source without --track-dirty. All or nothing: a child that cannot start fails the request
and no child of it runs. kill -9 of the source leaves its children running; kill -9 of the
source while the layer is being written leaves a valid store and no child; while its children
start, all of them or none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ignition import loglines, net
from ignition import store as vmstore
from ignition.branch import Child, pid_alive
from ignition.console import Drain
from ignition.control import ControlClient, ControlError
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

MEM = 256
RAM_FILE = "/mnt/ram/known"
DISK_FILE = "/root/known"
OWN_FILE = "/root/own"


def boot_source(cfg, disk, store, tmp_path, track_dirty=True, extra=()):
    vm = Vm.boot(
        cfg,
        disk=disk,
        mem=MEM,
        store=store,
        name="src",
        track_dirty=track_dirty,
        agent=True,
        extra=list(extra),
        log_path=tmp_path / "source.log",
    )
    try:
        vm.wait_ready()
    except BaseException:
        vm.terminate()
        raise
    return vm


def branch_processes(layer: str) -> list[int]:
    """Pids of `boot` processes restored as children of layer (by their --name)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--restore" in argv and b"--name" in argv:
            name = argv[argv.index(b"--name") + 1].decode()
            if name.startswith(f"{layer}-") and pid_alive(int(d.name)):
                found.append(int(d.name))
    return found


def run(c: Child | Vm, cmd: str) -> str:
    """`sh -c cmd` through the agent."""
    return c.run(cmd)


def verify_store(store: Path) -> None:
    r = vmstore.vmstore(store, "verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr


def thread_names(pid: int) -> list[str]:
    """The names (comm) of process pid's threads."""
    names = []
    for t in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that has ended
            names.append((t / "comm").read_text().strip())
    return names


def shared_code_kib(pid: int) -> int:
    """KiB of process pid's translation buffer (its one read-write-execute anonymous mapping,
    the emu backend's) that other processes map too."""
    kib, in_buffer = 0, False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            fields = line.split()
            in_buffer = fields[1] == "rwxp" and len(fields) == 5
        elif in_buffer and line.startswith(("Shared_Clean:", "Shared_Dirty:")):
            kib += int(line.split()[1])
    return kib


@pytest.mark.parametrize("start", ["fork", "exec"])
def test_children_see_the_data_have_their_own_identity_and_disk(cfg, disk, tmp_path, start):
    store = tmp_path / "store"
    children: list[Child] = []
    with boot_source(cfg, disk, store, tmp_path) as vm:
        try:
            run(vm, f"mkdir -p /mnt/ram && mount -t tmpfs ram /mnt/ram && echo in-ram > {RAM_FILE}")
            run(vm, f"echo on-disk > {DISK_FILE} && sync")
            source_id = vm.wait_ready()["generation_id"]
            source_machine = vm.agent.info().machine_id

            if start == "fork" and cfg.backend == "hvf":
                # A VM belongs to its process there: refused before anything is done.
                with pytest.raises(ControlError) as e:
                    vm.branch(1, name="b", start=start)
                assert e.value.code == "refused", e.value
                return
            children = vm.branch(3, name="b", start=start)
            answer = vm.branched
            assert answer is not None
            assert answer["layer"]["name"] == "b"
            assert answer["start"] == start
            for c in children:
                forked = re.search(loglines.RESTORE_SOURCE_FORK, c.log_path.read_text()) is not None
                assert forked == (start == "fork"), c.log_path.read_text()
                # Forks share the source's translated code (emu); a new process has its own.
                if cfg.backend in (None, "emu"):
                    assert (shared_code_kib(c.pid) > 1024) == (start == "fork"), shared_code_kib(c.pid)
                if Path("/proc/self/task").is_dir():
                    # A fork's main thread is named as exec names a started one's (the
                    # executable's file name, 15 bytes), not after the thread that forked it:
                    # one vcpu0 (the source has one vCPU).
                    names = thread_names(c.pid)
                    assert names.count("vcpu0") == 1, names
                    assert Path(f"/proc/{c.pid}/comm").read_text().strip() == cfg.boot.resolve().name[:15], names
            assert [c.name for c in children] == ["b-1", "b-2", "b-3"]
            assert Path(str(answer["dir"])) == vm.control_path.parent / "b"
            ids, cids, machines = set(), set(), set()
            for c in children:
                assert c.alive()
                for p in (c.control_path, c.console_path, c.vsock_path):
                    assert p is not None and p.parent == Path(str(answer["dir"]))
                assert c.log_path.exists() and int(c.pid_file.read_text()) == c.pid
                st = c.status()
                assert st["ready"] and st["restored_from"] == "b" and st["parent"] == "b", st
                assert st["generation_id"] == c.generation_id
                info = c.agent.wait_listening(c.timeouts.cmd)
                assert info.generation_id == c.generation_id
                # The guest's own CID is the answer's (the transport was reset to it).
                assert run(c, "vsock cid") == str(c.cid)
                ids.add(c.generation_id)
                cids.add(c.cid)
                machines.add(info.machine_id)
                # The source's RAM and disk, as they were at the branch.
                assert run(c, f"cat {RAM_FILE}") == "in-ram"
                assert run(c, f"cat {DISK_FILE}") == "on-disk"
            assert len(ids) == 3 and source_id not in ids
            assert len(cids) == 3 and None not in cids and int(run(vm, "vsock cid")) not in cids
            assert len(machines) == 3 and source_machine not in machines

            # Each writes its own disk; the page cache dropped, each reads back its own.
            for c in children:
                run(c, f"echo {c.name} > {OWN_FILE} && sync")
            run(vm, f"echo source > {OWN_FILE} && sync")
            for c in children:
                assert run(c, f"echo 3 > /proc/sys/vm/drop_caches; cat {OWN_FILE}") == c.name
            assert run(vm, f"echo 3 > /proc/sys/vm/drop_caches; cat {OWN_FILE}") == "source"

            # The source runs on; its next snapshot is a diff on the branch layer.
            assert run(vm, "echo alive") == "alive"
            assert vm.wait_ready()["parent"] == "b"
            after = vm.snapshot("src-after")
            assert after.kind == "diff"
            # A child's own snapshot is a diff on the branch layer too.
            with children[0].control() as ctl:
                own = ctl.snapshot()
            assert (own["name"], own["kind"]) == ("b-1", "diff")
            # A child branches in turn: its child has the child's RAM and disk.
            with children[0].control() as ctl:
                ctl.sock.settimeout(None)
                answer = ctl.branch(1, "b-1-b", None, start)
            grand = Child.from_answer(answer["children"][0], vm.timeouts)
            children.append(grand)
            assert grand.name == "b-1-b-1" and grand.status()["restored_from"] == "b-1-b"
            forked = re.search(loglines.RESTORE_SOURCE_FORK, grand.log_path.read_text()) is not None
            assert forked == (start == "fork"), grand.log_path.read_text()
            assert run(grand, f"cat {RAM_FILE}; cat {OWN_FILE}") == "in-ram\nb-1"
            verify_store(store)
            tree = vmstore.vmstore(store, "tree").stdout
            for name in ("b", "b-1", "b-1-b", "src-after"):
                assert name in tree, tree

            # Refusals, each before anything is done.
            with vm.control() as ctl:
                refusals = [(2, "b", "exists"), (2, "b-1", "exists"), (0, "c", "bad_count"), (65, "c", "bad_count")]
                for count, name, code in refusals:
                    with pytest.raises(ControlError) as e:
                        ctl.branch(count, name)
                    assert e.value.code == code, e.value
                r = ctl.raw(json.dumps({"command": "branch", "name": "c"}).encode())
                assert r["error"]["code"] == "bad_request", r
                r = ctl.raw(json.dumps({"command": "branch", "name": "c", "count": 1, "start": "clone"}).encode())
                assert r["error"]["code"] == "bad_request", r
            assert "c" not in vmstore.layer_names(store)

            # kill -9 of the source: its children run on and answer.
            vm.kill(signal.SIGKILL)
            for c in children:
                assert c.alive()
                assert run(c, "echo still") == "still"
                assert c.status()["ready"]
        finally:
            for c in children:
                c.stop()
    for c in children:
        assert not c.alive()
        # A child's end removes its sockets and pid file.
        assert not c.control_path.exists() and not c.pid_file.exists()
    verify_store(store)


@pytest.mark.skipif(net.passt_bin() is None, reason="passt is Linux-only")
def test_children_of_a_passt_source_have_their_own_passt_and_mac(cfg, disk, tmp_path):
    store = tmp_path / "store"
    children: list[Child] = []
    page = os.urandom(50_000)
    with (
        net.LoopbackHttp() as http,
        boot_source(cfg, disk, store, tmp_path, extra=["--net", "passt"]) as vm,
    ):
        page_sum = http.add("page", page)
        try:
            run(vm, net.LEASE_WAIT_CMD)
            source_mac = run(vm, "cat /sys/class/net/eth0/address")
            source_passt = net.passt_pids(vm.pid)
            assert len(source_passt) == 1, source_passt
            children = vm.branch(2, name="n")
            macs = set()
            for c in children:
                assert c.net == "passt" and c.mac is not None, c
                # The guest's eth0 has the MAC the answer gives (its driver read it again).
                assert run(c, "cat /sys/class/net/eth0/address") == c.mac
                macs.add(c.mac)
                # A passt of its own, through which it reaches the host.
                assert len(net.passt_pids(c.pid)) == 1
                run(c, net.LEASE_WAIT_CMD)
                gw = run(c, net.GATEWAY_CMD)
                got = run(c, f"timeout 60 wget -q -O - http://{gw}:{http.port}/page | sha256sum")
                assert got.split()[0] == page_sum, c.name
            assert len(macs) == 2 and source_mac not in macs
            # The source keeps its MAC and its network.
            assert run(vm, "cat /sys/class/net/eth0/address") == source_mac
            gw = run(vm, net.GATEWAY_CMD)
            got = run(vm, f"timeout 60 wget -q -O - http://{gw}:{http.port}/page | sha256sum")
            assert got.split()[0] == page_sum
            passts = [p for c in children for p in net.passt_pids(c.pid)]
        finally:
            for c in children:
                c.stop()
    # A child's passt ends with it; the source's with the source.
    assert not any(pid_alive(p) for p in passts + source_passt)
    verify_store(store)


MARK_ENV = "IGNITION_TEST_BRANCH_MARK"


def marked_processes(mark: str) -> dict[int, str]:
    """Pid -> comm of every live process whose environment has MARK_ENV=mark: a source started
    with it, its children and their passts (each inherits its parent's environment), orphans
    included."""
    want = f"{MARK_ENV}={mark}".encode()
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            environ = (d / "environ").read_bytes().split(b"\0")
            comm = (d / "comm").read_text().strip()
        except OSError:
            continue
        if want in environ and int(d.name) != os.getpid() and pid_alive(int(d.name)):
            found[int(d.name)] = comm
    return found


def wait_until(cond, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.skipif(net.passt_bin() is None, reason="passt is Linux-only")
def test_killed_children_and_sources_on_passt_leave_no_process(cfg, disk, tmp_path, monkeypatch):
    """kill -9 of a child on passt: its passt ends too, its sibling runs on, and its stale
    sockets do not keep a VM from listening there again. kill -9 of a source on passt while
    its children start: no `boot` and no passt of that request is left, only the children of
    the earlier, answered branch (until they are stopped)."""
    mark = os.urandom(8).hex()
    monkeypatch.setenv(MARK_ENV, mark)
    store = tmp_path / "store"
    with boot_source(cfg, disk, store, tmp_path, extra=["--net", "passt"]) as vm:
        assert vm.control_path is not None
        children = vm.branch(2, name="n")
        try:
            passts = {c.name: net.passt_pids(c.pid) for c in children}
            assert all(len(p) == 1 for p in passts.values()), passts
            first, second = children
            first.kill(signal.SIGKILL)
            wait_until(lambda: not pid_alive(passts[first.name][0]), "the killed child's passt did not end")
            assert second.alive() and all(pid_alive(p) for p in passts[second.name])
            assert run(second, "echo still") == "still"
            # Its sockets are left behind, stale: a VM listens on them again.
            assert first.control_path.exists() and first.vsock_path is not None
            argv = ["--restore", "n", "--store", str(store), "--name", "n-1-again", "--net", "passt"]
            argv += ["--control", str(first.control_path), "--console", f"socket:{first.console_path}"]
            argv += ["--vsock-uds", str(first.vsock_path), "--vsock-cid", str(first.cid)]
            argv += ["--pid-file", str(first.pid_file), "--log-file", str(tmp_path / "again.log"), "--daemonize"]
            again = subprocess.run(cfg.argv(*argv), capture_output=True, text=True, timeout=300)
            assert again.returncode == 0, again.stderr
            relisted = dataclasses.replace(first, name="n-1-again", pid=int(first.pid_file.read_text()))
            wait_until(lambda: relisted.status()["ready"], "the restore on the stale sockets is not ready")
            assert run(relisted, "echo again") == "again"
            relisted.stop()

            # kill -9 of the source while the children of a second branch start.
            bdir = vm.control_path.parent / "k"

            answered: list[list[Child]] = []

            def ask() -> None:
                with contextlib.suppress(OSError, ControlError):  # expected once the source is killed
                    answered.append(vm.branch(3, "k"))

            t = threading.Thread(target=ask)
            t.start()
            wait_until(lambda: list(bdir.glob("*.pid")), "no child of the second branch started")
            os.kill(vm.pid, signal.SIGKILL)
            t.join(120)
            vm.wait_exit()
            # All of the second branch's children or none (the guard pipes); the first
            # branch's survivor and its passt run on; nothing else of this test's remains.
            survivors = {second.pid, *passts[second.name]}
            for c in answered[0] if answered else []:
                survivors |= {c.pid, *net.passt_pids(c.pid)}
            wait_until(lambda: set(marked_processes(mark)) <= survivors, f"left: {marked_processes(mark)}")
        finally:
            for c in children:
                c.stop()
            for p in branch_processes("k"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGTERM)
    wait_until(lambda: not marked_processes(mark), f"left after the end: {marked_processes(mark)}")
    verify_store(store)


@pytest.mark.skipif(net.passt_bin() is None, reason="passt is Linux-only")
def test_a_source_on_a_shared_network_end_is_refused(cfg, disk, tmp_path):
    store = tmp_path / "store"
    with (
        net.Passt(tmp_path) as passt,
        boot_source(cfg, disk, store, tmp_path, extra=["--net", f"stream:{passt.socket}"]) as vm,
    ):
        with vm.control() as ctl, pytest.raises(ControlError) as e:
            ctl.branch(2, "s")
        assert e.value.code == "refused", e.value
        assert f"--net stream:{passt.socket}" in str(e.value) and "--net passt" in str(e.value), e.value
        # Refused before the layer: no snapshot was written.
        assert not store.exists() or "s" not in vmstore.layer_names(store)


@pytest.fixture
def bridge(tmp_path, cfg):
    """A network namespace of this test's (root only) with a bridge br0 (10.0.3.1/24) and
    TAP interfaces on it: tap0 for the source, vm1 and vm2 for its children; yields a
    VmConfig whose boot runs in it (and so do the children the source starts)."""
    if not net.Bridge.available():
        pytest.skip("TAP interfaces on a bridge in a network namespace need root and iproute2")
    with net.Bridge(tmp_path, ("tap0", "vm1", "vm2"), name=f"ignition-branch-{os.getpid()}") as b:
        yield dataclasses.replace(cfg, boot=b.wrap(cfg.boot))


def test_children_on_tap_interfaces_of_a_bridge_lease_their_own_address(cfg, disk, tmp_path, bridge):
    store = tmp_path / "store"
    children: list[Child] = []
    with boot_source(bridge, disk, store, tmp_path, extra=["--net", "tap:tap0"]) as vm:
        try:
            # The source serves DHCP on the bridge from a fixed address.
            source_mac = net.serve_dhcp_on_bridge(vm)
            # Without a template, the source's TAP interface is refused.
            with vm.control() as ctl, pytest.raises(ControlError) as e:
                ctl.branch(2, "refused")
            assert e.value.code == "refused" and "tap:vm{i}" in e.value.message, e.value

            children = vm.branch(2, name="t", net="tap:vm{i}")
            assert [c.net for c in children] == ["tap:vm1", "tap:vm2"]
            # Ready: each agent asked for a lease with its child's own MAC.
            net.check_bridge_children(children, source_mac)
        finally:
            for c in children:
                c.stop()
    verify_store(store)


def test_boot_branch_prints_the_children_and_its_limit_is_configurable(cfg, disk, tmp_path):
    store = tmp_path / "store"
    with boot_source(cfg, disk, store, tmp_path, extra=["--branch-limit", "2"]) as vm:
        assert vm.control_path is not None
        argv = [str(cfg.boot), "branch", "--control", str(vm.control_path)]
        r = subprocess.run([*argv, "--count", "3", "--name", "x"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "bad_count" in r.stderr and "1 to 2 children" in r.stderr, r.stderr
        r = subprocess.run([*argv, "--count", "2", "--name", "x", "--json"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        answer = json.loads(r.stdout)
        vm.children += [Child.from_answer(c) for c in answer["children"]]
        assert [c["name"] for c in answer["children"]] == ["x-1", "x-2"]
        r = subprocess.run([*argv, "--count", "1", "--name", "y", "--start", "clone"], capture_output=True, text=True)
        assert r.returncode == 2 and "--start" in r.stderr, r.stderr
        r = subprocess.run([*argv, "--count", "1", "--name", "y", "--start", "exec"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "children (exec) ready in" in r.stdout.splitlines()[0], r.stdout
        rows = [line.split("\t") for line in r.stdout.splitlines()[1:]]
        assert rows[0][:1] == ["NAME"] and rows[1][0] == "y-1", r.stdout
        name, pid, cid, mac, control, console, vsock, log = rows[1]
        assert mac == "-", r.stdout
        row = {"name": name, "pid": int(pid), "cid": int(cid), "control": control, "console": console}
        row |= {"vsock": vsock, "log": log, "pid_file": str(Path(log).with_suffix(".pid")), "generation_id": None}
        vm.children.append(Child.from_answer(row))
        assert all(c.alive() for c in vm.children)
        # y is a diff on x: repeated branches of one source form a chain.
        assert "y" in vmstore.vmstore(store, "tree").stdout
    # Vm's end stops the children it knows.
    assert all(not c.alive() for c in vm.children)


def test_a_source_without_track_dirty_is_refused(cfg, disk, tmp_path):
    store = tmp_path / "store"
    with boot_source(cfg, disk, store, tmp_path, track_dirty=False) as vm:
        with vm.control() as ctl, pytest.raises(ControlError) as e:
            ctl.branch(2, "b")
        assert e.value.code == "needs_track_dirty", e.value
    assert not store.exists() or vmstore.layer_names(store) == []


def test_a_child_that_cannot_start_fails_the_request_and_no_child_runs(cfg, disk, tmp_path, monkeypatch):
    store = tmp_path / "store"
    monkeypatch.setenv("IGNITION_TEST_BRANCH_FAIL_CHILD", "f-2")
    with boot_source(cfg, disk, store, tmp_path) as vm:
        with pytest.raises(ControlError) as e:
            vm.branch(3, "f")
        assert e.value.code == "branch_failed", e.value
        assert "'f-2'" in e.value.message and "every child was stopped" in e.value.message, e.value
        assert branch_processes("f") == []
        # The layer stays, valid; the source runs on and branches again.
        assert "f" in vmstore.layer_names(store)
        verify_store(store)
        children = vm.branch(1, "g")
        assert run(children[0], "echo ok") == "ok"
    assert branch_processes("g") == []


def test_killing_the_source_mid_branch_leaves_a_valid_store_and_no_child(cfg, disk, tmp_path, monkeypatch):
    store = tmp_path / "store"
    gate = tmp_path / "gate"
    monkeypatch.setenv("IGNITION_TEST_SNAPSHOT_GATE", str(gate))
    with boot_source(cfg, disk, store, tmp_path) as vm:
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                vm.branch(2, "k")
            except BaseException as e:  # noqa: BLE001 - the source dies under it
                errors.append(e)

        t = threading.Thread(target=ask)
        t.start()
        # The writer waits at the gate with the layer half written.
        with vm.control() as ctl:
            deadline = time.monotonic() + 60
            while not ctl.status()["snapshot_in_progress"]:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        vm.kill(signal.SIGKILL)
        t.join(60)
        assert not t.is_alive() and errors
    assert branch_processes("k") == []
    # Killed before the layer's first file: no store yet; else no layer `k`, and a valid store.
    if store.exists():
        assert "k" not in vmstore.layer_names(store)
        vmstore.vmstore(store, "gc")
        verify_store(store)


def test_killing_the_source_while_its_children_start_leaves_all_of_them_or_none(cfg, disk, tmp_path):
    """The children's guard pipes: a source that dies before its answer takes the children
    it started with it. If the branch was answered first (all ready, committed), all of
    them run on; either way, never some."""
    store = tmp_path / "store"
    with boot_source(cfg, disk, store, tmp_path) as vm:
        assert vm.control_path is not None
        bdir = vm.control_path.parent / "h"
        answered: list[object] = []
        errors: list[BaseException] = []

        def ask() -> None:
            try:
                answered.append(vm.branch(3, "h"))
            except (OSError, ControlError) as e:  # expected once the source is killed
                errors.append(e)

        t = threading.Thread(target=ask)
        t.start()
        deadline = time.monotonic() + 120
        while not list(bdir.glob("*.pid")):
            assert time.monotonic() < deadline and t.is_alive(), f"the branch ended first: {errors}"
            time.sleep(0.002)
        os.kill(vm.pid, signal.SIGKILL)
        t.join(60)
        vm.wait_exit()
        if answered:
            assert len(branch_processes("h")) == 3
        else:
            deadline = time.monotonic() + 120
            while branch_processes("h"):
                assert time.monotonic() < deadline, branch_processes("h")
                time.sleep(0.1)
            logs = [p.read_text() for p in bdir.glob("*.log")]
            assert any("before it completed: quitting" in log for log in logs), logs
    assert "h" in vmstore.layer_names(store)
    verify_store(store)


def test_forks_made_while_threads_of_the_source_start_and_end_all_come_up(cfg, disk, tmp_path):
    """A fork copies the whole process while other threads of the source run: one that was
    starting or ending a thread (a control-socket client's, here a stream of them) must not
    leave a lock held in the children (each child starts threads of its own). Each request
    must bring its children up; one that hangs is stopped at --branch-timeout and fails."""
    store = tmp_path / "store"
    stop = threading.Event()
    with boot_source(cfg, disk, store, tmp_path, extra=["--branch-timeout", "120"]) as vm:
        assert vm.control_path is not None
        path = vm.control_path
        # Its console read all along: its messages would fill the pty and stop its writer.
        drain = Drain(vm.child)

        def churn() -> None:
            while not stop.is_set():
                with contextlib.suppress(OSError, ControlError), ControlClient(path, timeout=10) as c:
                    c.status()

        threads = [threading.Thread(target=churn, daemon=True) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            for i in range(10):
                children = vm.branch(2, name=f"f{i}")
                assert all(c.status()["ready"] for c in children)
                for c in children:
                    c.stop()
        finally:
            stop.set()
            for t in threads:
                t.join()
            drain.close()
