"""The one timeout policy of the tests and benchmarks, scaled by backend.

A timeout only bounds how long a broken run takes to fail; nothing passes or
fails by being fast. The base values are what the slowest supported setup
needs with a wide margin: a software CPU (`emu`, or QEMU's TCG for the
reference boot) on a loaded 2-core CI runner. Other backends scale them.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Timeouts:
    """Seconds to wait for one step before calling it failed."""

    boot: float
    """spawn -> `login:`; a restore -> its log lines."""
    cmd: float
    """One shell command, a snapshot write, the VMM's exit."""


BASE = Timeouts(boot=120.0, cmd=60.0)
"""On a software CPU (emu, QEMU TCG) on a loaded 2-core runner."""

SCALE = {"emu": 1.0, "qemu": 1.0, "hvf": 0.5}
"""Factor on BASE per backend ("qemu": the reference boot under QEMU TCG).
hvf runs the guest at native speed; its half keeps room for a first run."""

SCALE_ENV = "IGNITION_TIMEOUT_SCALE"
"""A further factor from the environment, e.g. 3 on a slow or busy host."""

TEST_BOOTS = 15
"""One pytest test's hang limit, in boot timeouts (see hang_limit)."""


def default_backend() -> str:
    """The backend `boot` picks without --backend: hvf on macOS/aarch64, else emu."""
    mac_arm = sys.platform == "darwin" and platform.machine() in ("arm64", "aarch64")
    return "hvf" if mac_arm else "emu"


def for_backend(backend: str | None) -> Timeouts:
    """The timeouts for `backend` (None: boot's default backend).

    Raises ValueError for an unknown backend or a non-positive
    $IGNITION_TIMEOUT_SCALE.
    """
    name = backend or default_backend()
    if name not in SCALE:
        raise ValueError(f"no timeout scale for backend {name!r} (known: {', '.join(SCALE)})")
    extra = float(os.environ.get(SCALE_ENV, "1"))
    if not extra > 0:
        raise ValueError(f"${SCALE_ENV} must be a positive number, not {extra!r}")
    k = SCALE[name] * extra
    return Timeouts(boot=BASE.boot * k, cmd=BASE.cmd * k)


def hang_limit(backend: str | None) -> float:
    """Seconds one pytest test may take, set-up and tear-down included, before pytest-timeout
    calls it hung: TEST_BOOTS boot timeouts of `backend` (None: boot's default), so 30 min on
    emu and QEMU, 15 on hvf, times $IGNITION_TIMEOUT_SCALE.

    The longest tests chain tens of boots, restores and snapshots, each far quicker than its
    own timeout, and finish well inside. Raises ValueError as for_backend does.
    """
    return for_backend(backend).boot * TEST_BOOTS
