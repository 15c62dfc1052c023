"""Where things are: the repository, the guest build, the binaries, the results.

Every path is absolute, derived from this file's place in the repository
(scripts/ignition/paths.py), so scripts work from any current directory.
"""

from __future__ import annotations

import os
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent
REPO_ROOT = SCRIPTS.parent
GUEST_OUT = REPO_ROOT / "guest" / "out"
"""guest/build.sh's output: Image, rootfs.ext4, guest.json."""
KERNEL = GUEST_OUT / "Image"
ROOTFS = GUEST_OUT / "rootfs.ext4"
RESULTS_DIR = Path(os.environ.get("IGNITION_RESULTS_DIR", REPO_ROOT / "bench-results"))
"""Benchmarks write their JSON, Markdown and console logs here ($IGNITION_RESULTS_DIR, else bench-results/)."""
DEFAULT_BOOT = REPO_ROOT / "target" / "release" / "boot"
DEFAULT_VMSTORE = REPO_ROOT / "target" / "release" / "vmstore"


def boot_bin() -> Path:
    """The `boot` binary the tests run: $IGNITION_BOOT, else target/release/boot."""
    return Path(os.environ.get("IGNITION_BOOT", DEFAULT_BOOT))


def vmstore_bin() -> Path:
    """The `vmstore` binary: $IGNITION_VMSTORE, else target/release/vmstore."""
    return Path(os.environ.get("IGNITION_VMSTORE", DEFAULT_VMSTORE))
