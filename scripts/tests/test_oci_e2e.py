"""`vmstore push` / `vmstore pull` against real registries on 127.0.0.1.

Debian's docker-registry (CNCF distribution 2.8) with a throwaway config, one
anonymous and one with htpasswd basic auth (scripts/ignition/registry.py).
Store A holds golden -> d1 -> d2 -> d3 -> d4 made by the real guest with
--track-dirty, each layer after writing a file of random bytes into /dev/shm
whose sha256 is recorded. golden+3 is pushed, pulled into an empty store B
and restored from there, and the guest's files are checked; then d4 is pushed
and only d4's blobs are sent; a corrupted and a truncated blob in the
registry's storage are refused naming digest and layer with nothing
committed; a pull killed with SIGKILL while receiving leaves a store that
verifies, and pulling again completes; zstd transport and --as;
--mount-from; basic auth through REGISTRY_AUTH_FILE, with wrong or missing
credentials refused clearly; bearer tokens from a token server
(distribution's token authentication) and given directly; HTTPS by default
against a registry whose certificate comes from a throwaway CA.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pexpect
import pytest

from ignition import paths
from ignition.registry import REGISTRY_BIN, LocalRegistry, TokenServer, auth_file, environ_with_auth
from ignition.store import layer_names, work_entries
from ignition.vm import Vm

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not REGISTRY_BIN.is_file(), reason=f"no registry at {REGISTRY_BIN} (scripts/setup.sh; a Mac: README)"
    ),
]

MEM = 128
CHAIN = ["golden", "d1", "d2", "d3", "d4"]


def vmstore(store: Path, *args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(
        [str(paths.vmstore_bin()), "--store", str(store), *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
        env=env if env is not None else environ_with_auth(None),
    )
    if check:
        assert r.returncode == 0, f"vmstore {' '.join(args)}: {r.stdout}{r.stderr}"
    return r


def vmstore_json(store: Path, *args: str, env: dict | None = None) -> dict:
    return json.loads(vmstore(store, *args, "--json", env=env).stdout)


@pytest.fixture(scope="module")
def chain(tmp_path_factory, guest_out, cfg):
    """Store A with golden -> d1 -> d2 -> d3 -> d4; returns (store, {layer: sha256 of /dev/shm/LAYER})."""
    tmp = tmp_path_factory.mktemp("oci-chain")
    store = tmp / "A"
    disk = tmp / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    sums = {}
    with Vm.boot(
        cfg, disk=disk, mem=MEM, store=store, track_dirty=True, name="golden", agent=True, log_path=tmp / "golden.log"
    ) as vm:
        vm.wait_ready()
        vm.run("dd if=/dev/urandom of=/dev/shm/golden bs=64k count=16 2>/dev/null")
        sums["golden"] = vm.run("sha256sum /dev/shm/golden").split()[0]
        vm.snapshot("golden", "full")
        assert vm.quit() == 0
    for parent, name in zip(CHAIN, CHAIN[1:]):
        with Vm.restore(
            cfg, parent, store=store, track_dirty=True, name=name, agent=True, log_path=tmp / f"{name}.log"
        ) as vm:
            vm.run(f"dd if=/dev/urandom of=/dev/shm/{name} bs=64k count=32 2>/dev/null")
            sums[name] = vm.run(f"sha256sum /dev/shm/{name}").split()[0]
            vm.snapshot(name, "diff")
            assert vm.quit() == 0
    return store, sums


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


@pytest.fixture(scope="module")
def pushed(chain, registry):
    """golden+3 pushed to REPO:v1 from store A; returns (reference, push report)."""
    store, _ = chain
    ref = f"{registry.host}/sandboxes/py:v1"
    return ref, vmstore_json(store, "push", "golden+3", ref, "--plain-http")


def blobs(report: dict, status: str | None = None) -> list[tuple[str, str, str]]:
    """(layer, file, digest) of the report's blobs, those with `status` if given."""
    return [
        (layer["name"], b["file"], b["digest"])
        for layer in report["layers"]
        for b in layer["blobs"]
        if status is None or b["status"] == status
    ]


