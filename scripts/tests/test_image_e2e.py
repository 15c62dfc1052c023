"""End-to-end: an OCI image made here from Debian arm64 packages (busybox-static, then
python3-minimal and its libraries, as two layers with whiteouts, behind an index that also names
an amd64 manifest), pushed to the local test registry with skopeo, made into a root file system
by `python3 -m ignition.image build` (the image pulled by `vmstore image-pull`), booted with the
project's kernel: the image's Entrypoint ran with its Env in its WorkingDir, `python3 -c` runs
through the guest agent, and the VM snapshots and restores.

The packages come from apt (arm64 a dpkg foreign architecture), cached as ignition.debian_guest
caches its own; skipped where apt has no arm64 packages, skopeo or the registry is missing.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ignition import debian_guest, image, net
from ignition.branch import Child
from ignition.registry import REGISTRY_BIN, LocalRegistry
from ignition.vm import Vm

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not REGISTRY_BIN.is_file(), reason=f"no registry at {REGISTRY_BIN} (scripts/setup.sh)"),
    pytest.mark.skipif(shutil.which("skopeo") is None, reason="no skopeo (scripts/setup.sh)"),
]

BASE = ("busybox-static", "libc6", "zlib1g", "libexpat1", "libssl3")
PYTHON = ("libpython3.11-minimal", "python3.11-minimal", "python3-minimal")
APPLETS = (
    "sh",
    "cat",
    "ls",
    "sleep",
    "sync",
    "test",
    "env",
    "tr",
    "ifconfig",
    "route",
    "grep",
    "awk",
    "wget",
    "sha256sum",
)
GREETING = "hello from an OCI image"


def unpack(debs: list[Path], root: Path) -> None:
    for deb in debs:
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)


def layer_tar(root: Path, extra: list[tarfile.TarInfo]) -> bytes:
    """root's tree as a tar (owner root, no leading ./), then the extra entries."""

    def owned(ti: tarfile.TarInfo) -> tarfile.TarInfo:
        ti.uid = ti.gid = 0
        ti.uname = ti.gname = "root"
        return ti

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for p in sorted(root.rglob("*")):
            t.add(p, arcname=str(p.relative_to(root)), recursive=False, filter=owned)
        for ti in extra:
            t.addfile(ti, io.BytesIO(b"x" * ti.size) if ti.isreg() else None)
    return buf.getvalue()


def entry(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "") -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.linkname, ti.mode = kind, linkname, 0o755 if kind == tarfile.DIRTYPE else 0o644
    ti.size = 1 if kind == tarfile.REGTYPE else 0
    return ti


class Layout:
    """An OCI image layout being written: blobs by digest."""

    def __init__(self, root: Path):
        self.root = root
        (root / "blobs" / "sha256").mkdir(parents=True)
        (root / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')

    def blob(self, data: bytes, media_type: str, **extra: object) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (self.root / "blobs" / "sha256" / digest).write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data), **extra}


