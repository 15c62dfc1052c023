"""`vmstore push` / `vmstore pull` against a hostile registry (ignition.hostile_registry): every
attack ends in a bounded failure, not a hang and not all of the host's memory.

Each run of vmstore is wrapped in `prlimit --as=512MiB` (normal pushes and pulls fit: the first
tests show it) with short transfer limits (the flags below), and must exit 1 within HANG_S with an
error naming the problem; after a failed pull nothing is committed, no work directory is left and
`vmstore verify --all` passes. The chain is golden (a full layer of 8 MiB of RAM) and d1 (a diff),
written with the `vmstore` Python module (pip install ./snapshot-store/python). The assertions are
on outcomes (exit status, message, what the registry saw), never on how long anything took; the
time limit only catches a hang.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ignition import paths
from ignition.hostile_registry import HostileRegistry
from ignition.registry import environ_with_auth
from ignition.store import layer_names, work_entries

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) not installed"),
]

MEMORY_LIMIT = 512 << 20
"""Address space vmstore may use (prlimit --as): far above a normal push or pull, far below what an
unbounded read takes."""
LIMITS = ["--connect-timeout", "2", "--idle-timeout", "2", "--request-timeout", "4", "--min-rate", "100000"]
"""Short transfer limits: 2 s to connect, 2 s idle, 4 s per request plus its bytes at ~100 MB/s."""
HANG_S = 60
"""A run taking longer than this is a hang (about 10 times the longest limit above)."""
REPO = "hostile/py"
RAM = 8 << 20


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A store with golden (full, 8 MiB of RAM, half of it random) and d1 (a diff of 16 pages)."""
    vm = pytest.importorskip("vmstore", reason="pip install ./snapshot-store/python")
    root = tmp_path_factory.mktemp("hostile-src") / "S"
    s = vm.Store.create(str(root))
    ram = bytearray(os.urandom(RAM // 2)) + bytearray(RAM // 2)
    s.write_full("golden", ram, b"golden state")
    for p in range(16):
        ram[p * 16384] ^= 0xFF
    s.write_diff("d1", "golden", ram, list(range(16)), b"d1 state")
    return root


def vmstore(store: Path, *args: str, retries: int = 0, env: dict | None = None) -> subprocess.CompletedProcess:
    """vmstore under the memory limit with the short limits and `retries`; fails the test on a hang."""
    cmd = ["prlimit", f"--as={MEMORY_LIMIT}", "--", str(paths.vmstore_bin()), "--store", str(store), *args]
    if args[0] in ("push", "pull"):
        cmd += [*LIMITS, "--retries", str(retries), "--plain-http"]
    try:
        return subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=HANG_S,
            stdin=subprocess.DEVNULL,
            env=env if env is not None else environ_with_auth(None),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"vmstore {' '.join(args)} still running after {HANG_S} s")


def ok(r: subprocess.CompletedProcess) -> dict:
    assert r.returncode == 0, r.stdout + r.stderr
    doc: dict = json.loads(r.stdout)
    return doc


def refused(r: subprocess.CompletedProcess, *words: str) -> str:
    """Asserts a clean failure (exit 1, not a signal: no abort on allocation failure) whose error
    names every one of `words`; returns stderr."""
    assert r.returncode == 1, f"exit {r.returncode}: {r.stdout}{r.stderr}"
    for w in words:
        assert w in r.stderr, f"{w!r} not in: {r.stderr}"
    return r.stderr


def nothing_committed(store: Path) -> None:
    assert layer_names(store) == [] and work_entries(store) == [], os.listdir(store)
    v = ok(vmstore(store, "verify", "--all", "--json"))
    assert v["ok"] is True


@pytest.fixture
def reg(source):
    """A hostile registry (honest for now) holding golden <- d1 as REPO:v1."""
    with HostileRegistry() as r:
        ok(vmstore(source, "push", "d1", f"{r.host}/{REPO}:v1", "--json"))
        yield r


def blob_of(reg: HostileRegistry, file: str, tag: str = "v1") -> tuple[str, int]:
    """(digest, size) of the top layer's blob of `file`."""
    m = reg.manifest(REPO, tag)
    (d,) = [x for x in m["layers"] if x["annotations"]["org.opencontainers.image.title"] == file]
    return d["digest"], d["size"]


def test_normal_push_and_pull_fit_the_memory_limit(source, reg, tmp_path):
    store = tmp_path / "B"
    got = ok(vmstore(store, "pull", f"{reg.host}/{REPO}:v1", "--json"))
    assert [(x["name"], x["status"]) for x in got["layers"]] == [("golden", "pulled"), ("d1", "pulled")]
    assert ok(vmstore(store, "verify", "--all", "--json"))["ok"] is True
    rep = ok(vmstore(source, "push", "d1", f"{reg.host}/{REPO}:v2", "--compress", "zstd", "--json"))
    assert rep["compression"] == "zstd"
    got = ok(vmstore(tmp_path / "C", "pull", f"{reg.host}/{REPO}:v2", "--json"))
    assert got["name"] == "d1" and got["file_bytes"] > got["bytes_received"]


def test_bearer_tokens_from_the_registry(source, tmp_path):
    with HostileRegistry(tokens=True) as r:
        ok(vmstore(source, "push", "d1", f"{r.host}/{REPO}:v1", "--json"))
        assert r.count("token") >= 1
        got = ok(vmstore(tmp_path / "B", "pull", f"{r.host}/{REPO}:v1", "--json"))
        assert got["name"] == "d1"


@pytest.mark.parametrize("attack", ["endless", "huge-length"])
def test_a_manifest_without_end(reg, tmp_path, attack):
    reg.attack(attack, on="manifest-get")
    store = tmp_path / "P"
    refused(vmstore(store, "pull", f"{reg.host}/{REPO}:v1"), f"manifest from {reg.host}/{REPO}:v1 exceeds 4 MiB")
    nothing_committed(store)


def test_an_endless_error_body(reg, tmp_path):
    """A 500 whose body never ends: its first 64 KiB make the message, and the GET is retried
    (it is idempotent, and a 500 may pass) as many times as --retries says."""
    reg.attack("endless-error", on="manifest-get")
    store = tmp_path / "P"
    err = refused(
        vmstore(store, "pull", f"{reg.host}/{REPO}:v1", retries=1),
        "HTTP 500",
        "error body cut",
        "gave up after 2 attempts",
    )
    assert "UNKNOWN" in err and len(err) < 4096
    assert reg.count("manifest-get") == 2
    nothing_committed(store)


def test_a_token_endpoint_without_end(source, tmp_path):
    with HostileRegistry(tokens=True) as r:
        ok(vmstore(source, "push", "d1", f"{r.host}/{REPO}:v1", "--json"))
        r.attack("endless", on="token")
        store = tmp_path / "P"
        refused(vmstore(store, "pull", f"{r.host}/{REPO}:v1"), f"the token from {r.host} exceeds 1 MiB")
        nothing_committed(store)
        r.attack("huge-length", on="token")
        refused(vmstore(source, "push", "d1", f"{r.host}/{REPO}:v2"), "exceeds 1 MiB")


def test_a_registry_that_never_answers(reg, tmp_path):
    reg.attack("silent", on="version")
    store = tmp_path / "P"
    refused(
        vmstore(store, "pull", f"{reg.host}/{REPO}:v1"),
        f"GET http://{reg.host}/v2/",
        f"no byte from {reg.host} for 2 s while waiting for the answer",
    )
    nothing_committed(store)


@pytest.mark.parametrize("on", ["manifest-get", "blob-get"])
def test_a_registry_that_drips_a_byte_a_second(reg, tmp_path, on):
    """Each byte comes before the idle timeout: the request's deadline ends it."""
    digest, _ = blob_of(reg, "memory.bin")
    reg.attack("drip", on=on, digest=digest if on == "blob-get" else None)
    store = tmp_path / "P"
    doing = f"reading manifest from {reg.host}/{REPO}:v1" if on == "manifest-get" else f"reading blob {digest}"
    refused(vmstore(store, "pull", f"{reg.host}/{REPO}:v1"), "not complete after", doing)
    nothing_committed(store)


def test_a_redirect_loop(reg, tmp_path):
    reg.attack("redirect-loop", on="manifest-get")
    store = tmp_path / "P"
    refused(vmstore(store, "pull", f"{reg.host}/{REPO}:v1"), "more than 5 redirects")
    assert reg.count("manifest-get") == 6
    nothing_committed(store)


def test_a_blob_whose_bytes_do_not_match_its_digest(reg, tmp_path):
    """d1's memory blob: golden arrived whole before, and still nothing is committed; a digest
    mismatch is not retried."""
    digest, size = blob_of(reg, "memory.bin")
    reg.attack("wrong-bytes", on="blob-get", digest=digest)
    store = tmp_path / "P"
    refused(
        vmstore(store, "pull", f"{reg.host}/{REPO}:v1", retries=2),
        digest,
        "layer 'd1'",
        "corrupted or truncated",
        "nothing committed",
    )
    assert reg.count("blob-get", digest) == 1
    nothing_committed(store)


def test_a_blob_longer_than_its_descriptor(reg, tmp_path):
    digest, size = blob_of(reg, "memory.bin")
    reg.attack("longer", on="blob-get", digest=digest)
    store = tmp_path / "P"
    refused(vmstore(store, "pull", f"{reg.host}/{REPO}:v1"), f"blob {digest}", f"longer than its declared {size} bytes")
    nothing_committed(store)


@pytest.mark.parametrize("what", ["zstd-blob", "config"])
def test_a_manifest_declaring_absurd_sizes(source, reg, tmp_path, what):
    """A zstd blob declared 10^18 bytes long (served as zstd skippable frames without end, which a
    decoder takes forever without writing a byte), or a config blob of 10^12 bytes: refused from
    the manifest, before any byte of that blob is asked for."""
    ok(vmstore(source, "push", "d1", f"{reg.host}/{REPO}:z", "--compress", "zstd", "--json"))
    m = reg.manifest(REPO, "z")
    if what == "zstd-blob":
        (d,) = [x for x in m["layers"] if x["annotations"]["org.opencontainers.image.title"] == "memory.bin"]
        d["size"] = 10**18
        reg.attack("skippable-frames", on="blob-get", digest=d["digest"])
        words = ["declares 1000000000000000000 bytes", "more than a zstd frame"]
    else:
        d = m["config"]
        d["size"] = 10**12
        reg.attack("endless", on="blob-get", digest=d["digest"])
        words = ["is 1000000000000 bytes, more than 1048576"]
    reg.put_manifest(REPO, "z", m)
    store = tmp_path / "P"
    refused(vmstore(store, "pull", f"{reg.host}/{REPO}:z"), *words)
    assert reg.count("blob-get", d["digest"]) == 0
    nothing_committed(store)


@pytest.mark.parametrize("attack", ["fail-once", "cut-once"])
def test_a_blob_download_that_fails_once_is_retried_from_its_start(reg, tmp_path, attack):
    digest, _ = blob_of(reg, "memory.bin")
    reg.attack(attack, on="blob-get", digest=digest)
    store = tmp_path / "P"
    got = ok(vmstore(store, "pull", f"{reg.host}/{REPO}:v1", "--json", retries=1))
    assert got["name"] == "d1" and reg.count("blob-get", digest) == 2
    assert ok(vmstore(store, "verify", "--all", "--json"))["ok"] is True and work_entries(store) == []


@pytest.mark.parametrize(
    "attack,on,words",
    [
        ("endless-error", "upload-start", ["POST http://", "HTTP 500", "error body cut"]),
        ("endless-error", "manifest-put", ["PUT http://", "HTTP 500", "error body cut"]),
        ("silent", "upload-put", ["no byte from", "while waiting for the answer"]),
        ("silent", "blob-head", ["HEAD http://", "no byte from"]),
    ],
)
def test_push_to_a_hostile_registry(source, tmp_path, attack, on, words):
    """A fresh registry (so that every blob is sent): the attacked request fails bounded, the
    source store is untouched and keeps no work directory."""
    with HostileRegistry() as r:
        r.attack(attack, on=on)
        refused(vmstore(source, "push", "d1", f"{r.host}/{REPO}:v1"), *words)
    assert work_entries(source) == [] and layer_names(source) == ["d1", "golden"]
    assert ok(vmstore(source, "verify", "--all", "--json"))["ok"] is True


def test_an_upload_that_fails_once_is_restarted(source, tmp_path):
    with HostileRegistry() as r:
        r.attack("fail-once", on="upload-put", status=500)
        rep = ok(vmstore(source, "push", "d1", f"{r.host}/{REPO}:v1", "--json", retries=1))
        assert rep["bytes_sent"] > 0 and r.count("upload-start") == r.count("upload-put")
        assert r.count("upload-put") == sum(1 for x in rep["layers"] for b in x["blobs"] if b["status"] == "sent") + 1
