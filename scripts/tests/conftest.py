"""Shared pytest setup for scripts/tests: --backend and --gic, each test's hang limit, guest and VM fixtures."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ignition import paths, timeouts
from ignition.vm import VmConfig

GUEST_OUT = paths.GUEST_OUT


def pytest_addoption(parser):
    parser.addoption(
        "--backend",
        choices=["emu", "hvf"],
        default=None,
        help="Ignition backend for boot tests (default: the binary's platform default)",
    )
    parser.addoption(
        "--gic",
        choices=["userspace", "hvf"],
        default=None,
        help="interrupt controller for boot tests, passed to boot as --gic "
        "(default: boot's, the userspace GIC; hvf needs --backend hvf and macOS 15)",
    )


def pytest_collection_modifyitems(config, items):
    """Every test gets a pytest-timeout limit from the timeout policy (timeouts.hang_limit) of
    the backend it runs on (QEMU's too for a test marked `qemu`), unless it sets its own; a
    test that runs `boot` (the `cfg` fixture) must be marked `e2e`."""
    backend = config.getoption("--backend")
    for item in items:
        if "cfg" in item.fixturenames and item.get_closest_marker("e2e") is None:
            raise pytest.UsageError(f"{item.nodeid} boots a VM (fixture cfg) but is not marked e2e")
        if item.get_closest_marker("timeout") is None:
            runs_on = [backend, "qemu"] if item.get_closest_marker("qemu") else [backend]
            item.add_marker(pytest.mark.timeout(max(timeouts.hang_limit(b) for b in runs_on)))


@pytest.fixture(scope="session")
def backend(request) -> str | None:
    """The --backend value, or None to let `boot` pick its default."""
    return request.config.getoption("--backend")


@pytest.fixture(scope="session")
def gic(request) -> str | None:
    """The --gic value, or None to let `boot` pick its default."""
    return request.config.getoption("--gic")


@pytest.fixture(scope="session")
def guest_out() -> Path:
    """guest/out with a built Image and rootfs.ext4; skips the test if not built."""
    missing = [f for f in ("Image", "rootfs.ext4", "guest.json") if not (GUEST_OUT / f).is_file()]
    if missing:
        pytest.skip(f"guest not built ({', '.join(missing)} missing in {GUEST_OUT}); run guest/build.sh")
    return GUEST_OUT


@pytest.fixture
def guest_disk(guest_out, tmp_path) -> Path:
    """A private copy of the guest's rootfs.ext4 in tmp_path (the guest writes its root disk)."""
    disk = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", disk)
    return disk


@pytest.fixture(scope="session")
def boot_bin() -> Path:
    """Our `boot` binary: $IGNITION_BOOT, or target/release/boot."""
    boot = paths.boot_bin()
    if not boot.is_file():
        pytest.fail(f"{boot} not built: run `cargo build --release --bin boot` (scripts/test.sh does)")
    return boot


@pytest.fixture(scope="session")
def vmstore_bin() -> Path:
    """Our `vmstore` binary: $IGNITION_VMSTORE, or target/release/vmstore."""
    vmstore = paths.vmstore_bin()
    if not vmstore.is_file():
        pytest.fail(f"{vmstore} not built: run `cargo build --release --workspace --bins` (scripts/test.sh does)")
    return vmstore


@pytest.fixture(scope="session")
def cfg(boot_bin, guest_out, backend, gic) -> VmConfig:
    """How every test runs `boot`: the binary, --backend, --gic, the guest's kernel and the timeouts."""
    return VmConfig(boot=boot_bin, backend=backend, gic=gic, kernel=guest_out / "Image")


@pytest.fixture(scope="session")
def qemu_timeouts() -> timeouts.Timeouts:
    """Timeouts for the reference boot under QEMU TCG."""
    return timeouts.for_backend("qemu")


@pytest.fixture
def disk(guest_out, tmp_path) -> Path:
    """A private copy of the root disk, so tests never change guest/out."""
    d = tmp_path / "rootfs.ext4"
    shutil.copyfile(guest_out / "rootfs.ext4", d)
    return d
