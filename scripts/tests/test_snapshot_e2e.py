"""End-to-end snapshots on the real guest: Ctrl-A s, diff chains, restore.

The guest is driven through its agent (vm.run); Ctrl-A s and the snapshot's lines stay on
the console, whose escapes take snapshots.

golden (full) -> d1 -> d2 -> d3 (diffs), each diff made by restoring its parent
with --track-dirty and writing a file of known content into /dev/shm. Then
restores of golden+3 and d1 are checked, the disk's state at the snapshot
instant, a process surviving restore, refusals on a damaged store, and a
2-vCPU guest through a full and a diff snapshot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from ignition import loglines
from ignition import store as vmstore
from ignition.guest import cpu_busy_ticks
from ignition.vm import CTRL_A, Vm

pytestmark = pytest.mark.e2e

MEM = 256


def fresh_copy(chain, tmp_path) -> Path:
    """A private copy of the chain's store (replacing an earlier copy), for
    tests that change or damage it."""
    src, _ = chain
    store = tmp_path / "store"
    if store.exists():
        shutil.rmtree(store)
    shutil.copytree(src, store)
    return store


@pytest.fixture(scope="module")
def chain(tmp_path_factory, guest_out, cfg):
    """Builds golden -> d1 -> d2 -> d3 once; returns (store, facts)."""
    tmp = tmp_path_factory.mktemp("chain")
    store = tmp / "store"
    disk = tmp / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    facts: dict[str, Any] = {"sums": {}, "pages": {}}

    with Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="golden", agent=True, log_path=tmp / "golden.log"
    ) as vm:
        vm.wait_ready()
        facts["pid"] = vm.run("sleep 100000 >/dev/null 2>&1 & echo $!")
        vm.run("echo before-snapshot > /root/golden.txt && sync")
        facts["pages"]["golden"] = vm.snapshot("golden", "full").pages
        vm.run("echo after-snapshot > /root/after.txt && sync")
        assert vm.quit() == 0

    parent = "golden"
    for n in (1, 2, 3):
        name = f"d{n}"
        with Vm.restore(
            cfg, parent, store=store, track_dirty=True, name=name, agent=True, log_path=tmp / f"{name}.log"
        ) as vm:
            vm.run(f"dd if=/dev/urandom of=/dev/shm/{name} bs=64k count=32 2>/dev/null")
            facts["sums"][name] = vm.run(f"sha256sum /dev/shm/{name}").split()[0]
            facts["pages"][name] = vm.snapshot(name, "diff").pages
            assert vm.quit() == 0
        parent = name
    return store, facts


def test_chain_restores_every_layer(chain, cfg, tmp_path):
    store, facts = chain
    with Vm.restore(cfg, "golden+3", store=store, agent=True, log_path=tmp_path / "g3.log") as vm:
        for name, digest in facts["sums"].items():
            assert vm.run(f"sha256sum /dev/shm/{name}").split()[0] == digest
        # A process started before the golden snapshot still runs.
        assert vm.run(f"kill -0 {facts['pid']} && echo alive") == "alive"
        assert vm.run("uname -m") == "aarch64"
        assert vm.quit() == 0

    with Vm.restore(cfg, "d1", store=store, agent=True, log_path=tmp_path / "d1.log") as vm:
        assert vm.run("sha256sum /dev/shm/d1").split()[0] == facts["sums"]["d1"]
        assert vm.run("ls /dev/shm").split() == ["d1"]
        assert vm.quit() == 0


def test_diffs_hold_the_dirtied_pages_not_the_ram(chain):
    # The full layer holds only pages written since boot, so it is small too;
    # a diff holds the 2 MiB written into /dev/shm plus what the kernel touched
    # meanwhile (an amount that depends on guest time, so bounded loosely).
    store, facts = chain
    ram_bytes = MEM << 20
    page_size = json.loads((store / "golden" / "manifest.json").read_text())["page_size"]
    written_pages = (2 << 20) // page_size
    for name in ("d1", "d2", "d3"):
        diff = (store / name / "memory.bin").stat().st_size
        assert diff * 16 < ram_bytes, f"{name}: diff {diff} bytes vs {ram_bytes} bytes of RAM"
        assert written_pages <= facts["pages"][name], facts["pages"]
        assert facts["pages"][name] * 2 < facts["pages"]["golden"], facts["pages"]


def test_disk_is_captured_at_the_snapshot_instant(chain, cfg, tmp_path):
    store, _ = chain
    with Vm.restore(cfg, "golden", store=store, agent=True, log_path=tmp_path / "disk.log") as vm:
        assert vm.run("cat /root/golden.txt") == "before-snapshot"
        status, _ = vm.run_status("test -e /root/after.txt")
        assert status != 0, "a file written after the snapshot must not be in it"
        assert vm.quit() == 0


def test_second_snapshot_in_one_run_is_a_suffixed_diff(chain, cfg, tmp_path):
    store = fresh_copy(chain, tmp_path)
    with Vm.restore(cfg, "d1", store=store, track_dirty=True, name="e", agent=True, log_path=tmp_path / "e.log") as vm:
        vm.run("echo one > /dev/shm/e1")
        vm.snapshot("e", "diff")
        vm.run("echo two > /dev/shm/e2")
        vm.snapshot("e.2", "diff")
        assert vm.quit() == 0
    with Vm.restore(cfg, "e.2", store=store, agent=True, log_path=tmp_path / "e2.log") as vm:
        assert vm.run("cat /dev/shm/e1 /dev/shm/e2") == "one\ntwo"
        assert vm.quit() == 0


def refused(cfg, store, spec):
    return subprocess.run(
        cfg.argv("--store", str(store), "--restore", spec),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_damaged_store_is_refused_and_left_unchanged(chain, cfg, tmp_path):
    store = fresh_copy(chain, tmp_path)
    mem = store / "d2" / "memory.bin"
    os.chmod(mem, 0o644)
    data = bytearray(mem.read_bytes())
    data[len(data) // 2] ^= 0x01
    mem.write_bytes(data)
    before = vmstore.digest(store)
    r = refused(cfg, store, "golden+3")
    assert r.returncode != 0 and "d2" in r.stderr and "memory.bin" in r.stderr, r.stderr
    assert vmstore.digest(store) == before, "a refused restore must not change the store"

    store = fresh_copy(chain, tmp_path)
    shutil.rmtree(store / "d1")
    r = refused(cfg, store, "d3")
    assert r.returncode != 0 and "d1" in r.stderr, r.stderr

    store = fresh_copy(chain, tmp_path)
    (store / "d3" / "state.bin").unlink()
    r = refused(cfg, store, "d3")
    assert r.returncode != 0 and "state.bin" in r.stderr, r.stderr


def test_a_state_from_another_backend_is_refused(chain, cfg, tmp_path):
    """A layer whose manifest names this backend but whose machine state names the other (both
    sealed by the manifest, so it verifies) is refused at restore, naming both."""
    import vmstore as store_py  # the store's Python module

    store = fresh_copy(chain, tmp_path)
    golden = store / "golden"
    m = json.loads((golden / "manifest.json").read_text())
    state = json.loads((golden / "state.bin").read_bytes()[56:])  # after the 56-byte header
    backend = m["backend"]
    assert state["backend"] == backend
    other = "hvf" if backend == "emu" else "emu"
    state["backend"] = other
    store_py.Store(store).write_full(
        "forged",
        (golden / "memory.bin").read_bytes(),
        json.dumps(state).encode(),
        disk=golden / "disk.img",
        page_size=m["page_size"],
        ram_base_gpa=m["ram_base_gpa"],
        vcpus=m["vcpus"],
        backend=backend,
        gic_mode=m["gic_mode"],
    )
    r = refused(cfg, store, "forged")
    assert r.returncode != 0, r.stderr
    assert f"written by the {other} backend, but the manifest says {backend}" in r.stderr, r.stderr


def test_snapshot_names_are_checked(chain, boot_bin, guest_out):
    store, _ = chain
    # An existing name is refused before anything runs; nothing is overwritten.
    r = subprocess.run(
        [str(boot_bin), "--store", str(store), "--restore", "d1", "--name", "d2"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode != 0 and "d2" in r.stderr and "exists" in r.stderr, r.stderr
    r = subprocess.run(
        [
            str(boot_bin),
            "--store",
            str(store),
            "--name",
            "golden",
            "--kernel",
            str(guest_out / "Image"),
            "--disk",
            str(guest_out / "rootfs.ext4"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode != 0 and "golden" in r.stderr and "exists" in r.stderr, r.stderr
    r = subprocess.run(
        [str(boot_bin), "--store", str(store), "--restore", "d1", "--name", "bad+name"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode != 0 and "name" in r.stderr, r.stderr


def test_failed_snapshot_keeps_dirty_pages_for_the_next(chain, cfg, tmp_path):
    """Dirty state is cleared only after a layer is durable: a snapshot that
    fails leaves every page dirtied before it in the next diff."""
    store = fresh_copy(chain, tmp_path)
    with Vm.restore(
        cfg, "golden", store=store, track_dirty=True, name="x", agent=True, log_path=tmp_path / "x.log"
    ) as vm:
        vm.run("dd if=/dev/urandom of=/dev/shm/a bs=64k count=16 2>/dev/null")
        sum_a = vm.run("sha256sum /dev/shm/a").split()[0]
        (store / "x").mkdir()  # the name is taken: this Ctrl-A s must fail
        vm.send(CTRL_A + "s")
        vm.expect(loglines.snapshot_failed("x"), "the refusal")
        (store / "x").rmdir()
        vm.run("echo b > /dev/shm/b")
        vm.snapshot("x", "diff")
        assert vm.quit() == 0
    with Vm.restore(cfg, "x", store=store, agent=True, log_path=tmp_path / "x2.log") as vm:
        assert vm.run("sha256sum /dev/shm/a").split()[0] == sum_a
        assert vm.run("cat /dev/shm/b") == "b"
        assert vm.quit() == 0


def test_disk_diff_hashes_only_written_chunks(chain, cfg, tmp_path):
    """A diff after the guest writes a small file to its root disk stores and
    hashes a few 256 KiB chunks (disk.diff), not the whole disk; its restore
    has the file."""
    store = fresh_copy(chain, tmp_path)
    with Vm.restore(
        cfg, "golden", store=store, track_dirty=True, name="w", agent=True, log_path=tmp_path / "w.log"
    ) as vm:
        vm.run("echo chunked > /root/small.txt && sync")
        disk = vm.snapshot("w", "diff").disk
        assert vm.quit() == 0
    hashed, chunks = disk.chunks_hashed, disk.chunks
    disk_size = (store / "golden" / "disk.img").stat().st_size
    assert chunks == -(-disk_size // (256 << 10))
    assert 0 < hashed < chunks // 4, f"{hashed} of {chunks} chunks hashed"
    assert disk.method == "disk diff"
    manifest = json.loads((store / "w" / "manifest.json").read_text())
    assert manifest["format"] == {"major": 3, "minor": 1}
    assert manifest["disk"]["diff_chunks"] == hashed
    assert not (store / "w" / "disk.img").exists()
    assert (store / "w" / "disk.diff").stat().st_size == (64 << 10) + hashed * (256 << 10)
    with Vm.restore(cfg, "w", store=store, agent=True, log_path=tmp_path / "w2.log") as vm:
        assert vm.run("cat /root/small.txt") == "chunked"
        assert vm.quit() == 0


def test_restores_of_one_layer_run_on_overlays_that_never_share_writes(chain, cfg, tmp_path):
    """Two VMs restored from one layer at once each write their own file to the root
    disk: neither sees the other's, the layer's image is unchanged, nothing of the disk
    was copied to start them (each overlay holds only the chunks its guest wrote), and
    a later restore sees neither file."""
    store = fresh_copy(chain, tmp_path)
    image = store / "golden" / "disk.img"
    before = (image.read_bytes(), image.stat().st_mtime_ns, image.stat().st_ctime_ns)
    a = Vm.restore(cfg, "golden", store=store, agent=True, log_path=tmp_path / "a.log")
    try:
        b = Vm.restore(cfg, "golden", store=store, agent=True, log_path=tmp_path / "b.log")
        try:
            assert a.restored is not None and a.restored.disk_layers == 1
            overlays = sorted(store.glob(".tmp-run-*/disk.overlay"))
            assert len(overlays) == 2, overlays
            for vm, me in ((a, "a"), (b, "b")):
                vm.run(f"echo {me} > /root/{me}.txt && sync")
            for vm, me, other in ((a, "a", "b"), (b, "b", "a")):
                assert vm.run(f"cat /root/{me}.txt") == me
                status, _ = vm.run_status(f"test -e /root/{other}.txt")
                assert status != 0, f"{me} sees {other}'s file"
            for o in overlays:
                st = o.stat()
                assert st.st_size == len(before[0])
                # The chunks the guest wrote (a file, its directory, the journal), not the disk.
                assert st.st_blocks * 512 < len(before[0]) // 4, f"{o}: {st.st_blocks * 512} bytes"
            assert b.quit() == 0
        finally:
            b.terminate()
        assert a.quit() == 0
    finally:
        a.terminate()
    assert not list(store.glob(".tmp-run-*")), "the overlays are removed at exit"
    assert (image.read_bytes(), image.stat().st_mtime_ns, image.stat().st_ctime_ns) == before
    with Vm.restore(cfg, "golden", store=store, agent=True, log_path=tmp_path / "c.log") as vm:
        status, _ = vm.run_status("test -e /root/a.txt || test -e /root/b.txt")
        assert status != 0
        assert vm.quit() == 0
    r = vmstore.vmstore(store, "verify", "--all")
    assert r.returncode == 0, r.stdout + r.stderr


def test_two_vcpus_snapshot_and_restore(cfg, disk, tmp_path):
    """SMP through a full and a diff snapshot: after each restore both vCPUs
    are online and run (busy loops started before the snapshot keep both
    busy), and memory written before the snapshot is there."""
    store = tmp_path / "store"
    with Vm.boot(
        cfg,
        disk=disk,
        mem=MEM,
        cpus=2,
        store=store,
        track_dirty=True,
        name="smp",
        agent=True,
        log_path=tmp_path / "smp.log",
    ) as vm:
        vm.wait_ready()
        vm.run("for i in 1 2; do (while :; do :; done) >/dev/null 2>&1 & done")
        vm.run("echo two-cpus > /dev/shm/smp")
        vm.snapshot("smp", "full")
        assert vm.quit() == 0

    def both_cpus_run(vm):
        assert vm.run("cat /sys/devices/system/cpu/online") == "0-1"
        before = cpu_busy_ticks(vm.run)
        time.sleep(2)
        after = cpu_busy_ticks(vm.run)
        for cpu in ("cpu0", "cpu1"):
            assert after[cpu] - before[cpu] >= 30, f"{cpu} is not running: {before} -> {after}"

    with Vm.restore(
        cfg, "smp", store=store, track_dirty=True, name="smp-d1", agent=True, log_path=tmp_path / "r1.log"
    ) as vm:
        both_cpus_run(vm)
        assert vm.run("cat /dev/shm/smp") == "two-cpus"
        vm.run("echo diff > /dev/shm/d1")
        vm.snapshot("smp-d1", "diff")
        assert vm.quit() == 0

    with Vm.restore(cfg, "smp+1", store=store, agent=True, log_path=tmp_path / "r2.log") as vm:
        both_cpus_run(vm)
        assert vm.run("cat /dev/shm/smp /dev/shm/d1") == "two-cpus\ndiff"
        assert vm.quit() == 0
