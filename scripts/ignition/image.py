"""Root file systems from OCI container images: `python3 -m ignition.image build REF -o rootfs.ext4`.

The image is pulled for linux/arm64 by `vmstore image-pull` (the project's registry client: its
credentials, transfer limits and digest checks; an index resolved to the arm64 manifest) into a
blob cache. Its layers are applied in order into a staging directory, OCI whiteouts honoured
(`.wh.NAME` removes NAME from the layers below, `.wh..wh..opq` empties a directory of them), and
the guest's pieces added: the guest agent (`/bin/ignition-agent`), a static busybox
(`/.ignition/busybox`, with `/.ignition/ip` and `/.ignition/udhcpc` linked to it and udhcpc's
event script: the init's and the agent's network tools, whatever the image has in /bin) and the
init (`/sbin/init`), which mounts /proc, /sys and /dev, configures eth0 by DHCP if the VM has
one, starts the agent, prints READY_LINE and runs the image's Entrypoint and Cmd with its Env in
its WorkingDir. `mkfs.ext4 -d` writes the ext4 image and `debugfs` sets each inode's mode and
owner and makes the device nodes, so no root, loop mount or arm64 code is needed on the host.
Built images are cached by the image's manifest digest (and the build's inputs).

The registry work is Rust's (vmstore: the credentials, limits and retries `vmstore pull` has);
the rest is here, beside ignition.debian_guest and the guest's e2fsprogs steps, because it drives
host tools (mkfs.ext4, debugfs, zstd) and reads the project's guest files, and Python's tarfile
reads tars (pax, GNU long names, sparse files) without extracting them.

Layers are untrusted input: an entry whose name leaves the root (`..`) is refused, symbolic links
are written as they are and resolved only inside the staging root (an absolute target means the
image's root), never followed on the host; the unpacked bytes, the number of entries and the size
of a tar header are bounded; every error names the layer (its index and digest).
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol, cast

from . import paths

PLATFORM = "linux/arm64"
MAX_UNPACKED_BYTES = 16 << 30
"""Default bound on the bytes all layers unpack to (their tars, added up)."""
MAX_ENTRIES = 1 << 20
"""Most tar entries, all layers together."""
MAX_HEADER_BYTES = 16 << 20
"""Largest tar header read at once (a pax extended header, a GNU long name)."""
MAX_SYMLINK_HOPS = 40
INIT_VERSION = "4"
"""Changes whenever the init or the files added change: part of the cache key."""
READY_LINE = "init: ready"
"""What the init prints on the console once it has mounted, configured the network, written the
boot timer and started the guest agent, just before it runs the image's command: a readiness
marker any VMM's console shows (ignition.bench.guests times QEMU and Ignition by it)."""
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


class ImageError(Exception):
    """An image that cannot be pulled or made into a root file system; the message names the
    layer (index and digest) where one is at fault."""


@dataclass
class Meta:
    """An entry's metadata as the image gives it, applied once all layers are in."""

    mode: int
    uid: int
    gid: int
    mtime: int
    device: tuple[str, int, int] | None = None
    """('c'|'b', major, minor) for a device node, made by debugfs in the ext4 image."""