def test_push_pull_and_restore_from_the_pulled_store(chain, pushed, cfg, tmp_path):
    store_a, sums = chain
    ref, rep = pushed
    assert [layer["name"] for layer in rep["layers"]] == CHAIN[:4]
    assert rep["compression"] == "none" and rep["digest"] == rep["layers"][-1]["manifest_digest"]
    # Everything new to the registry was sent; only blobs repeated inside the
    # chain (the disk of diffs whose guest did not write it: an empty disk
    # diff, the parent's digests) were found already there.
    files = {b[1] for b in blobs(rep)}
    assert {"manifest.json", "memory.bin", "state.bin", "disk.img", "disk.diff", "disk.chunks"} <= files
    assert all(f in ("disk.diff", "disk.chunks") for _, f, _ in blobs(rep, "present"))
    assert rep["bytes_sent"] > (MEM << 20)

    store_b = tmp_path / "B"
    pulled = vmstore_json(store_b, "pull", ref, "--plain-http")
    assert pulled["name"] == "d3" and pulled["digest"] == rep["digest"]
    assert [(layer["name"], layer["status"]) for layer in pulled["layers"]] == [(n, "pulled") for n in CHAIN[:4]]
    assert layer_names(store_b) == sorted(CHAIN[:4]) and work_entries(store_b) == []
    # The same layers, byte for byte: the content hashes agree.
    for name in CHAIN[:4]:
        assert (store_b / name / "manifest.json").read_bytes() == (store_a / name / "manifest.json").read_bytes()
    assert vmstore_json(store_b, "verify", "d3")["ok"] is True
    with Vm.restore(cfg, "golden+3", store=store_b, agent=True, log_path=tmp_path / "restore.log") as vm:
        for name in CHAIN[:4]:
            assert vm.run(f"sha256sum /dev/shm/{name}").split()[0] == sums[name], name
        assert vm.quit() == 0

    # Pulling again fetches nothing.
    again = vmstore_json(store_b, "pull", ref, "--plain-http")
    assert [layer["status"] for layer in again["layers"]] == ["present"] * 4 and again["bytes_received"] == 0


