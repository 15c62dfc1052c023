"""The `vmstore` module against stores it writes itself (no VM): quick, so
scripts/test.sh runs it right after `pip install ./snapshot-store/python`.

scripts/tests/test_vmstore_py.py runs the same calls against a store that
`boot` made. Where the `vmstore` binary is built (target/release, or
$IGNITION_VMSTORE), the tests also check that it agrees.
"""

from __future__ import annotations

import datetime
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import vmstore

PS = 4096  # the smallest page size the store accepts: small files
PAGES = 64
REPO = Path(__file__).resolve().parents[3]


def vmstore_bin() -> Path | None:
    b = Path(os.environ.get("IGNITION_VMSTORE", REPO / "target" / "release" / "vmstore"))
    return b if b.is_file() else None


def cli(store: Path, *args: str) -> dict:
    b = vmstore_bin()
    if b is None:
        pytest.skip("the vmstore binary is not built (cargo build --release)")
    r = subprocess.run([str(b), "--store", str(store), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


class Chain:
    """A store with `base` (full), `d1` on it and `d2` on `d1`, each with a
    copy of one disk image, and the RAM each layer holds."""

    def __init__(self, root: Path):
        rng = random.Random(13)
        self.root = root
        self.store = vmstore.Store.create(root)
        self.disk = root.parent / "disk.img"
        self.disk.write_bytes(rng.randbytes(3 * 256 * 1024 + 100))
        ram = bytearray(rng.randbytes(PS * PAGES))
        ram[PS * 5:PS * 9] = bytes(4 * PS)  # zero pages: holes in the full layer
        self.ram = {"base": bytes(ram)}
        self.base = self.store.write_full("base", ram, b"state-0", disk=self.disk, page_size=PS, vcpus=2)
        self.pages = {"d1": [1, 3, 40], "d2": [3, 63]}
        for name, parent in (("d1", "base"), ("d2", "d1")):
            for p in self.pages[name]:
                ram[p * PS:(p + 1) * PS] = rng.randbytes(PS)
            self.store.write_diff(name, parent, ram, self.pages[name], b"state-" + name.encode(), disk=self.disk)
            self.ram[name] = bytes(ram)


@pytest.fixture(scope="module")
def chain(tmp_path_factory) -> Chain:
    return Chain(tmp_path_factory.mktemp("vmstore-mod") / "store")


@pytest.fixture
def copy(chain, tmp_path) -> Chain:
    """A private copy of the chain's store, to damage or change."""
    c = Chain.__new__(Chain)
    c.__dict__.update(chain.__dict__)
    c.root = tmp_path / "store"
    shutil.copytree(chain.root, c.root)
    c.store = vmstore.Store(c.root)
    return c


def test_layers_are_typed_objects_with_sizes_in_bytes(chain):
    s = chain.store
    assert s.root == str(chain.root)
    assert [l.name for l in s.list()] == ["base", "d1", "d2"]
    b, d1 = s.layer("base"), s.layer("d1")
    assert (b.kind, b.parent, b.diff_pages) == ("full", None, None)
    assert (d1.kind, d1.parent, d1.diff_pages) == ("diff", "base", 3)
    assert (b.ram_size, b.page_size, b.vcpus, b.backend, b.gic_mode) == (PS * PAGES, PS, 2, "emu", "userspace")
    assert b.disk_size == d1.disk_size == chain.disk.stat().st_size
    assert b.creator.startswith("vmstore-python ")
    assert isinstance(b.created, datetime.datetime) and b.created.utcoffset() == datetime.timedelta(0)
    assert abs((datetime.datetime.now(datetime.timezone.utc) - b.created).total_seconds()) < 3600
    files = [f for f in Path(b.path).iterdir() if f.is_file()]
    assert b.logical_bytes == sum(f.stat().st_size for f in files)
    assert b.physical_bytes == sum(f.stat().st_blocks * 512 for f in files)
    assert len(b.content_sha256) == 64 and b.content_sha256 != d1.content_sha256
    assert "Layer(name=\"base\"" in repr(b)


def test_resolve_names_the_chain_base_first(chain):
    s = chain.store
    assert [l.name for l in s.resolve("base+2")] == ["base", "d1", "d2"]
    assert [l.name for l in s.resolve("d1")] == ["base", "d1"]
    assert [l.name for l in s.resolve("base+0")] == ["base"]
    with pytest.raises(vmstore.StoreError, match="not found"):
        s.layer("nope")
    with pytest.raises(vmstore.StoreError):
        s.resolve("base+3")
    with pytest.raises(vmstore.StoreError, match="invalid snapshot spec"):
        s.resolve("base+x")
    with pytest.raises(vmstore.StoreError, match="no such store"):
        vmstore.Store(chain.root / "missing")


def test_overlay_into_gives_back_each_layers_ram(chain):
    s = chain.store
    for name in ("base", "d1", "d2"):
        ram = bytearray(PS * PAGES)
        secs, pages = s.overlay_into(name, ram)
        assert secs >= 0 and ram == chain.ram[name], name
        diffs = {"base": [], "d1": ["d1"], "d2": ["d1", "d2"]}[name]
        assert pages == len({p for d in diffs for p in chain.pages[d]})  # each page once
    with pytest.raises(ValueError, match="bytes"):
        s.overlay_into("d2", bytearray(PS))
    with pytest.raises(ValueError, match="writable"):
        s.overlay_into("d2", bytes(PS * PAGES))


def test_pack_diff_is_the_diff_file_byte_for_byte(chain):
    packed, secs = vmstore.pack_diff(chain.ram["d1"], chain.pages["d1"], page_size=PS)
    assert secs >= 0
    assert packed == (chain.root / "d1" / "memory.bin").read_bytes()
    with pytest.raises(ValueError, match="strictly increasing"):
        vmstore.pack_diff(chain.ram["d1"], [3, 2], page_size=PS)
    with pytest.raises(ValueError, match="beyond"):
        vmstore.pack_diff(chain.ram["d1"], [PAGES], page_size=PS)
    with pytest.raises(ValueError):
        vmstore.pack_diff(b"x" * (PS + 1), [0], page_size=PS)
    with pytest.raises(ValueError, match="contiguous"):
        vmstore.pack_diff(memoryview(bytearray(2 * PS * PAGES))[::2], [0], page_size=PS)


def test_verify_returns_the_report(chain):
    # Past the verified-file cache's racy window (50 ms): a full verify records
    # every file, and a cached one then trusts them.
    time.sleep(0.2)
    r = chain.store.verify("d2")
    assert (r.layers, r.bytes_hashed > 0, r.files_cached) == (3, True, 0)
    assert r.files >= 3 * 3  # manifest, memory and state of each layer, and the base's disk files
    c = chain.store.verify("d2", cached=True)
    assert c.files_cached > 0 and c.bytes_hashed < r.bytes_hashed
    all_ = chain.store.verify_all()
    assert sorted(all_) == ["base", "d1", "d2"]
    assert all(isinstance(v, vmstore.VerifyReport) for v in all_.values())


def test_verify_raises_a_typed_error_naming_the_file_and_problem(copy):
    state = copy.root / "d1" / "state.bin"
    state.chmod(0o644)
    data = bytearray(state.read_bytes())
    data[-1] ^= 1
    state.write_bytes(bytes(data))
    with pytest.raises(vmstore.VerifyError) as e:
        copy.store.verify("d2")
    assert isinstance(e.value, vmstore.StoreError)
    assert e.value.path == str(state), e.value.path
    assert e.value.problem and e.value.problem in str(e.value)
    all_ = copy.store.verify_all()
    assert isinstance(all_["d1"], vmstore.VerifyError) and isinstance(all_["base"], vmstore.VerifyReport)
    (copy.root / "base" / "disk.img").unlink()
    with pytest.raises(vmstore.VerifyError) as e:
        copy.store.verify("base")
    assert e.value.path.endswith("base/disk.img")


def test_squash_remove_gc_du(copy):
    s = copy.store
    flat = s.squash("d2", "flat")
    assert (flat.kind, flat.parent, flat.disk_size) == ("full", None, copy.disk.stat().st_size)
    s.verify("flat")
    ram = bytearray(PS * PAGES)
    s.overlay_into("flat", ram)
    assert ram == copy.ram["d2"]
    du = s.du()
    assert [u.name for u in du] == ["base", "d1", "d2", "flat"]
    for u in du:
        assert isinstance(u, vmstore.Usage) and u.physical_bytes > 0
        assert u.logical_bytes == s.layer(u.name).logical_bytes
        assert u.shared_bytes is None or u.shared_bytes <= u.physical_bytes
    with pytest.raises(vmstore.StoreError, match="children"):
        s.remove("base")
    # Work directories: one of a process that is gone, one of this process.
    gone = subprocess.Popen(["true"])
    gone.wait()
    (copy.root / f".tmp-x-{gone.pid}-00ff").mkdir()
    (copy.root / f".tmp-y-{os.getpid()}-00ff").mkdir()
    g = s.gc()
    assert isinstance(g, vmstore.GcReport)
    assert [n for n, _ in g.removed] == [f".tmp-x-{gone.pid}-00ff"]
    assert [n for n, _ in g.kept] == [f".tmp-y-{os.getpid()}-00ff"] and "running" in g.kept[0][1]
    assert s.remove("base", recursive=True) == ["d2", "d1", "base"]
    assert [l.name for l in s.list()] == ["flat"]


def test_writes_are_refused_with_store_errors(copy):
    s = copy.store
    ram = bytearray(PS * PAGES)
    with pytest.raises(vmstore.StoreError, match="already exists"):
        s.write_full("base", ram, b"", page_size=PS)
    with pytest.raises(vmstore.StoreError, match="invalid snapshot name"):
        s.write_full("-x", ram, b"", page_size=PS)
    with pytest.raises(vmstore.StoreError, match="bytes"):
        s.write_diff("d3", "d2", bytearray(PS), [0], b"")
    with pytest.raises(vmstore.StoreError, match="beyond"):
        s.write_diff("d3", "d2", ram, [PAGES], b"")
    with pytest.raises(vmstore.StoreError, match="not found"):
        s.write_diff("d3", "nope", ram, [0], b"")
    with pytest.raises(vmstore.StoreError):
        s.write_full("odd", bytearray(PS + 1), b"", page_size=PS)
    assert [l.name for l in s.list()] == ["base", "d1", "d2"]
    assert not [p for p in copy.root.iterdir() if p.name.startswith(".")], "a refused write left a work directory"


def test_long_calls_release_the_gil(tmp_path):
    """The main thread runs Python while another is inside verify().

    With a switch interval far longer than the test, a thread holding the GIL
    keeps it until it blocks or releases it; so the main thread can see
    `inside` set only if verify() released the GIL.
    """
    s = vmstore.Store.create(tmp_path / "big")
    s.write_full("big", os.urandom(32 << 20), b"")
    inside = False
    seen = 0

    def work():
        nonlocal inside
        for _ in range(3):
            inside = True
            s.verify("big")
            inside = False

    old = sys.getswitchinterval()
    sys.setswitchinterval(30)
    try:
        t = threading.Thread(target=work)
        t.start()
        while t.is_alive():
            seen += inside
            time.sleep(0.0002)
        t.join()
    finally:
        sys.setswitchinterval(old)
    assert seen > 0


def test_the_vmstore_binary_agrees(chain):
    listed = cli(chain.root, "list", "--json")
    assert [(l["name"], l["kind"], l["parent"]) for l in listed] == [
        (l.name, l.kind, l.parent) for l in chain.store.list()]
    assert {l["name"]: l["physical_bytes"] for l in listed} == {
        l.name: l.physical_bytes for l in chain.store.list()}
    du = cli(chain.root, "du", "--json")
    assert [(l["name"], l["logical_bytes"], l["shared_bytes"]) for l in du["layers"]] == [
        (u.name, u.logical_bytes, u.shared_bytes) for u in chain.store.du()]
    (root,) = cli(chain.root, "tree", "--json")["roots"]
    assert (root["name"], [c["name"] for c in root["children"]]) == ("base", ["d1"])
    assert cli(chain.root, "verify", "--all", "--json")["ok"] is True
