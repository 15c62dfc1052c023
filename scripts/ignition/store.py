"""A snapshot store on disk (snapshot-store/FORMAT.md) and the `vmstore` command.

Layer directories are named NAME; work directories `.tmp-NAME-PID-NONCE`
(a layer being written), `.tmp-run-PID-NONCE` (a restored VM's working disk)
and `.del-NAME-PID-NONCE` (a layer being removed); inside a layer,
`.verified.json.tmp-PID-NONCE` is a cache update in progress.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from . import paths

LAYER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""FORMAT.md: what a layer's directory may be named."""
WORK_PREFIXES = (".tmp-", ".del-")
"""Store entries that are work directories, never layers."""
VERIFIED_TMP_PREFIX = ".verified.json.tmp-"
"""A layer's verified-file cache being rewritten."""


def layer_names(store: Path) -> list[str]:
    """Sorted names of the store's layer directories (work directories and stray files excluded)."""
    return sorted(p.name for p in store.iterdir() if p.is_dir() and LAYER_NAME.fullmatch(p.name))


def work_entries(store: Path) -> list[str]:
    """Work entries left in the store, relative to it: `.tmp-*` and `.del-*`, and
    `LAYER/.verified.json.tmp-*`. Empty when nothing is being (or was left half) written."""
    found = [p.name for p in store.iterdir() if p.name.startswith(WORK_PREFIXES)]
    for name in layer_names(store):
        found += [f"{name}/{p.name}" for p in (store / name).iterdir() if p.name.startswith(VERIFIED_TMP_PREFIX)]
    return sorted(found)


def vmstore(store: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs `vmstore --store STORE ARGS` (paths.vmstore_bin()); returns the result, output as text."""
    return subprocess.run(
        [str(paths.vmstore_bin()), "--store", str(store), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def digest(store: Path) -> dict[str, str]:
    """sha256 of every file in the store, by path relative to it."""
    out = {}
    for p in sorted(store.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(store))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def file_sizes(path: Path) -> dict[str, int]:
    """Bytes of a file: `logical` (st_size) and `physical` (st_blocks*512)."""
    st = path.stat()
    return {"logical": st.st_size, "physical": st.st_blocks * 512}


def tree_sizes(root: Path) -> dict[str, int]:
    """Summed st_size and st_blocks*512 of every regular file (hard links once)."""
    logical = physical = 0
    seen: set[tuple[int, int]] = set()
    for p in root.rglob("*"):
        st = p.lstat()
        if not p.is_file() or p.is_symlink() or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        logical += st.st_size
        physical += st.st_blocks * 512
    return {"logical": logical, "physical": physical}


def remove_tree(root: Path) -> None:
    """Removes a store or a layer directory, whose files are read-only (0444)."""
    for q in [root, *root.rglob("*")]:
        if not q.is_symlink():
            os.chmod(q, 0o755 if q.is_dir() else 0o644)
    shutil.rmtree(root)
