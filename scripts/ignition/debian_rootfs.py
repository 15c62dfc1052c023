"""A Debian arm64 root file system made on the host without running anything arm64: bash,
coreutils and what they depend on, from apt, with the guest agent and ignition.image's init.

    python3 -m ignition.debian_rootfs --out DIR

writes DIR/rootfs.ext4 and DIR/debian-rootfs.json (each package and its version). Each package's
files (`dpkg-deb --fsys-tarfile`) are applied as one layer of ignition.image (the same path
checks, modes and owners), in dependency order; maintainer scripts are not run, so the few files
they would make are written here (/etc/passwd and /etc/group from base-passwd's masters, /bin/sh
as dash if the package left it out). The init runs bash on the console; the VM powers off when it
exits. Boot it with Debian's kernel and initramfs (ignition.debian_guest), whose /init mounts
/dev/vda and switches to its /sbin/init:

    boot --kernel DIR/Image --initrd DIR/initrd.cpio --disk DIR/rootfs.ext4 --vsock-uds /tmp/vm.vsock
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from . import debian_guest, image, paths

ROOTS = ("base-files", "base-passwd", "bash", "coreutils", "dash")
"""The packages asked for; their Depends and Pre-Depends come too."""
SKIP = frozenset({"dpkg"})
"""Dependencies only maintainer scripts need (they are not run)."""
PREFER = {"awk": "mawk"}
"""The provider taken for a virtual package."""
CONFIG = {
    "config": {
        "Cmd": ["/bin/bash", "-l"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=vt100"],
        "WorkingDir": "/root",
    }
}


def closure(roots: tuple[str, ...]) -> list[str]:
    """roots and their Depends and Pre-Depends (the first alternative of each, SKIP left out),
    each after what it depends on."""
    deps: dict[str, list[str]] = {}
    todo = list(roots)
    while todo:
        out = subprocess.run(
            ["apt-cache", "depends", "--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks"]
            + ["--no-replaces", "--no-enhances", *(f"{p}:arm64" for p in todo)],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            raise debian_guest.DebianGuestError(f"apt-cache depends: {out.stderr.strip()}")
        todo = []
        pkg, alternative = "", False
        for line in out.stdout.splitlines():
            if not line.startswith(" "):
                pkg, alternative = line.split(":")[0], False
                deps.setdefault(pkg, [])
                continue
            m = re.match(r"  (\|?)(?:Pre)?Depends: <?([^:>\s]+)", line)
            if not m:
                continue
            taken_before, alternative = alternative, m.group(1) == "|"
            if taken_before:
                continue  # a later alternative of a group whose first was taken
            name = PREFER.get(m.group(2), m.group(2))
            if name in SKIP or name in deps[pkg]:
                continue
            deps[pkg].append(name)
            if name not in deps and name not in todo:
                todo.append(name)
    order: list[str] = []

    def visit(p: str, path: tuple[str, ...]) -> None:
        if p in order or p in path:  # a cycle (libc6 and libgcc-s1): either order unpacks the same
            return
        for d in deps.get(p, []):
            visit(d, (*path, p))
        order.append(p)

    for r in roots:
        visit(r, ())
    return order


def build(out: Path, cache: Path, guest_rootfs: Path = paths.ROOTFS) -> dict[str, object]:
    """Writes out/rootfs.ext4 and out/debian-rootfs.json; returns the record."""
    packages = closure(ROOTS)
    versions = {p: debian_guest.package_version(p) for p in packages}
    debs = {p: debian_guest.download(p, versions[p], cache) for p in packages}
    agent = image.guest_file(guest_rootfs, "/bin/ignition-agent")
    busybox = image.guest_file(guest_rootfs, "/bin/busybox")
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ignition-debian-rootfs-", dir=out) as work:
        st = image.Staging.new(Path(work) / "root")
        for p in packages:
            tar = Path(work) / "layer.tar"
            with open(tar, "wb") as f:
                subprocess.run(["dpkg-deb", "--fsys-tarfile", str(debs[p])], stdout=f, check=True)
            st.apply_layer(tar, f"{p} {versions[p]}")
            tar.unlink()
        for name in ("passwd", "group"):
            master = st.root / "usr/share/base-passwd" / f"{name}.master"
            st.add_file(f"etc/{name}", master.read_bytes(), 0o644)
        if not (st.root / "bin/sh").is_symlink():
            st.add_symlink("bin/sh", "dash")
        st.add_dir("root", 0o700)
        image.add_guest(st, agent, busybox, image.init_script(CONFIG))
        tmp = Path(work) / "rootfs.ext4"
        image.make_ext4(st, tmp)
        tmp.replace(out / "rootfs.ext4")
    record: dict[str, object] = {"packages": versions}
    (out / "debian-rootfs.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m ignition.debian_rootfs", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--cache", type=Path, default=None, help="where the .deb files are kept")
    p.add_argument("--guest-rootfs", type=Path, default=paths.ROOTFS, help="where the agent and busybox come from")
    args = p.parse_args(argv)
    try:
        record = build(args.out, args.cache or debian_guest.cache_dir(), args.guest_rootfs)
    except (debian_guest.DebianGuestError, image.ImageError) as e:
        print(f"debian_rootfs: {e}", file=sys.stderr)
        return 1
    packages = record["packages"]
    assert isinstance(packages, dict)
    print(f"{args.out / 'rootfs.ext4'}: {len(packages)} packages: {' '.join(sorted(packages))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
