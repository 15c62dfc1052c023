"""Crash consistency: `kill -9` of `boot` at random moments of Ctrl-A s.

A golden full layer is taken, then reference full and diff snapshots of
its restores give the expected Ctrl-A s -> `[snapshot]` time of each kind
on this host (the longest of two). Then restores of golden take full and
diff snapshots and are killed (SIGKILL) after a random delay from 0 to
SPREAD times that expected time, so kills land before the write, during it
and after its commit; a few are killed as soon as the commit is logged
(`Snapshot-write-time`), while dirty tracking is re-armed and the layer's
verified-file cache is written. Whatever the moment, the store must stay
consistent: every entry is a layer or a work directory, every present
layer verifies, `vmstore verify --all` passes, `vmstore gc` leaves no work
directory, every layer restores to a guest whose agent answers (the guest is
driven through its agent; Ctrl-A s stays on the console), and so does the parent.

Nothing here depends on timing: a kill that lands after the commit finds
the layer present (and it must verify); one before finds it absent. The
delays come from a seeded RNG; the seed is printed, and
IGNITION_CRASH_SEED=N repeats a run's plan.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time

import pytest

from ignition import loglines
from ignition import store as vmstore
from ignition.vm import CTRL_A, Vm

pytestmark = pytest.mark.e2e

MEM = 128  # MiB: a full layer is written (and verified) many times
KILLS = {"full": 10, "diff": 12}  # after a random delay, per kind
ON_COMMIT = 2  # more per kind, killed when the commit is logged
SPREAD = 2.0  # random delays span 0 .. SPREAD x the kind's expected Ctrl-A s -> [snapshot] time
MARK = "golden-on-disk"


def plan(rng: random.Random, expected_s: dict[str, float]) -> list[tuple[str, float | None]]:
    """(kind, delay in s, or None: on commit) per kill, shuffled. The delays of a kind are
    one from each of KILLS[kind] equal slices of 0 .. SPREAD x expected, so they cover it."""
    kills: list[tuple[str, float | None]] = []
    for kind, n in KILLS.items():
        span = SPREAD * expected_s[kind]
        kills += [(kind, (i + rng.random()) / n * span) for i in range(n)]
        kills += [(kind, None)] * ON_COMMIT
    rng.shuffle(kills)
    return kills


def dirty(vm: Vm, i: int) -> None:
    """Dirties 4 MiB of RAM; every other time also writes to the root disk, so a diff's
    disk is sometimes cloned and re-hashed and sometimes the parent's, reused."""
    vm.run(f"dd if=/dev/urandom of=/dev/shm/k{i} bs=64k count=64 2>/dev/null")
    if i % 2:
        vm.run(f"echo {i} > /root/k{i} && sync")


def test_kill_9_during_snapshots_leaves_a_consistent_store(cfg, disk, tmp_path):
    seed = int(os.environ.get("IGNITION_CRASH_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"crash-consistency seed {seed} (IGNITION_CRASH_SEED={seed} repeats this plan)")
    rng = random.Random(seed)
    store = tmp_path / "store"
    logs = tmp_path / "logs"
    logs.mkdir()

    with Vm.boot(cfg, disk=disk, mem=MEM, store=store, name="golden", agent=True, log_path=logs / "golden.log") as vm:
        vm.wait_ready()
        # Without a machine ID the agent's rotation in each restore writes nothing to the
        # disk, so only dirty() decides whether a diff's disk is written or reused.
        vm.run(f"rm /etc/machine-id && echo {MARK} > /root/golden.txt && sync")
        vm.snapshot("golden", "full")
        assert vm.quit() == 0

    expected_s = {"full": 0.0, "diff": 0.0}
    refs = []
    for r, kind in enumerate(["full", "diff"] * 2):
        name = f"ref-{r}-{kind}"
        refs.append(name)
        with Vm.restore(
            cfg, "golden", store=store, name=name, track_dirty=kind == "diff", agent=True, log_path=logs / f"{name}.log"
        ) as vm:
            dirty(vm, r)
            expected_s[kind] = max(expected_s[kind], vm.snapshot(name, kind).console_wall_s)
            assert vm.quit() == 0

    kills = plan(rng, expected_s)
    print("expected Ctrl-A s -> [snapshot]: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in expected_s.items()))
    names = []
    for i, (kind, delay) in enumerate(kills):
        name = f"kill-{i:02d}-{kind}"
        names.append(name)
        with Vm.restore(
            cfg, "golden", store=store, name=name, track_dirty=kind == "diff", agent=True, log_path=logs / f"{name}.log"
        ) as vm:
            dirty(vm, i)
            t0 = time.perf_counter()
            vm.send(CTRL_A + "s")
            if delay is None:
                vm.expect(loglines.SNAPSHOT_WRITE_TIME, f"the commit of {name}")
            else:
                time.sleep(delay)
            waited = time.perf_counter() - t0
            assert vm.kill(signal.SIGKILL) == 128 + signal.SIGKILL, f"{name}: seed {seed}"
        print(
            f"{name}: killed {waited * 1000:.0f} ms after Ctrl-A s{' (on commit)' if delay is None else ''}; "
            f"layer {'present' if (store / name).exists() else 'absent'}"
        )

    # Before gc: only layers (under names we gave) and work entries; no half-written layer.
    layers = vmstore.layer_names(store)
    left = vmstore.work_entries(store)
    kinds = {
        k: sum(e.startswith(k) or f"/{k}" in e for e in left)
        for k in (".tmp-run-", ".tmp-", ".del-", vmstore.VERIFIED_TMP_PREFIX)
    }
    kinds[".tmp-"] -= kinds[".tmp-run-"]
    print(f"before gc: {len(layers)} layers; work entries: {kinds}")
    assert set(layers) <= {"golden", *refs, *names}, f"seed {seed}: {layers}"
    for entry in store.iterdir():
        assert entry.name in layers or entry.name.startswith(vmstore.WORK_PREFIXES), (
            f"seed {seed}: {entry.name} is neither a layer nor a work directory"
        )

    res = vmstore.vmstore(store, "verify", "--all")
    assert res.returncode == 0, f"seed {seed}: {res.stdout}{res.stderr}"
    for name in layers:
        assert f"ok   {name} (" in res.stdout, f"seed {seed}: {name} not verified: {res.stdout}"

    res = vmstore.vmstore(store, "gc")
    assert res.returncode == 0, f"seed {seed}: {res.stdout}{res.stderr}"
    assert vmstore.work_entries(store) == [], f"seed {seed}: gc left {vmstore.work_entries(store)}\n{res.stdout}"
    assert vmstore.layer_names(store) == layers, f"seed {seed}: gc changed the layers"
    res = vmstore.vmstore(store, "verify", "--all")
    assert res.returncode == 0, f"seed {seed}: after gc: {res.stdout}{res.stderr}"

    # Every present layer restores to a guest with golden's disk; the parent too.
    for name in [n for n in layers if n != "golden"] + ["golden"]:
        with Vm.restore(cfg, name, store=store, agent=True, log_path=logs / f"restore-{name}.log") as vm:
            assert vm.run("cat /root/golden.txt") == MARK, f"seed {seed}: {name}"
            assert vm.quit() == 0, f"seed {seed}: {name}"
    # Passed: free the disk (a few GiB); a failure keeps the store and the console logs.
    vmstore.remove_tree(store)
    shutil.rmtree(logs)
