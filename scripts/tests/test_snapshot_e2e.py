"""End-to-end snapshots on the real guest: Ctrl-A s, diff chains, restore.

golden (full) -> d1 -> d2 -> d3 (diffs), each diff made by restoring its parent
with --track-dirty and writing a file of known content into /dev/shm. Then
restores of golden+3 and d1 are checked, the disk's state at the snapshot
instant, a process surviving restore, refusals on a damaged store, and a
2-vCPU guest through a full and a diff snapshot.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from ignition import console as harness
from test_boot_e2e import BOOT_TIMEOUT, CMD_TIMEOUT, cpu_busy_ticks

MEM = "256"


def spawn(boot_bin, args, backend, log):
    argv = [str(boot_bin), *args]
    if backend:
        argv += ["--backend", backend]
    return harness.spawn(argv, log_path=log, timeout=BOOT_TIMEOUT)


def snapshot_disk(child, kind, name):
    """Ctrl-A s; returns the pages of the `[snapshot]` line and H, N of
    `Snapshot-disk-clone = METHOD (H of N chunks hashed...)`."""
    child.send("\x01s")
    harness.expect(child, r"Snapshot-write-time = \d+ ms", CMD_TIMEOUT, "Snapshot-write-time")
    harness.expect(child, r"Snapshot-disk-clone = [^(\r\n]+ \((\d+) of (\d+) chunks hashed", CMD_TIMEOUT,
                   "Snapshot-disk-clone")
    hashed, chunks = int(child.match.group(1)), int(child.match.group(2))
    harness.expect(child, rf"\[snapshot\] {kind} '{re.escape(name)}' \((\d+) pages, [0-9.]+ MiB\) written",
                   CMD_TIMEOUT, f"the {kind} snapshot line")
    return int(child.match.group(1)), hashed, chunks


def snapshot(child, kind, name):
    """Ctrl-A s; returns the pages of the `[snapshot]` line."""
    return snapshot_disk(child, kind, name)[0]


def quit_vm(child):
    child.send("\x01x")
    assert harness.wait_exit(child, CMD_TIMEOUT) == 0


def restore(boot_bin, store, spec, backend, log, *extra):
    child = spawn(boot_bin, ["--store", str(store), "--restore", spec, *extra], backend, log)
    # The working disk's copy reports itself from its own thread: before or
    # after the other two lines.
    lines = [r"Restore-time = \d+ ms", r"Restore-stages: total \d+ us, .*vCPUs \d+ us",
             r"Restore-disk-copy = \d+ us \([^)]+\); ready \d+ us after restore start"]
    seen = set()
    while len(seen) < len(lines):
        seen.add(harness.expect(child, lines, BOOT_TIMEOUT, "the restore log lines"))
    harness.paced_send(child, "\n")
    harness.expect(child, harness.PROMPT, CMD_TIMEOUT, "the shell prompt after restore")
    return child


def fresh_copy(chain, tmp_path) -> Path:
    """A private copy of the chain's store (replacing an earlier copy), for
    tests that change or damage it."""
    src, _ = chain
    store = tmp_path / "store"
    if store.exists():
        shutil.rmtree(store)
    shutil.copytree(src, store)
    return store


def store_digest(store: Path) -> dict[str, str]:
    out = {}
    for p in sorted(store.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(store))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def chain(tmp_path_factory, guest_out, boot_bin, backend):
    """Builds golden -> d1 -> d2 -> d3 once; returns (store, facts)."""
    tmp = tmp_path_factory.mktemp("chain")
    store = tmp / "store"
    disk = tmp / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    facts = {"sums": {}, "pages": {}}

    child = spawn(boot_bin, ["--kernel", str(guest_out / "Image"), "--disk", str(disk), "--mem", MEM,
                             "--store", str(store), "--track-dirty", "--name", "golden"], backend, tmp / "golden.log")
    try:
        harness.login(child, timeout=BOOT_TIMEOUT)
        facts["pid"] = harness.run(child, "sleep 100000 & echo $!", CMD_TIMEOUT).strip()
        harness.run(child, "echo before-snapshot > /root/golden.txt && sync", CMD_TIMEOUT)
        facts["pages"]["golden"] = snapshot(child, "full", "golden")
        harness.run(child, "echo after-snapshot > /root/after.txt && sync", CMD_TIMEOUT)
        quit_vm(child)
    finally:
        harness.terminate(child)

    parent = "golden"
    for n in (1, 2, 3):
        name = f"d{n}"
        child = restore(boot_bin, store, parent, backend, tmp / f"{name}.log", "--track-dirty", "--name", name)
        try:
            harness.run(child, f"dd if=/dev/urandom of=/dev/shm/{name} bs=64k count=32 2>/dev/null", CMD_TIMEOUT)
            facts["sums"][name] = harness.run(child, f"sha256sum /dev/shm/{name}", CMD_TIMEOUT).split()[0]
            facts["pages"][name] = snapshot(child, "diff", name)
            quit_vm(child)
        finally:
            harness.terminate(child)
        parent = name
    return store, facts


def test_chain_restores_every_layer(chain, boot_bin, backend, tmp_path):
    store, facts = chain
    child = restore(boot_bin, store, "golden+3", backend, tmp_path / "g3.log")
    try:
        for name, digest in facts["sums"].items():
            assert harness.run(child, f"sha256sum /dev/shm/{name}", CMD_TIMEOUT).split()[0] == digest
        # A process started before the golden snapshot still runs.
        assert harness.run(child, f"kill -0 {facts['pid']} && echo alive", CMD_TIMEOUT) == "alive"
        assert harness.run(child, "uname -m", CMD_TIMEOUT) == "aarch64"
        quit_vm(child)
    finally:
        harness.terminate(child)

    child = restore(boot_bin, store, "d1", backend, tmp_path / "d1.log")
    try:
        assert harness.run(child, "sha256sum /dev/shm/d1", CMD_TIMEOUT).split()[0] == facts["sums"]["d1"]
        assert harness.run(child, "ls /dev/shm", CMD_TIMEOUT).split() == ["d1"]
        quit_vm(child)
    finally:
        harness.terminate(child)


def test_diffs_are_much_smaller_than_the_full_layer(chain):
    store, facts = chain
    full = (store / "golden" / "memory.bin").stat().st_size
    for name in ("d1", "d2", "d3"):
        diff = (store / name / "memory.bin").stat().st_size
        assert diff * 4 < full, f"{name}: diff {diff} bytes vs full {full}"
        assert facts["pages"][name] * 4 < facts["pages"]["golden"]


def test_disk_is_captured_at_the_snapshot_instant(chain, boot_bin, backend, tmp_path):
    store, _ = chain
    child = restore(boot_bin, store, "golden", backend, tmp_path / "disk.log")
    try:
        assert harness.run(child, "cat /root/golden.txt", CMD_TIMEOUT) == "before-snapshot"
        status, _ = harness.run_status(child, "test -e /root/after.txt", CMD_TIMEOUT)
        assert status != 0, "a file written after the snapshot must not be in it"
        quit_vm(child)
    finally:
        harness.terminate(child)


def test_second_snapshot_in_one_run_is_a_suffixed_diff(chain, boot_bin, backend, tmp_path):
    store = fresh_copy(chain, tmp_path)
    child = restore(boot_bin, store, "d1", backend, tmp_path / "e.log", "--track-dirty", "--name", "e")
    try:
        harness.run(child, "echo one > /dev/shm/e1", CMD_TIMEOUT)
        snapshot(child, "diff", "e")
        harness.run(child, "echo two > /dev/shm/e2", CMD_TIMEOUT)
        snapshot(child, "diff", "e.2")
        quit_vm(child)
    finally:
        harness.terminate(child)
    child = restore(boot_bin, store, "e.2", backend, tmp_path / "e2.log")
    try:
        assert harness.run(child, "cat /dev/shm/e1 /dev/shm/e2", CMD_TIMEOUT) == "one\ntwo"
        quit_vm(child)
    finally:
        harness.terminate(child)


def refused(boot_bin, store, spec, backend):
    args = [str(boot_bin), "--store", str(store), "--restore", spec]
    if backend:
        args += ["--backend", backend]
    return subprocess.run(args, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_damaged_store_is_refused_and_left_unchanged(chain, boot_bin, backend, tmp_path):
    store = fresh_copy(chain, tmp_path)
    mem = store / "d2" / "memory.bin"
    os.chmod(mem, 0o644)
    data = bytearray(mem.read_bytes())
    data[len(data) // 2] ^= 0x01
    mem.write_bytes(data)
    before = store_digest(store)
    r = refused(boot_bin, store, "golden+3", backend)
    assert r.returncode != 0 and "d2" in r.stderr and "memory.bin" in r.stderr, r.stderr
    assert store_digest(store) == before, "a refused restore must not change the store"

    store = fresh_copy(chain, tmp_path)
    shutil.rmtree(store / "d1")
    r = refused(boot_bin, store, "d3", backend)
    assert r.returncode != 0 and "d1" in r.stderr, r.stderr

    store = fresh_copy(chain, tmp_path)
    (store / "d3" / "state.bin").unlink()
    r = refused(boot_bin, store, "d3", backend)
    assert r.returncode != 0 and "state.bin" in r.stderr, r.stderr


def test_snapshot_names_are_checked(chain, boot_bin, backend, guest_out, tmp_path):
    store, _ = chain
    # An existing name is refused before anything runs; nothing is overwritten.
    r = subprocess.run([str(boot_bin), "--store", str(store), "--restore", "d1", "--name", "d2"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "d2" in r.stderr and "exists" in r.stderr, r.stderr
    r = subprocess.run([str(boot_bin), "--store", str(store), "--name", "golden", "--kernel",
                        str(guest_out / "Image"), "--disk", str(guest_out / "rootfs.ext4")],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "golden" in r.stderr and "exists" in r.stderr, r.stderr
    r = subprocess.run([str(boot_bin), "--store", str(store), "--restore", "d1", "--name", "bad+name"],
                       capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and "name" in r.stderr, r.stderr


def test_failed_snapshot_keeps_dirty_pages_for_the_next(chain, boot_bin, backend, tmp_path):
    """Dirty state is cleared only after a layer is durable: a snapshot that
    fails leaves every page dirtied before it in the next diff."""
    store = fresh_copy(chain, tmp_path)
    child = restore(boot_bin, store, "golden", backend, tmp_path / "x.log", "--track-dirty", "--name", "x")
    try:
        harness.run(child, "dd if=/dev/urandom of=/dev/shm/a bs=64k count=16 2>/dev/null", CMD_TIMEOUT)
        sum_a = harness.run(child, "sha256sum /dev/shm/a", CMD_TIMEOUT).split()[0]
        (store / "x").mkdir()  # the name is taken: this Ctrl-A s must fail
        child.send("\x01s")
        harness.expect(child, r"\[snapshot\] 'x' failed, nothing was written", CMD_TIMEOUT, "the refusal")
        (store / "x").rmdir()
        harness.run(child, "echo b > /dev/shm/b", CMD_TIMEOUT)
        snapshot(child, "diff", "x")
        quit_vm(child)
    finally:
        harness.terminate(child)
    child = restore(boot_bin, store, "x", backend, tmp_path / "x2.log")
    try:
        assert harness.run(child, "sha256sum /dev/shm/a", CMD_TIMEOUT).split()[0] == sum_a
        assert harness.run(child, "cat /dev/shm/b", CMD_TIMEOUT) == "b"
        quit_vm(child)
    finally:
        harness.terminate(child)


def test_disk_diff_hashes_only_written_chunks(chain, boot_bin, backend, tmp_path):
    """A diff after the guest writes a small file to its root disk re-hashes
    a few 256 KiB chunks, not the whole disk; its restore has the file."""
    store = fresh_copy(chain, tmp_path)
    child = restore(boot_bin, store, "golden", backend, tmp_path / "w.log", "--track-dirty", "--name", "w")
    try:
        harness.run(child, "echo chunked > /root/small.txt && sync", CMD_TIMEOUT)
        _, hashed, chunks = snapshot_disk(child, "diff", "w")
        quit_vm(child)
    finally:
        harness.terminate(child)
    disk_size = (store / "golden" / "disk.img").stat().st_size
    assert chunks == -(-disk_size // (256 << 10))
    assert 0 < hashed < chunks // 4, f"{hashed} of {chunks} chunks hashed"
    child = restore(boot_bin, store, "w", backend, tmp_path / "w2.log")
    try:
        assert harness.run(child, "cat /root/small.txt", CMD_TIMEOUT) == "chunked"
        quit_vm(child)
    finally:
        harness.terminate(child)


def test_two_vcpus_snapshot_and_restore(guest_out, boot_bin, backend, tmp_path):
    """SMP through a full and a diff snapshot: after each restore both vCPUs
    are online and run (busy loops started before the snapshot keep both
    busy), and memory written before the snapshot is there."""
    store = tmp_path / "store"
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    child = spawn(boot_bin, ["--kernel", str(guest_out / "Image"), "--disk", str(disk), "--mem", MEM,
                             "--cpus", "2", "--store", str(store), "--track-dirty", "--name", "smp"],
                  backend, tmp_path / "smp.log")
    try:
        harness.login(child, timeout=BOOT_TIMEOUT)
        harness.run(child, "for i in 1 2; do (while :; do :; done) & done", CMD_TIMEOUT)
        harness.run(child, "echo two-cpus > /dev/shm/smp", CMD_TIMEOUT)
        snapshot(child, "full", "smp")
        quit_vm(child)
    finally:
        harness.terminate(child)

    def both_cpus_run(child):
        assert harness.run(child, "cat /sys/devices/system/cpu/online", CMD_TIMEOUT) == "0-1"
        before = cpu_busy_ticks(child)
        time.sleep(2)
        after = cpu_busy_ticks(child)
        for cpu in ("cpu0", "cpu1"):
            assert after[cpu] - before[cpu] >= 30, f"{cpu} is not running: {before} -> {after}"

    child = restore(boot_bin, store, "smp", backend, tmp_path / "r1.log", "--track-dirty", "--name", "smp-d1")
    try:
        both_cpus_run(child)
        assert harness.run(child, "cat /dev/shm/smp", CMD_TIMEOUT) == "two-cpus"
        harness.run(child, "echo diff > /dev/shm/d1", CMD_TIMEOUT)
        snapshot(child, "diff", "smp-d1")
        quit_vm(child)
    finally:
        harness.terminate(child)

    child = restore(boot_bin, store, "smp+1", backend, tmp_path / "r2.log")
    try:
        both_cpus_run(child)
        assert harness.run(child, "cat /dev/shm/smp /dev/shm/d1", CMD_TIMEOUT) == "two-cpus\ndiff"
        quit_vm(child)
    finally:
        harness.terminate(child)