def test_pushing_d4_sends_only_its_blobs(chain, pushed, registry, tmp_path):
    store_a, _ = chain
    _, first = pushed
    ref = f"{registry.host}/sandboxes/py:v2"
    rep = vmstore_json(store_a, "push", "d4", ref, "--plain-http")
    assert [layer["name"] for layer in rep["layers"]] == CHAIN
    sent = blobs(rep, "sent")
    assert sent and {layer for layer, _, _ in sent} == {"d4"}, sent
    assert {f for _, f, _ in sent} >= {"manifest.json", "memory.bin", "state.bin"}
    old = {d for _, _, d in blobs(first)}
    assert all(d in old for layer, _, d in blobs(rep) if layer != "d4")
    assert rep["bytes_sent"] == sum(
        b["size"] for layer in rep["layers"] for b in layer["blobs"] if b["status"] == "sent"
    )
    # Exactly the blobs the registry lacked were sent: d4's own, less any it
    # shares with its ancestors (its disk image, when the guest wrote nothing
    # to the disk since d3). How much that is depends on what the guest did,
    # not on this test: no bound on the size.
    new = [b for layer in rep["layers"] for b in layer["blobs"] if b["digest"] not in old]
    assert new and rep["bytes_sent"] == sum(b["size"] for b in new)
    # A store with golden+3 pulls only d4.
    store = tmp_path / "S"
    vmstore(store, "pull", pushed[0], "--plain-http")
    got = vmstore_json(store, "pull", ref, "--plain-http")
    assert [(layer["name"], layer["status"]) for layer in got["layers"]] == [(n, "present") for n in CHAIN[:4]] + [
        ("d4", "pulled")
    ]
    assert vmstore_json(store, "verify", "d4")["ok"] is True


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupted_blob_is_refused_and_nothing_committed(pushed, registry, tmp_path, damage):
    ref, rep = pushed
    (digest,) = [d for layer, f, d in blobs(rep) if (layer, f) == ("d2", "memory.bin")]
    blob = registry.blob_path(digest)
    original = blob.read_bytes()
    try:
        data = bytearray(original)
        if damage == "flip":
            data[len(data) // 2] ^= 0x40
        else:
            del data[len(data) // 2 :]
        blob.write_bytes(bytes(data))
        store = tmp_path / "C"
        r = vmstore(store, "pull", ref, "--plain-http", check=False)
        assert r.returncode == 1, r.stdout + r.stderr
        assert digest in r.stderr and "layer 'd2'" in r.stderr and "memory.bin" in r.stderr, r.stderr
        assert "corrupted or truncated" in r.stderr and "nothing committed" in r.stderr, r.stderr
        assert layer_names(store) == [] and work_entries(store) == []
    finally:
        blob.write_bytes(original)


def test_kill_during_pull_leaves_a_valid_store(pushed, registry, tmp_path):
    """A 512 MiB layer of random bytes (the Python module writes it), pulled into a
    store that already holds golden+3; SIGKILL once the progress line shows bytes of it."""
    vm = pytest.importorskip("vmstore", reason="pip install ./snapshot-store/python")
    src = tmp_path / "big-src"
    s = vm.Store.create(str(src))
    ram = bytearray(os.urandom(512 << 20))
    s.write_full("big", ram, b"big state")
    del ram
    ref = f"{registry.host}/sandboxes/big:v1"
    vmstore(src, "push", "big", ref, "--plain-http")

    store = tmp_path / "D"
    vmstore(store, "pull", pushed[0], "--plain-http")
    child = pexpect.spawn(
        str(paths.vmstore_bin()),
        ["--store", str(store), "pull", ref, "--plain-http"],
        env=environ_with_auth(None),
        timeout=120,
    )
    child.expect(r"receiving big/memory\.bin: [1-9]")
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.expect(pexpect.EOF)
    child.close()
    assert child.signalstatus == signal.SIGKILL
    assert layer_names(store) == sorted(CHAIN[:4])
    assert any(e.startswith(".tmp-big-") for e in work_entries(store)), work_entries(store)
    v = vmstore_json(store, "verify", "--all")
    assert v["ok"] is True and {x["name"] for x in v["snapshots"]} == set(CHAIN[:4])
    got = vmstore_json(store, "pull", ref, "--plain-http")
    assert [(layer["name"], layer["status"]) for layer in got["layers"]] == [("big", "pulled")]
    assert vmstore_json(store, "verify", "big")["ok"] is True
    gc = vmstore_json(store, "gc")
    assert [x["name"] for x in gc["removed"]] and work_entries(store) == []


def test_zstd_transport_and_pull_as(chain, registry, tmp_path):
    store_a, _ = chain
    ref = f"{registry.host}/sandboxes/zst:v1"
    rep = vmstore_json(store_a, "push", "d1", ref, "--plain-http", "--compress", "zstd")
    assert rep["compression"] == "zstd" and rep["compression_ratio"] > 1.0
    media = [b["media_type"] for layer in rep["layers"] for b in layer["blobs"] if b["file"] != "manifest.json"]
    assert media and all(m.startswith("application/vnd.ignition.layer.") and m.endswith("+zstd") for m in media)
    store = tmp_path / "E"
    got = vmstore_json(store, "pull", ref, "--plain-http", "--as", "mine")
    assert got["name"] == "mine" and got["file_bytes"] > got["bytes_received"]
    assert layer_names(store) == ["golden", "mine"]
    v = vmstore_json(store, "verify", "mine")
    assert v["ok"] is True and v["snapshots"][0]["chain"] == "golden -> mine"
    # The same registry layers under the same name are found present; a name
    # taken below the top is refused before anything is fetched.
    again = vmstore_json(store, "pull", ref, "--plain-http", "--as", "mine")
    assert [layer["status"] for layer in again["layers"]] == ["present", "present"]
    r = vmstore(store, "pull", ref, "--plain-http", "--as", "golden", check=False)
    assert r.returncode == 1 and "already has a layer 'golden' below its top" in r.stderr, r.stderr
    # Only the top layer's name changed; its files are d1's.
    for f in ("memory.bin", "state.bin"):
        assert (store / "mine" / f).read_bytes() == (store_a / "d1" / f).read_bytes()


def test_mount_from_another_repository_sends_nothing(chain, pushed, registry):
    store_a, _ = chain
    src = pushed[0].rsplit(":", 1)[0]
    rep = vmstore_json(store_a, "push", "d1", f"{registry.host}/other/py:v1", "--plain-http", "--mount-from", src)
    assert rep["bytes_sent"] == 0 and blobs(rep, "sent") == []
    assert blobs(rep, "mounted"), rep
    r = vmstore(
        store_a,
        "push",
        "d1",
        f"{registry.host}/other/py:v1",
        "--plain-http",
        "--mount-from",
        "127.0.0.2:1/x",
        check=False,
    )
    assert r.returncode == 1 and "same registry" in r.stderr, r.stderr


def test_basic_auth_from_registry_auth_file(chain, tmp_path):
    store_a, _ = chain
    with LocalRegistry(tmp_path / "auth-reg", users={"alice": "s3cret"}) as reg:
        ref = f"{reg.host}/private/py:v1"
        good = auth_file(tmp_path / "good.json", reg.host, "alice", "s3cret")
        bad = auth_file(tmp_path / "bad.json", reg.host, "alice", "wrong")
        r = vmstore(store_a, "push", "d1", ref, "--plain-http", env=environ_with_auth(bad), check=False)
        assert r.returncode == 1 and "refused access with basic credentials" in r.stderr, r.stderr
        assert str(bad) in r.stderr, r.stderr
        r = vmstore(store_a, "push", "d1", ref, "--plain-http", env=environ_with_auth(None), check=False)
        assert r.returncode == 1 and "refused access with anonymous credentials" in r.stderr, r.stderr
        rep = vmstore_json(store_a, "push", "d1", ref, "--plain-http", env=environ_with_auth(good))
        assert len(rep["layers"]) == 2
        store = tmp_path / "F"
        r = vmstore(store, "pull", ref, "--plain-http", env=environ_with_auth(bad), check=False)
        assert r.returncode == 1 and "refused access" in r.stderr and ref in r.stderr, r.stderr
        got = vmstore_json(store, "pull", ref, "--plain-http", env=environ_with_auth(good))
        assert got["name"] == "d1" and layer_names(store) == ["d1", "golden"]


def test_bearer_token_registry(chain, tmp_path):
    """distribution's token authentication: the registry answers with a bearer challenge, the
    user name and password from the auth file are exchanged for a JWT at the token server; a
    bearer token given directly (`registrytoken`) works too; anonymous access is refused."""
    store_a, _ = chain
    tokens = TokenServer(tmp_path / "token", {"carol": "pw"})
    try:
        with LocalRegistry(tmp_path / "token-reg", token=tokens) as reg:
            ref = f"{reg.host}/tok/py:v1"
            creds = auth_file(tmp_path / "creds.json", reg.host, "carol", "pw")
            vmstore(store_a, "push", "d1", ref, "--plain-http", env=environ_with_auth(creds))
            assert "carol" in tokens.issued
            r = vmstore(tmp_path / "H", "pull", ref, "--plain-http", env=environ_with_auth(None), check=False)
            assert r.returncode == 1 and "refused access with anonymous credentials" in r.stderr, r.stderr
            token = tokens.token("carol", ["repository:tok/py:pull"])
            bearer = tmp_path / "bearer.json"
            bearer.write_text(json.dumps({"auths": {reg.host: {"registrytoken": token}}}))
            got = vmstore_json(tmp_path / "H", "pull", ref, "--plain-http", env=environ_with_auth(bearer))
            assert got["name"] == "d1" and layer_names(tmp_path / "H") == ["d1", "golden"]
    finally:
        tokens.close()


def test_https_by_default(chain, tmp_path):
    """A registry with a certificate from a throwaway CA: refused until the CA is trusted
    (SSL_CERT_FILE), then push and pull over HTTPS without --plain-http."""
    store_a, _ = chain
    with LocalRegistry(tmp_path / "tls-reg", tls=True) as reg:
        ref = f"{reg.host}/secure/py:v1"
        r = vmstore(store_a, "push", "d1", ref, check=False)
        assert r.returncode == 1 and "https://" in r.stderr and "certificate" in r.stderr, r.stderr
        env = environ_with_auth(None)
        env["SSL_CERT_FILE"] = str(reg.ca)
        vmstore(store_a, "push", "d1", ref, env=env)
        got = vmstore_json(tmp_path / "G", "pull", ref, env=env)
        assert got["name"] == "d1" and [layer["status"] for layer in got["layers"]] == ["pulled", "pulled"]
