"""Shared pytest setup for scripts/tests: import path, --backend, guest fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent
REPO_ROOT = SCRIPTS.parent
GUEST_OUT = REPO_ROOT / "guest" / "out"
sys.path.insert(0, str(SCRIPTS))


def pytest_addoption(parser):
    parser.addoption("--backend", choices=["emu", "hvf"], default=None,
                     help="Ignition backend for boot tests (default: the binary's platform default)")


@pytest.fixture(scope="session")
def backend(request) -> str | None:
    """The --backend value, or None to let `boot` pick its default."""
    return request.config.getoption("--backend")


@pytest.fixture(scope="session")
def guest_out() -> Path:
    """guest/out with a built Image and rootfs.ext4; skips the test if not built."""
    missing = [f for f in ("Image", "rootfs.ext4", "guest.json") if not (GUEST_OUT / f).is_file()]
    if missing:
        pytest.skip(f"guest not built ({', '.join(missing)} missing in {GUEST_OUT}); run guest/build.sh")
    return GUEST_OUT


@pytest.fixture(scope="session")
def boot_bin() -> Path:
    """Our `boot` binary: $IGNITION_BOOT, or target/release/boot."""
    boot = Path(os.environ.get("IGNITION_BOOT", REPO_ROOT / "target" / "release" / "boot"))
    if not boot.is_file():
        pytest.fail(f"{boot} not built: run `cargo build --release --bin boot` (scripts/test.sh does)")
    return boot