def make_image(work: Path) -> Path:
    """The test image's OCI layout (tag v1, an index of arm64 and amd64), from apt's packages."""
    cache = debian_guest.cache_dir()
    debs = {p: debian_guest.download(p, debian_guest.package_version(p), cache) for p in BASE + PYTHON}
    base, py = work / "base", work / "python"
    unpack([debs[p] for p in BASE], base)
    unpack([debs[p] for p in PYTHON], py)
    links = [entry(f"bin/{a}", tarfile.SYMTYPE, "busybox") for a in APPLETS]
    lower = [*links, entry("etc/gone"), entry("opt/old", tarfile.DIRTYPE), entry("opt/old/lower")]
    upper = [
        entry("etc/.wh.gone"),
        entry("opt/old/.wh..wh..opq"),
        entry("opt/old/upper"),
    ]  # no /srv/app: the WorkingDir is made by the build
    tars = [layer_tar(base, lower), layer_tar(py, upper)]
    lay = Layout(work / "layout")
    layers = [lay.blob(gzip.compress(t, 1), "application/vnd.oci.image.layer.v1.tar+gzip") for t in tars]
    manifests = []
    for arch in ("amd64", "arm64"):
        config = {
            "architecture": arch,
            "os": "linux",
            "config": {
                "Entrypoint": ["/bin/sh", "-c"],
                "Cmd": ['echo "$GREETING in $(pwd)" > started; exec sleep 1000000'],
                "Env": ["PATH=/usr/bin:/bin", f"GREETING={GREETING}"],
                "WorkingDir": "/srv/app",
            },
            "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(t).hexdigest()}" for t in tars]},
        }
        cfg = lay.blob(json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
        m = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": cfg,
            "layers": layers,
        }
        manifests.append(
            lay.blob(
                json.dumps(m).encode(),
                "application/vnd.oci.image.manifest.v1+json",
                platform={"architecture": arch, "os": "linux"},
            )
        )
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": manifests}
    top = lay.blob(
        json.dumps(index).encode(),
        "application/vnd.oci.image.index.v1+json",
        annotations={"org.opencontainers.image.ref.name": "v1"},
    )
    (lay.root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return lay.root


@pytest.fixture(scope="module")
def pushed(tmp_path_factory) -> Iterator[str]:
    if shutil.which("apt-cache") is None:
        pytest.skip("no apt: Debian's packages are out of reach")
    try:
        debian_guest.package_version("python3-minimal")
    except debian_guest.DebianGuestError as e:
        pytest.skip(str(e))
    work = tmp_path_factory.mktemp("image")
    layout = make_image(work)
    with LocalRegistry(tmp_path_factory.mktemp("registry")) as reg:
        ref = f"{reg.host}/test/python:v1"
        r = subprocess.run(
            ["skopeo", "copy", "--all", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{ref}"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert r.returncode == 0, r.stderr
        yield ref


def test_image_pull_resolves_the_index_to_arm64(pushed, vmstore_bin, tmp_path):
    r = subprocess.run(
        [str(vmstore_bin), "image-pull", pushed, str(tmp_path / "l"), "--plain-http", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["index_digest"] and doc["index_digest"] != doc["digest"]
    assert [b["status"] for b in doc["layers"]] == ["pulled", "pulled"]
    config = json.loads((tmp_path / "l/blobs/sha256" / doc["config"]["digest"][7:]).read_bytes())
    assert config["architecture"] == "arm64"
    index = json.loads((tmp_path / "l/index.json").read_text())
    assert index["manifests"][0]["digest"] == doc["digest"]
    again = subprocess.run(
        [str(vmstore_bin), "image-pull", pushed, str(tmp_path / "l"), "--plain-http", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert {b["status"] for b in json.loads(again.stdout)["layers"]} == {"present"}
    amd = subprocess.run(
        [str(vmstore_bin), "image-pull", pushed, str(tmp_path / "a"), "--plain-http", "--platform", "linux/riscv64"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert amd.returncode == 1 and "no manifest for linux/riscv64 (it has: linux/amd64, linux/arm64)" in amd.stderr
    # Over the bound on the blobs' declared sizes: refused before any blob is fetched.
    small = subprocess.run(
        [str(vmstore_bin), "image-pull", pushed, str(tmp_path / "s"), "--plain-http", "--max-bytes", "1000"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert small.returncode == 1 and "more than the bound of 1000 (--max-bytes)" in small.stderr, small.stderr
    assert not (tmp_path / "s").exists()
    # The amd64 manifest, named by its digest (no index to choose from): refused by its config.
    amd64 = subprocess.run(
        [str(vmstore_bin), "image-pull", pushed, str(tmp_path / "l"), "--plain-http", "--platform", "linux/amd64"]
        + ["--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    by_digest = f"{pushed.rsplit(':', 1)[0]}@{json.loads(amd64.stdout)['digest']}"
    with pytest.raises(image.ImageError, match="the image is for linux/amd64, not linux/arm64"):
        image.build(by_digest, tmp_path / "x.ext4", plain_http=True, cache=tmp_path / "c", vmstore=vmstore_bin)


def test_concurrent_pulls_and_builds_of_one_image_share_a_cache_intact(pushed, vmstore_bin, tmp_path):
    """Processes pulling (and building) the same image into one cache at once each write a
    blob to a temporary file of their own and rename it into place: all succeed, and every blob
    in the layout is whole (its digest is its name), with no temporary file left."""
    layout = tmp_path / "layout"
    pulls = [
        subprocess.Popen(
            [str(vmstore_bin), "image-pull", pushed, str(layout), "--plain-http", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    reports = []
    for proc in pulls:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    assert len({r["digest"] for r in reports}) == 1
    blobs = sorted((layout / "blobs" / "sha256").iterdir())
    assert {b.name for b in blobs} >= {x["digest"][7:] for x in [reports[0]["config"], *reports[0]["layers"]]}
    for b in blobs:
        assert hashlib.sha256(b.read_bytes()).hexdigest() == b.name
    assert not [f for f in layout.rglob("*") if f.name.endswith(".partial")]
    # Two builds of the image into one (empty) cache and to one output file, at once.
    cache = tmp_path / "cache"
    env = dict(os.environ, PYTHONPATH=str(Path(image.__file__).parent.parent), IGNITION_VMSTORE=str(vmstore_bin))
    builds = [
        subprocess.Popen(
            [sys.executable, "-m", "ignition.image", "build", pushed, "-o", str(out), "--plain-http"]
            + ["--cache", str(cache)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for out in (tmp_path / "a.ext4", tmp_path / "a.ext4", tmp_path / "b.ext4")
    ]
    for proc in builds:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    assert (tmp_path / "a.ext4").read_bytes() == (tmp_path / "b.ext4").read_bytes()
    fsck = subprocess.run(["e2fsck", "-fn", str(tmp_path / "a.ext4")], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout
    for b in (cache / "oci" / "blobs" / "sha256").iterdir():
        assert hashlib.sha256(b.read_bytes()).hexdigest() == b.name
    leftovers = [f for f in [*cache.rglob("*"), *tmp_path.iterdir()] if f.name.endswith(".partial")]
    assert not leftovers, leftovers


@pytest.fixture(scope="module")
def cache(pushed, vmstore_bin, tmp_path_factory) -> Path:
    """An image cache holding the test image's root file system, built once."""
    d = tmp_path_factory.mktemp("cache")
    built = image.build(pushed, d / "first.ext4", plain_http=True, cache=d, vmstore=vmstore_bin)
    assert not built.cached
    return d


def test_a_second_build_comes_from_the_cache(pushed, cache, vmstore_bin, tmp_path):
    first = cache / "first.ext4"
    again = image.build(pushed, tmp_path / "again.ext4", plain_http=True, cache=cache, vmstore=vmstore_bin)
    assert again.cached and again.digest.startswith("sha256:")
    assert [p.name for p in (cache / "rootfs").glob("*.ext4")][0].startswith(again.digest[7:])
    assert (tmp_path / "again.ext4").read_bytes() == first.read_bytes()
    fsck = subprocess.run(["e2fsck", "-fn", str(first)], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout


def disk_of(pushed: str, cache: Path, vmstore_bin: Path, tmp_path: Path) -> Path:
    disk = tmp_path / "rootfs.ext4"
    assert image.build(pushed, disk, plain_http=True, cache=cache, vmstore=vmstore_bin).cached
    return disk


def test_the_image_boots_runs_python_and_restores(pushed, cache, cfg, vmstore_bin, tmp_path):
    disk = disk_of(pushed, cache, vmstore_bin, tmp_path)
    store = tmp_path / "store"
    with Vm.boot(cfg, disk=disk, log_path=tmp_path / "console.log", store=store, agent=True) as vm:
        vm.wait_ready()
        r = vm.exec(["python3", "-c", "import sys, os; print(6 * 7, sys.platform, os.getcwd())"], cwd="/")
        assert r.check().stdout.decode() == "42 linux /\n"
        # The Entrypoint's shell writes its file once it runs: wait for it (not a timing check).
        deadline = time.monotonic() + vm.timeouts.cmd
        while vm.exec(["test", "-e", "/srv/app/started"]).exit_code != 0:
            assert time.monotonic() < deadline, "the image's Entrypoint did not run"
            time.sleep(0.2)
        assert vm.run("cat /srv/app/started") == f"{GREETING} in /srv/app"
        # Whiteouts: a file of the lower layer removed, a directory made opaque.
        assert vm.exec(["test", "-e", "/etc/gone"]).exit_code == 1
        assert vm.run("ls /opt/old") == "upper"
        assert vm.run("cat /proc/1/cmdline | tr '\\0' ' '").startswith("/.ignition/busybox sh /sbin/init")
        vm.write_file("/root-marker", b"kept")
        vm.run("sync")
        assert vm.snapshot("oci").kind == "full"
        assert vm.quit() == 0
    with Vm.restore(cfg, "oci", store=store, log_path=tmp_path / "restored.log", agent=True) as vm:
        assert vm.read_file("/root-marker") == b"kept"
        r = vm.exec(["python3", "-c", "print(sum(range(10)))"])
        assert r.check().stdout == b"45\n"
        assert vm.quit() == 0


def test_the_image_branches(pushed, cache, cfg, vmstore_bin, tmp_path):
    disk = disk_of(pushed, cache, vmstore_bin, tmp_path)
    store = tmp_path / "store"
    with Vm.boot(
        cfg, disk=disk, mem=256, store=store, name="src", track_dirty=True, agent=True, log_path=tmp_path / "src.log"
    ) as vm:
        vm.wait_ready()
        vm.exec(["python3", "-c", "open('/srv/app/state', 'w').write('from the source')"]).check()
        children = vm.branch(2, name="b")
        assert [c.name for c in children] == ["b-1", "b-2"]
        for c in children:
            assert c.read_file("/srv/app/state") == b"from the source"
            code = f"import sys; sys.stdout.write(open('/etc/machine-id').read().strip() + ' {c.name}')"
            out = c.exec(["python3", "-c", code]).check().stdout.decode()
            assert out.endswith(f" {c.name}")
        machine_ids = {c.exec(["cat", "/etc/machine-id"]).check().stdout for c in children}
        assert len(machine_ids) == 2


def test_the_image_gets_its_network_by_dhcp(pushed, cache, cfg, vmstore_bin, tmp_path):
    if net.passt_bin() is None:
        pytest.skip("no passt (scripts/setup.sh installs it on Linux)")
    disk = disk_of(pushed, cache, vmstore_bin, tmp_path)
    page = os.urandom(100_000)
    with net.Passt(tmp_path) as passt, net.LoopbackHttp() as http:
        page_sum = http.add("page", page)
        with Vm.boot(
            cfg, disk=disk, agent=True, extra=["--net", f"stream:{passt.socket}"], log_path=tmp_path / "net.log"
        ) as vm:
            vm.wait_ready()
            vm.run(net.LEASE_WAIT_CMD, timeout=120)
            gw = vm.run(net.GATEWAY_CMD)
            assert gw, "no default route from the lease"
            assert vm.run("cat /run/udhcpc.eth0.pid").isdigit()
            assert vm.run(f"wget -q -O - http://{gw}:{http.port}/page | sha256sum").split()[0] == page_sum
            assert vm.quit() == 0


def test_branch_children_of_the_image_on_a_bridge_lease_their_own_addresses(pushed, cache, cfg, vmstore_bin, tmp_path):
    """On a bridge (TAP interfaces in a network namespace: root only) the image's source serves
    DHCP from a fixed address and branches into two children, each on a TAP interface of its
    own: each child's eth0 has the MAC the branch gave it and a lease of its own, which the
    agent asked for with the build's network tools (/.ignition: the image has no `ip` or
    `udhcpc`), and the children reach each other."""
    if not net.Bridge.available():
        pytest.skip("TAP interfaces on a bridge in a network namespace need root and iproute2")
    disk = disk_of(pushed, cache, vmstore_bin, tmp_path)
    store = tmp_path / "store"
    bb = image.BUSYBOX
    children: list[Child] = []
    with net.Bridge(tmp_path, ("tap0", "vm1", "vm2"), name=f"ignition-image-{os.getpid()}") as br:
        bcfg = dataclasses.replace(cfg, boot=br.wrap(cfg.boot))
        with Vm.boot(
            bcfg,
            disk=disk,
            mem=256,
            store=store,
            name="src",
            track_dirty=True,
            agent=True,
            extra=["--net", "tap:tap0"],
            log_path=tmp_path / "src.log",
        ) as vm:
            vm.wait_ready()
            try:
                assert vm.run("ls /bin/ip /bin/udhcpc /sbin/ip /sbin/udhcpc /usr/bin/ip 2>/dev/null; true") == ""
                source_mac = net.serve_dhcp_on_bridge(vm, bb)
                children = vm.branch(2, name="t", net="tap:vm{i}")
                net.check_bridge_children(children, source_mac, bb)
                for c in children:
                    # The lease is kept by the udhcpc the agent started, from /.ignition.
                    pid = c.run("cat /run/udhcpc.eth0.pid")
                    assert c.run(f"tr '\\0' ' ' </proc/{pid}/cmdline").startswith("/.ignition/udhcpc -i eth0")
            finally:
                for c in children:
                    c.stop()
