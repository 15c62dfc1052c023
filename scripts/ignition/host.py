"""Facts about the host a benchmark ran on, for its results."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path

from . import paths


def summary() -> dict[str, str | int | None]:
    """`machine`, `system` and `cpu_count`, as the boot benchmarks record them."""
    return {"machine": platform.machine(), "system": platform.system(), "cpu_count": os.cpu_count()}


def sh(argv: Sequence[str]) -> str:
    """A command's stdout (stripped), run in the repository; "" if it cannot run."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=paths.REPO_ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def process_cpu_ms(pid: int) -> int | None:
    """User + system CPU time of process `pid` so far (all its threads), ms, from /proc; None if
    it is gone (or there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")


def mem_total_mib() -> int | None:
    """The host's RAM in MiB from /proc/meminfo; None where there is none."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