@dataclass
class Staging:
    """The image's tree being built under `root`: `meta` keyed by path relative to the root
    (`a/b`, no leading slash; '' is the root)."""

    root: Path
    meta: dict[str, Meta] = field(default_factory=dict)
    entries: int = 0
    layer_paths: set[str] = field(default_factory=set)
    """Paths the layer being applied has written (a whiteout removes only lower layers')."""

    @classmethod
    def new(cls, root: Path) -> Staging:
        """An empty tree at root (made here), its root directory root-owned, mode 0755."""
        root.mkdir(mode=0o700)
        st = cls(root)
        st.meta[""] = Meta(0o40755, 0, 0, 0)
        return st

    # ---- path handling: everything stays inside root, nothing on the host is followed
    def host(self, rel: str) -> Path:
        return self.root / rel if rel else self.root

    def resolve_dir(self, parts: list[str], what: str, create: bool) -> str:
        """The real directory `parts` names inside the image (its symbolic links resolved as the
        guest would, inside the root), as a path relative to root; missing directories are made
        when `create`."""
        todo = list(parts)
        done: list[str] = []
        hops = 0
        while todo:
            name = todo.pop(0)
            if name in ("", "."):
                continue
            if name == "..":
                if done:
                    done.pop()
                continue
            rel = "/".join([*done, name])
            p = self.host(rel)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                if not create:
                    raise ImageError(f"{what}: {rel} does not exist") from None
                os.mkdir(p, 0o700)
                self.meta.setdefault(rel, Meta(0o40755, 0, 0, 0))
                done.append(name)
                continue
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise ImageError(f"{what}: more than {MAX_SYMLINK_HOPS} symbolic links")
                target = os.readlink(p)
                if target.startswith("/"):
                    done = []
                todo = target.split("/") + todo
                continue
            if not stat.S_ISDIR(st.st_mode):
                raise ImageError(f"{what}: {rel} is not a directory")
            done.append(name)
        return "/".join(done)

    def remove(self, rel: str) -> None:
        """Removes rel (a directory with its contents) and its metadata."""
        p = self.host(rel)
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(p)
        else:
            os.unlink(p)
        prefix = rel + "/"
        for k in [k for k in self.meta if k == rel or k.startswith(prefix)]:
            del self.meta[k]

    # ---- layers
    def apply_layer(self, tar_path: Path, what: str) -> None:
        """Applies one layer's (uncompressed) tar."""
        self.layer_paths = set()
        with open(tar_path, "rb") as raw:
            f = _BoundedReads(raw, MAX_HEADER_BYTES, what)
            try:
                with tarfile.open(fileobj=cast(IO[bytes], f), mode="r:") as tar:
                    for member in tar:
                        self.entries += 1
                        if self.entries > MAX_ENTRIES:
                            raise ImageError(f"{what}: more than {MAX_ENTRIES} entries in the image")
                        self.apply_entry(tar, member, what)
                        # TarFile keeps every TarInfo it has read (`members`, not in the
                        # type stubs): dropped, so memory does not grow with the entries.
                        tar.members.clear()  # type: ignore[attr-defined]
            except (tarfile.TarError, EOFError) as e:
                raise ImageError(f"{what}: not a valid tar: {e}") from None

    def apply_entry(self, tar: tarfile.TarFile, m: tarfile.TarInfo, what: str) -> None:
        parts = [p for p in m.name.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ImageError(f"{what}: entry {m.name!r} leaves the root ('..')")
        if not parts:
            if m.isdir():
                self.meta[""] = Meta(stat.S_IFDIR | (m.mode & 0o7777), m.uid, m.gid, int(m.mtime))
            return
        entry = f"{what}: entry {m.name!r}"
        base = parts[-1]
        parent = self.resolve_dir(parts[:-1], entry, create=True)
        rel = f"{parent}/{base}" if parent else base
        if base == OPAQUE:
            for child in os.listdir(self.host(parent)):
                c = f"{parent}/{child}" if parent else child
                if c not in self.layer_paths:
                    self.remove(c)
            return
        if base.startswith(WHITEOUT):
            gone = base[len(WHITEOUT) :]
            if gone in ("", ".", ".."):
                raise ImageError(f"{entry}: a whiteout of {gone!r}")
            g = f"{parent}/{gone}" if parent else gone
            if g not in self.layer_paths:
                self.remove(g)
            return
        self.layer_paths.add(rel)
        p = self.host(rel)
        existing = _lstat(p)
        if not (m.isdir() and existing is not None and stat.S_ISDIR(existing.st_mode)):
            self.remove(rel)
        kind = stat.S_IFREG
        device = None
        if m.isdir():
            kind = stat.S_IFDIR
            if existing is None or not stat.S_ISDIR(existing.st_mode):
                os.mkdir(p, 0o700)
        elif m.issym():
            kind = stat.S_IFLNK
            os.symlink(m.linkname, p)
        elif m.islnk():
            tparts = [x for x in m.linkname.split("/") if x not in ("", ".")]
            if not tparts or ".." in tparts:
                raise ImageError(f"{entry}: hard link to {m.linkname!r} leaves the root")
            tparent = self.resolve_dir(tparts[:-1], entry, create=False)
            trel = f"{tparent}/{tparts[-1]}" if tparent else tparts[-1]
            st = _lstat(self.host(trel))
            if st is None or stat.S_ISDIR(st.st_mode):
                raise ImageError(f"{entry}: hard link to {m.linkname!r}, which is not a file of the image")
            os.link(self.host(trel), p, follow_symlinks=False)
            self.meta[rel] = self.meta.get(trel, Meta(st.st_mode, 0, 0, 0))
            return
        elif m.isreg():
            src = tar.extractfile(m)
            assert src is not None
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        elif m.isfifo():
            kind = stat.S_IFIFO
            os.mkfifo(p, 0o600)
        elif m.ischr() or m.isblk():
            kind = stat.S_IFCHR if m.ischr() else stat.S_IFBLK
            device = ("c" if m.ischr() else "b", m.devmajor, m.devminor)
            # A placeholder; debugfs makes the node in the ext4 image.
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        else:
            raise ImageError(f"{entry}: unsupported tar entry type {m.type!r}")
        self.meta[rel] = Meta(kind | (m.mode & 0o7777), m.uid, m.gid, int(m.mtime), device)

    # ---- the guest's pieces
    def add_file(self, rel: str, data: bytes, mode: int) -> None:
        """Writes the file `rel` (replacing what the image had there), root-owned."""
        parts = rel.split("/")
        parent = self.resolve_dir(parts[:-1], f"adding /{rel}", create=True)
        r = f"{parent}/{parts[-1]}" if parent else parts[-1]
        self.remove(r)
        fd = os.open(self.host(r), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        self.meta[r] = Meta(stat.S_IFREG | mode, 0, 0, 0)

    def add_symlink(self, rel: str, target: str) -> None:
        """Writes the symbolic link `rel` to `target` (replacing what the image had there)."""
        parts = rel.split("/")
        parent = self.resolve_dir(parts[:-1], f"adding /{rel}", create=True)
        r = f"{parent}/{parts[-1]}" if parent else parts[-1]
        self.remove(r)
        os.symlink(target, self.host(r))
        self.meta[r] = Meta(stat.S_IFLNK | 0o777, 0, 0, 0)

    def add_dir(self, rel: str, mode: int = 0o755) -> None:
        parts = rel.split("/")
        r = self.resolve_dir(parts, f"adding /{rel}", create=True)
        self.meta.setdefault(r, Meta(stat.S_IFDIR | mode, 0, 0, 0))

    def finish(self) -> None:
        """Sets the modification times, deepest first (modes, owners and device nodes are set
        by debugfs in the ext4 image: the staging tree stays readable to a builder that is not
        root)."""
        for rel in sorted(self.meta, key=lambda k: -k.count("/")):
            os.utime(self.host(rel), (self.meta[rel].mtime,) * 2, follow_symlinks=False)


def _lstat(p: Path) -> os.stat_result | None:
    try:
        return os.lstat(p)
    except FileNotFoundError:
        return None


class _BoundedReads:
    """A file whose single reads are at most `max_read` bytes: tarfile reads a whole pax or GNU
    long-name header at once, so this bounds the memory a hostile header can take."""

    def __init__(self, f: IO[bytes], max_read: int, what: str):
        self.f, self.max_read, self.what = f, max_read, what

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0 or n > self.max_read:
            raise ImageError(f"{self.what}: a tar header asks to read {n} bytes at once, more than {self.max_read}")
        return self.f.read(n)

    def seek(self, *a: Any) -> int:
        return self.f.seek(*a)

    def tell(self) -> int:
        return self.f.tell()


# ------------------------------------------------------------------ decompression
def unpack_layer(blob: Path, media_type: str, out: Path, budget: int, what: str) -> int:
    """Writes the layer's tar (decompressed) to out; returns its size. Refused past `budget`
    bytes."""
    if media_type.endswith("+zstd"):
        if shutil.which("zstd") is None:
            raise ImageError(f"{what}: a zstd layer needs the zstd program")
        proc = subprocess.Popen(["zstd", "-dc", str(blob)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        try:
            n = _copy_bounded(proc.stdout, out, budget, what)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            proc.stdout.close()
        err = proc.stderr.read()
        if proc.wait() != 0:
            raise ImageError(f"{what}: zstd: {err.decode(errors='replace').strip()}")
        return n
    try:
        if media_type.endswith("gzip"):
            with gzip.open(blob, "rb") as src:
                return _copy_bounded(src, out, budget, what)
        with open(blob, "rb") as src:
            return _copy_bounded(src, out, budget, what)
    except (OSError, EOFError) as e:
        if isinstance(e, ImageError):
            raise
        raise ImageError(f"{what}: cannot decompress: {e}") from None


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


def _copy_bounded(src: _Readable, out: Path, budget: int, what: str) -> int:
    n = 0
    with open(out, "wb") as dst:
        while chunk := src.read(1 << 20):
            n += len(chunk)
            if n > budget:
                raise ImageError(f"{what}: the image unpacks to more than {budget} bytes (--max-unpacked-bytes)")
            dst.write(chunk)
    return n


# ------------------------------------------------------------------ the init
TOOLS_DIR = "/.ignition"
"""The guest directory of the init's busybox, the network tools (`--net-tools`) and udhcpc's
event script."""
BUSYBOX = f"{TOOLS_DIR}/busybox"
"""The init's busybox in the guest; the image may have none of its own."""

UDHCPC_SCRIPT = """#!/.ignition/busybox sh
# udhcpc's event script for ignition.image's init: applies a lease to $interface (udhcpc sets
# ip, mask (the prefix length), router, dns and mtu), and writes /etc/resolv.conf. The address
# and its prefix are set in one request, never seen with another prefix.
B=/.ignition/busybox
case "$1" in
    deconfig)
        $B ip -4 addr flush dev "$interface"
        $B ip link set "$interface" up
        ;;
    bound|renew)
        a="$ip/${mask:-24}"
        if ! $B ip -4 addr show dev "$interface" | $B grep -q "inet $a "; then
            $B ip -4 addr flush dev "$interface"
            $B ip addr add "$a" broadcast + dev "$interface"
        fi
        $B ip link set "$interface" up
        [ -n "$mtu" ] && $B ip link set "$interface" mtu "$mtu" 2>/dev/null
        while $B ip route del default dev "$interface" 2>/dev/null; do :; done
        for r in $router; do
            $B ip route add default via "$r" dev "$interface"
            break
        done
        if [ -n "$dns" ]; then
            for d in $dns; do echo "nameserver $d"; done >/etc/resolv.conf
        fi
        ;;
esac
exit 0
"""
"""/.ignition/udhcpc.script."""


def init_script(config: dict[str, Any]) -> str:
    """The guest's /sbin/init for an image config (image-spec `config.md`): its Entrypoint and
    Cmd run with its Env (and a default PATH if it sets none) in its WorkingDir, on the console;
    the VM powers off when they exit. An image with neither waits, serving the agent."""
    c = config.get("config") or {}
    argv = [*(c.get("Entrypoint") or []), *(c.get("Cmd") or [])]
    env = list(c.get("Env") or [])
    if not any(e.startswith("PATH=") for e in env):
        env.append("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    q = shlex.quote
    envq = " ".join(q(e) for e in env)
    lines = [
        f"#!{BUSYBOX} sh",
        "# Ignition's init for an OCI image (python3 -m ignition.image): mounts, the guest agent,",
        "# then the image's Entrypoint and Cmd.",
        f"B={BUSYBOX}",
        "$B mount -t proc -o nosuid,nodev,noexec proc /proc",
        "$B mount -t sysfs -o nosuid,nodev,noexec sysfs /sys",
        "$B grep -q '^[^ ]* /dev devtmpfs ' /proc/mounts || $B mount -t devtmpfs devtmpfs /dev",
        "$B mkdir -p /dev/pts /dev/shm /run",
        "$B mount -t devpts -o nosuid,noexec,gid=5,mode=620,ptmxmode=666 devpts /dev/pts",
        "$B mount -t tmpfs -o nosuid,nodev,mode=1777 tmpfs /dev/shm",
        "$B mount -t tmpfs -o nosuid,nodev,mode=755 tmpfs /run",
        "$B ifconfig lo 127.0.0.1 up",
        "# Network (boot --net): DHCP in the background, its pid where the guest agent looks.",
        "if [ -e /sys/class/net/eth0 ]; then",
        f"    {TOOLS_DIR}/udhcpc -i eth0 -b -S -p /run/udhcpc.eth0.pid -s {TOOLS_DIR}/udhcpc.script >/dev/null 2>&1",
        "fi",
        "[ -s /etc/machine-id ] || $B tr -d '-' </proc/sys/kernel/random/uuid >/etc/machine-id 2>/dev/null",
        "# The boot timer: boot's default address, or boottimer= on the kernel command line.",
        "t=0x09100000",
        "set -f  # the command line split into words, not globbed",
        'for a in $($B cat /proc/cmdline); do case "$a" in boottimer=*) t="${a#boottimer=}" ;; esac; done',
        "set +f",
        'case "$t" in 0[xX][0-9a-fA-F]*) $B devmem "$t" 8 123 ;; esac',
        "# The guest agent, with the image's environment, started again if it ends; a clone's",
        f"# new lease is asked for with the tools in {TOOLS_DIR}, as at boot.",
        f"( while :; do $B env -i {envq} /bin/ignition-agent --net-tools {TOOLS_DIR}; $B sleep 1; done ) \\",
        "    </dev/null >/dev/console 2>&1 &",
        f"echo {q(READY_LINE)} >/dev/console",
    ]
    if argv:
        lines += [
            f"( cd {q(c.get('WorkingDir') or '/')} && exec $B env -i {envq} {' '.join(q(a) for a in argv)} ) \\",
            "    </dev/console >/dev/console 2>&1",
            'echo "init: the command exited with status $?" >/dev/console',
            "$B sync",
            "$B poweroff -f",
        ]
    else:
        lines.append("while :; do $B sleep 3600; done")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the build
def cache_dir() -> Path:
    """$XDG_CACHE_HOME/ignition/images (else ~/.cache/...): blobs/ and built images."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "ignition" / "images"


def guest_file(rootfs: Path, path: str) -> bytes:
    """A file of the project's guest rootfs.ext4, read with debugfs."""
    with tempfile.TemporaryDirectory(prefix="ignition-image-") as d:
        out = Path(d) / "f"
        r = subprocess.run(["debugfs", "-R", f"dump {path} {out}", str(rootfs)], capture_output=True, text=True)
        if r.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
            raise ImageError(f"{rootfs}: no {path} in the guest's root file system ({r.stderr.strip()})")
        return out.read_bytes()


def pull(ref: str, layout: Path, plain_http: bool, platform: str, vmstore: Path) -> dict[str, Any]:
    """`vmstore image-pull`: the report (digest, config and layer blobs)."""
    argv = [str(vmstore), "image-pull", ref, str(layout), "--platform", platform, "--json"]
    if plain_http:
        argv.append("--plain-http")
    r = subprocess.run(argv, capture_output=True, text=True)
    if r.returncode != 0:
        raise ImageError(r.stderr.strip() or f"vmstore image-pull exited with {r.returncode}")
    report: dict[str, Any] = json.loads(r.stdout)
    return report


def blob_path(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def image_size(root: Path, entries: int) -> int:
    """Bytes for the ext4 image: the tree's blocks, a quarter more and 256 MiB free, in MiB."""
    used = 0
    for d, dirs, files in os.walk(root):
        for x in dirs + files:
            used += os.lstat(os.path.join(d, x)).st_blocks * 512 + 256
    size = used + used // 4 + (256 << 20) + entries * 256
    return (size + (1 << 20) - 1) >> 20 << 20


def debugfs_script(st: Staging) -> list[str]:
    """Mode and owner of every inode, and the device nodes (made here: no mknod on the host)."""
    lines = []
    for rel, m in sorted(st.meta.items()):
        path = "/" + rel
        if '"' in path or "\n" in path:
            raise ImageError(f"/{rel!r}: a name debugfs cannot quote (a double quote or a newline)")
        if m.device:
            # mknod names an entry of the current directory.
            parent, _, name = path.rpartition("/")
            lines.append(f'rm "{path}"')
            lines.append(f'cd "{parent or "/"}"')
            lines.append(f'mknod "{name}" {m.device[0]} {m.device[1]} {m.device[2]}')
            lines.append('cd "/"')
            lines.append(f'sif "{path}" mtime @{m.mtime}')
        lines.append(f'sif "{path}" mode 0{m.mode:o}')
        lines.append(f'sif "{path}" uid {m.uid}')
        lines.append(f'sif "{path}" gid {m.gid}')
    return lines


def make_ext4(st: Staging, out: Path) -> None:
    size = image_size(st.root, st.entries)
    inodes = max(16384, 2 * (len(st.meta) + 64))
    env = dict(os.environ, MKE2FS_CONFIG=str(paths.REPO_ROOT / "guest" / "mke2fs.conf"), LC_ALL="C")
    out.unlink(missing_ok=True)
    with open(out, "wb") as f:
        f.truncate(size)
    r = subprocess.run(
        [
            "mkfs.ext4",
            "-q",
            "-F",
            "-t",
            "ext4",
            "-N",
            str(inodes),
            "-E",
            "root_owner=0:0",
            "-d",
            str(st.root),
            str(out),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    if r.returncode != 0:
        raise ImageError(f"mkfs.ext4: {r.stderr.strip()}")
    with tempfile.NamedTemporaryFile("w", suffix=".debugfs") as script:
        script.write("\n".join(debugfs_script(st)) + "\n")
        script.flush()
        r = subprocess.run(["debugfs", "-w", "-f", script.name, str(out)], capture_output=True, text=True)
    errors = [
        ln for ln in (r.stdout + r.stderr).splitlines() if ln and not ln.startswith(("debugfs", "Allocated inode"))
    ]
    if r.returncode != 0 or errors:
        raise ImageError(f"debugfs: {'; '.join(errors[:5]) or r.returncode}")


def add_guest(st: Staging, agent: bytes, busybox: bytes, init: str) -> None:
    """Adds the guest agent, the init's busybox and the init (`init_script`), and the mount
    points; then sets the times (`Staging.finish`). `/.ignition` holds the network tools of the
    init and of the agent (`--net-tools`): `ip` and `udhcpc` (busybox's applets, by name) and
    udhcpc's event script. Raises ImageError for an agent older than `--net-tools` (a guest
    built or fetched before it), which the init's command line would stop from starting."""
    if b"--net-tools" not in agent:
        raise ImageError(
            "the guest agent predates --net-tools: rebuild the guest (guest/build.sh) or fetch a newer one"
        )
    tools = TOOLS_DIR.lstrip("/")
    for d in ("proc", "sys", "dev", "run", "tmp", "bin", "sbin", tools):
        st.add_dir(d, 0o1777 if d == "tmp" else 0o755)
    st.add_file(BUSYBOX.lstrip("/"), busybox, 0o755)
    for applet in ("ip", "udhcpc"):
        st.add_symlink(f"{tools}/{applet}", "busybox")
    st.add_file(f"{tools}/udhcpc.script", UDHCPC_SCRIPT.encode(), 0o755)
    st.add_file("bin/ignition-agent", agent, 0o755)
    st.add_file("sbin/init", init.encode(), 0o755)
    st.finish()


@dataclass
class Built:
    """What build() made: the ext4 image and where it came from."""

    path: Path
    digest: str
    """The image's manifest digest."""
    cached: bool
    config: dict[str, Any]


def build(
    ref: str,
    out: Path,
    *,
    plain_http: bool = False,
    platform: str = PLATFORM,
    cache: Path | None = None,
    guest_rootfs: Path = paths.ROOTFS,
    max_unpacked: int = MAX_UNPACKED_BYTES,
    vmstore: Path | None = None,
) -> Built:
    """Pulls `ref` and writes its root file system to `out` (from the cache when the same
    manifest was built with the same guest files before)."""
    cache = cache or cache_dir()
    layout = cache / "oci"
    report = pull(ref, layout, plain_http, platform, vmstore or paths.vmstore_bin())
    agent = guest_file(guest_rootfs, "/bin/ignition-agent")
    busybox = guest_file(guest_rootfs, "/bin/busybox")
    config = json.loads(blob_path(layout, report["config"]["digest"]).read_bytes())
    os_arch = f"{config.get('os')}/{config.get('architecture')}"
    if os_arch != "/".join(platform.split("/")[:2]):
        raise ImageError(f"{ref}: the image is for {os_arch}, not {platform}")
    init = init_script(config)
    inputs = hashlib.sha256(b"\0".join([INIT_VERSION.encode(), agent, busybox, init.encode()])).hexdigest()[:16]
    cached = cache / "rootfs" / f"{report['digest'].removeprefix('sha256:')}-{inputs}.ext4"
    cached.parent.mkdir(parents=True, exist_ok=True)
    # One build of an entry at a time: another build of the same image and inputs waits here,
    # then copies the entry the first one made (renamed into place once whole).
    with open(cached.with_name(f".{cached.name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = cached.is_file()
        if not hit:
            with tempfile.TemporaryDirectory(prefix="ignition-image-", dir=cache) as work:
                st = Staging.new(Path(work) / "root")
                budget = max_unpacked
                for i, layer in enumerate(report["layers"]):
                    what = f"layer {i} ({layer['digest']})"
                    tar = Path(work) / "layer.tar"
                    budget -= unpack_layer(blob_path(layout, layer["digest"]), layer["media_type"], tar, budget, what)
                    st.apply_layer(tar, what)
                    tar.unlink()
                workdir = (config.get("config") or {}).get("WorkingDir") or "/"
                if workdir.strip("/"):
                    st.add_dir(workdir.strip("/"))  # made if missing, as a container runtime does
                add_guest(st, agent, busybox, init)
                tmp = Path(work) / "rootfs.ext4"
                make_ext4(st, tmp)
                os.replace(tmp, cached)
    out.parent.mkdir(parents=True, exist_ok=True)
    # A temporary file of this build's own beside `out`, renamed over it once whole: builds to
    # the same `out` at once do not write into each other's copy.
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    os.close(fd)
    try:
        subprocess.run(["cp", "--reflink=auto", "--sparse=always", str(cached), name], check=True)
        os.replace(name, out)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Built(out, report["digest"], hit, config)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ignition.image", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="an OCI image's root file system as an ext4 image")
    b.add_argument("ref", metavar="REF", help="REGISTRY/REPOSITORY[:TAG] or ...@sha256:DIGEST")
    b.add_argument("-o", "--output", type=Path, required=True, help="the ext4 image to write")
    b.add_argument("--plain-http", action="store_true", help="plain HTTP instead of HTTPS (a local registry)")
    b.add_argument("--platform", default=PLATFORM, help=f"OS/ARCH[/VARIANT] to pick from an index (default {PLATFORM})")
    b.add_argument("--cache", type=Path, default=None, help=f"blob and image cache (default {cache_dir()})")
    b.add_argument(
        "--guest-rootfs",
        type=Path,
        default=paths.ROOTFS,
        help="the project's guest root file system, whose agent and busybox are added (default guest/out/rootfs.ext4)",
    )
    b.add_argument(
        "--max-unpacked-bytes",
        type=int,
        default=MAX_UNPACKED_BYTES,
        help=f"most bytes the layers may unpack to, added up (default {MAX_UNPACKED_BYTES})",
    )
    args = p.parse_args(argv)
    for tool in ("mkfs.ext4", "debugfs"):
        if shutil.which(tool) is None and not Path("/sbin", tool).exists():
            print(f"image: needs {tool} (e2fsprogs)", file=sys.stderr)
            return 1
    try:
        built = build(
            args.ref,
            args.output,
            plain_http=args.plain_http,
            platform=args.platform,
            cache=args.cache,
            guest_rootfs=args.guest_rootfs,
            max_unpacked=args.max_unpacked_bytes,
        )
    except ImageError as e:
        print(f"image: {e}", file=sys.stderr)
        return 1
    print(f"{built.path}: {args.ref} ({built.digest}){' from the cache' if built.cached else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
