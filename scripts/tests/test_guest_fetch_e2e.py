"""guest/push.sh and guest/fetch.sh (vmstore push-files / pull-files) against the local test
registry (scripts/ignition/registry.py): a guest directory goes up as one OCI artifact and
comes back byte for byte into another; nothing is sent twice; a corrupted blob or a file that
does not match guest.json fails and leaves no partial file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from ignition import paths
from ignition.registry import REGISTRY_BIN, LocalRegistry

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not REGISTRY_BIN.is_file(), reason=f"no registry at {REGISTRY_BIN} (scripts/setup.sh)"),
]

FILES = ["Image", "rootfs.ext4", "conformance/sgi.Image", "conformance/vtimer.Image"]


def make_guest(d: Path, seed: int) -> dict[str, bytes]:
    """A guest-shaped directory (random bytes) with a guest.json recording Image's and rootfs's sha256."""
    data = {f: os.urandom(4096 * (i + 1)) + bytes([seed]) for i, f in enumerate(FILES)}
    for f, b in data.items():
        (d / f).parent.mkdir(parents=True, exist_ok=True)
        (d / f).write_bytes(b)
    record = {"files": {f: {"sha256": hashlib.sha256(data[f]).hexdigest(), "size": len(data[f])} for f in FILES[:2]}}
    (d / "guest.json").write_text(json.dumps(record))
    return data


def script(name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, VMSTORE=str(paths.vmstore_bin()))
    r = subprocess.run(
        [str(paths.REPO_ROOT / "guest" / name), *args], capture_output=True, text=True, timeout=300, env=env
    )
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        yield reg


def test_a_pushed_guest_is_fetched_byte_for_byte(registry, vmstore_bin, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    data = make_guest(src, 1)
    ref = f"{registry.host}/ignition/guest:v1"
    r = script("push.sh", ref, "--plain-http", "--out", str(src))
    assert "pushed 5 file(s)" in r.stdout, r.stdout
    r = script("fetch.sh", ref, "--plain-http", "--out", str(dst))
    assert "Image, rootfs.ext4 match guest.json" in r.stdout, r.stdout
    for f, b in data.items():
        assert (dst / f).read_bytes() == b, f
    assert (dst / "guest.json").read_bytes() == (src / "guest.json").read_bytes()
    assert not list(dst.rglob(".*.partial"))
    # Pushed again: every blob is there already.
    again = subprocess.run(
        [str(vmstore_bin), "push-files", str(src), ref, *FILES, "guest.json", "--plain-http", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stderr
    doc = json.loads(again.stdout)
    assert {f["status"] for f in doc["files"]} == {"present"}
    assert [f["name"] for f in doc["files"]] == [*FILES, "guest.json"]


def test_a_corrupted_blob_fails_the_fetch_and_leaves_the_old_file(registry, vmstore_bin, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    data = make_guest(src, 2)
    ref = f"{registry.host}/ignition/guest:bad"
    script("push.sh", ref, "--plain-http", "--out", str(src))
    digest = "sha256:" + hashlib.sha256(data["Image"]).hexdigest()
    blob = registry.blob_path(digest)
    damaged = bytearray(blob.read_bytes())
    damaged[100] ^= 0xFF
    blob.write_bytes(bytes(damaged))
    (dst / "Image").write_bytes(b"old")
    r = script("fetch.sh", ref, "--plain-http", "--out", str(dst), check=False)
    assert r.returncode != 0
    assert digest in r.stderr and "corrupted or truncated" in r.stderr, r.stderr
    assert (dst / "Image").read_bytes() == b"old"
    assert not list(dst.rglob(".*.partial"))


def test_a_file_that_does_not_match_guest_json_fails_the_fetch(registry, tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    make_guest(src, 3)
    (src / "rootfs.ext4").write_bytes(b"another root file system")
    ref = f"{registry.host}/ignition/guest:mismatch"
    script("push.sh", ref, "--plain-http", "--out", str(src))
    r = script("fetch.sh", ref, "--plain-http", "--out", str(dst), check=False)
    assert r.returncode != 0 and "rootfs.ext4 does not match guest.json" in r.stderr, r.stdout + r.stderr


def test_push_refuses_a_missing_guest_and_a_path_outside_the_directory(registry, vmstore_bin, tmp_path):
    r = script("push.sh", f"{registry.host}/ignition/guest:x", "--plain-http", "--out", str(tmp_path), check=False)
    assert r.returncode == 1 and "Image missing: run guest/build.sh" in r.stderr
    bad = subprocess.run(
        [str(vmstore_bin), "push-files", str(tmp_path), f"{registry.host}/x/y:z", "../etc/passwd", "--plain-http"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "is not a relative path of plain names" in bad.stderr, bad.stderr
