"""The `vmstore` Python module (snapshot-store/python, pyo3) against a real store made by `boot`.

scripts/test.sh installs it first (`pip install ./snapshot-store/python`); its own
quick tests, on stores it writes itself, are in snapshot-store/python/tests/.
One module-scoped store: a full layer `g` and a diff `g.2` from a guest that
wrote a marker between them.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import shutil

import pytest

from ignition.paths import vmstore_bin
from ignition.vm import Vm

pytestmark = pytest.mark.e2e

vmstore = pytest.importorskip("vmstore", reason="pip install ./snapshot-store/python")
MEM = 128


@pytest.fixture(scope="module")
def made(tmp_path_factory, guest_out, cfg):
    tmp = tmp_path_factory.mktemp("vmstore-py")
    disk = tmp / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    store = tmp / "store"
    with Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="g", agent=True, log_path=tmp / "g.log"
    ) as vm:
        vm.wait_ready()
        vm.snapshot("g", "full")
        vm.run("echo marker > /dev/shm/m")
        vm.snapshot("g.2", "diff")
        assert vm.quit() == 0
    return store


def test_list_inspect_resolve(made):
    s = vmstore.Store(str(made))
    assert s.root == str(made)
    names = [layer.name for layer in s.list()]
    assert names == ["g", "g.2"]
    g, d = s.layer("g"), s.layer("g.2")
    assert (g.kind, g.parent, g.diff_pages) == ("full", None, None)
    assert (d.kind, d.parent) == ("diff", "g") and d.diff_pages > 0
    assert g.ram_size == MEM << 20 and g.page_size == 16384 and g.disk_size > 0
    assert g.creator.startswith("ignition-vmm") and g.physical_bytes > 0
    assert isinstance(g.created, datetime.datetime) and g.created.tzinfo is not None
    assert abs((datetime.datetime.now(datetime.timezone.utc) - g.created).total_seconds()) < 24 * 3600
    assert len(g.content_sha256) == 64 and os.path.isdir(g.path)
    assert [layer.name for layer in s.resolve("g+1")] == ["g", "g.2"]
    assert [layer.name for layer in s.resolve("g.2")] == ["g", "g.2"]
    with pytest.raises(vmstore.StoreError, match="not found"):
        s.layer("nope")
    with pytest.raises(vmstore.StoreError):
        vmstore.Store(str(made / "missing"))


def test_verify_reports_and_raises_naming_the_file(made, tmp_path):
    s = vmstore.Store(str(made))
    r = s.verify("g.2")
    assert r.layers == 2 and r.files >= 8 and r.bytes_hashed > 0
    assert s.verify("g.2", cached=True).files_cached > 0
    all_ = s.verify_all()
    assert set(all_) == {"g", "g.2"} and all(isinstance(v, vmstore.VerifyReport) for v in all_.values())
    # A damaged copy of the store: VerifyError naming state.bin.
    bad = tmp_path / "bad"
    shutil.copytree(made, bad)
    state = bad / "g.2" / "state.bin"
    state.chmod(0o644)
    data = bytearray(state.read_bytes())
    data[-1] ^= 1
    state.write_bytes(bytes(data))
    with pytest.raises(vmstore.VerifyError) as e:
        vmstore.Store(str(bad)).verify("g.2")
    assert e.value.path.endswith("g.2/state.bin") and e.value.problem, e.value.path
    assert isinstance(vmstore.Store(str(bad)).verify_all()["g.2"], vmstore.VerifyError)


def test_overlay_and_pack_match_the_store(made):
    s = vmstore.Store(str(made))
    ram = bytearray(MEM << 20)
    secs, pages = s.overlay_into("g.2", ram)
    assert secs >= 0 and pages == s.layer("g.2").diff_pages
    assert b"marker\n" in ram
    with pytest.raises(ValueError, match="bytes"):
        s.overlay_into("g.2", bytearray(4096))
    with pytest.raises(ValueError, match="writable"):
        s.overlay_into("g.2", bytes(MEM << 20))
    # pack_diff of the diff's pages is the diff's memory.bin, byte for byte.
    diff = (made / "g.2" / "memory.bin").read_bytes()
    n = s.layer("g.2").diff_pages
    index = [int.from_bytes(diff[96 + 8 * i : 104 + 8 * i], "little") for i in range(n)]
    packed, secs = vmstore.pack_diff(ram, index)
    assert secs >= 0 and hashlib.sha256(packed).digest() == hashlib.sha256(diff).digest()
    with pytest.raises(ValueError, match="strictly increasing"):
        vmstore.pack_diff(ram, [3, 2])


def test_remove_gc_squash_du(made, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(made, copy)
    s = vmstore.Store(str(copy))
    flat = s.squash("g.2", "flat")
    assert (flat.kind, flat.parent) == ("full", None)
    s.verify("flat")
    rows = {u.name: u for u in s.du()}
    assert set(rows) == {"g", "g.2", "flat"} and all(u.physical_bytes > 0 for u in rows.values())
    with pytest.raises(vmstore.StoreError, match="children"):
        s.remove("g")
    assert s.remove("g", recursive=True) == ["g.2", "g"]
    g = s.gc()
    assert (g.removed, g.kept) == ([], [])
    assert [layer.name for layer in s.list()] == ["flat"]
    # The CLI agrees.
    import subprocess

    out = subprocess.run([str(vmstore_bin()), "--store", str(copy), "list"], capture_output=True, text=True)
    assert out.returncode == 0 and "flat" in out.stdout


def test_the_vmstore_binary_on_the_same_store(made):
    """tree, du and verify --json through the binary, on the store boot made."""
    import json
    import subprocess

    def run(*args):
        r = subprocess.run([str(vmstore_bin()), "--store", str(made), *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
        return json.loads(r.stdout)

    tree = run("tree", "--json")
    (root,) = tree["roots"]
    assert (root["name"], root["kind"]) == ("g", "full")
    assert [(c["name"], c["kind"]) for c in root["children"]] == [("g.2", "diff")]
    du = run("du", "--json")
    assert [layer["name"] for layer in du["layers"]] == ["g", "g.2"]
    assert du["total"]["physical_bytes"] == sum(layer["physical_bytes"] for layer in du["layers"])
    assert run("verify", "g.2", "--json")["ok"] is True
    s = vmstore.Store(str(made))
    assert {u.name: u.physical_bytes for u in s.du()} == {
        layer["name"]: layer["physical_bytes"] for layer in du["layers"]
    }
