"""The VMM's log lines (on its console, stderr): patterns and parsers.

`boot` prints these lines; their text is part of its interface (see
`boot --help`). The patterns are pexpect regular expressions for the pty;
the parsers turn a matched line into numbers.

    Guest-boot-time = N ms
    Snapshot-device-hold-time = N us
    Snapshot-write-time = N ms
    Snapshot-disk-clone = METHOD (H of N chunks hashed[: NOTE])
    [snapshot] KIND 'NAME' (P pages, M MiB) written
    [snapshot] 'NAME' failed, nothing was written: ...   (or: refused: ...)
    [snapshot] the VM has ended; finishing the snapshot being written before exiting
    [snapshot] quitting once the snapshot being taken has stopped the VM
    [boot] SIGTERM: quitting (another signal ends boot at once)
    Restore-time = N ms
    Restore-stages: total N us, STAGE N us, STAGE N us (PARALLEL N us), ...
    Restore-disk = N us (overlay on K layers)
    Restore-source = fork of the branch's source (...)
    Branch-fork-time = N us
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GUEST_BOOT_TIME = r"Guest-boot-time = (\d+) ms"
"""group 1: VM start -> the guest init's boot-timer write, whole ms."""
SNAPSHOT_PAUSE_TIME = r"Snapshot-pause-time = (\d+) us"
"""group 1: vCPUs stopped -> vCPUs running again, whole us."""
SNAPSHOT_SAVED_BEFORE_WRITE = (
    r"Snapshot-saved-before-write = (\d+) pages \((\d+) before a guest write, "
    r"(\d+) before a device write, of (\d+)\)"
)
"""Background mode only; groups: saved early, by the guest, by devices, the layer's pages."""
SNAPSHOT_DEVICE_HOLD_TIME = r"Snapshot-device-hold-time = (\d+) us"
"""Background mode only; group 1: devices held after the resume while pages were write-protected, us."""
SNAPSHOT_WRITE_TIME = r"Snapshot-write-time = (\d+) ms"
SNAPSHOT_DISK_CLONE = r"Snapshot-disk-clone = ([^\r\n]+)\r*\n"
"""group 1: the value, for parse_disk_clone."""
SNAPSHOT_FAILED = r"\[snapshot\][^\r\n]*(?:failed|refused)[^\r\n]*"
SNAPSHOT_WAIT_AT_EXIT = r"\[snapshot\] the VM has ended; finishing the snapshot being written before exiting"
"""The VM ended (any way) while a snapshot was being taken or written: boot exits once it is done."""
SNAPSHOT_QUIT_WAITS = r"\[snapshot\] quitting once the snapshot being taken has stopped the VM"
"""A quit came before a started snapshot's pause: the VM ends right after that pause."""
QUIT_SIGNAL = r"\[boot\] (SIG[A-Z]+): quitting"
"""SIGTERM, SIGINT or SIGHUP: the VM winds down as with Ctrl-A x; group 1: the signal."""
RESTORE_TIME = r"Restore-time = (\d+) ms"
RESTORE_STAGES = r"Restore-stages: (total \d+ us, [^\r\n]*vCPUs \d+ us[^\r\n]*)\r*\n"
"""group 1: the items, for parse_restore_stages."""
AGENT_READY_TIME = r"Agent-ready-time = (\d+) ms"
"""group 1: VM start -> the guest agent's answer with the VM's generation ID, whole ms."""
AGENT_FAILED = r"Agent-failed: ([^\r\n]*)"
"""group 1: why the guest agent did not answer (in time) or refused."""
AGENT_ABSENT = r"Agent-absent: ([^\r\n]*)"
"""group 1: why the VMM stopped asking for a guest agent none required (nothing listened)."""
RESTORE_SOURCE_FORK = r"Restore-source = fork of the branch's source"
"""A branch's child forked from its source (`start: fork`)."""
BRANCH_FORK_TIME = r"Branch-fork-time = (\d+) us"
"""group 1: the source's fork for a branch (within its pause), whole us."""
RESTORE_DISK = r"Restore-disk = (\d+) us \(overlay on (\d+) layers?\)"
"""groups: opening the chain's disk under the VM's overlay (µs, part of resolve), the layers it reads."""


def snapshot_written(name: str) -> str:
    """The `[snapshot] KIND 'NAME' (P pages, M MiB) written` line of `name`; groups: kind, P, M."""
    return rf"\[snapshot\] (full|diff) '{re.escape(name)}' \((\d+) pages, ([0-9.]+) MiB\) written"


def snapshot_failed(name: str) -> str:
    """The `[snapshot] 'NAME' failed, nothing was written` line of `name`."""
    return rf"\[snapshot\] '{re.escape(name)}' failed, nothing was written"


@dataclass(frozen=True)
class DiskClone:
    """A `Snapshot-disk-clone` value."""

    method: str
    """How the layer's disk was stored: `disk diff` (disk.diff), or how disk.img was made (e.g.
    `FICLONE`, `sparse copy`)."""
    chunks_hashed: int
    """256 KiB chunks whose sha256 was computed for this layer."""
    chunks: int
    """Chunks of the whole disk."""
    reused: bool
    """Unchanged since the parent: an empty disk diff, the parent's digests reused (the note says so)."""
    copied_before_write: int
    """256 KiB chunks the block device copied into the layer just before the guest wrote them
    (a copy made while the guest ran); 0 otherwise."""


def parse_disk_clone(text: str) -> DiskClone:
    """Parses `METHOD (H of N chunks hashed[: note])`; raises ValueError if it is not that."""
    m = re.fullmatch(r"([^(\r\n]+?) \((\d+) of (\d+) chunks hashed(?:: ([^)]*))?\)", text.strip())
    if not m:
        raise ValueError(f"cannot parse Snapshot-disk-clone value {text!r}")
    note = m.group(4) or ""
    early = re.fullmatch(r"(\d+) copied before a guest write", note)
    return DiskClone(
        m.group(1), int(m.group(2)), int(m.group(3)), note.startswith("unchanged"), int(early.group(1)) if early else 0
    )


@dataclass(frozen=True)
class RestoreStages:
    """A `Restore-stages` line: microseconds."""

    total_us: int
    stages_us: dict[str, int]
    """The critical path's stages, in the VMM's order."""
    parallel_us: dict[str, int]
    """Work on another thread, shown after a stage in parentheses (e.g. `verify`)."""


def parse_restore_stages(text: str) -> RestoreStages:
    """Parses the items after `Restore-stages: `; raises ValueError on an item it cannot read
    or without `total`."""
    # "NAME N us", or "NAME N us (OTHER M us)" for work on another thread (not a stage).
    stages, parallel, total_us = {}, {}, None
    for part in text.split(","):
        m = re.fullmatch(r"\s*(.+?) (\d+) us(?: \((.+?) (\d+) us\))?\s*", part)
        if not m:
            raise ValueError(f"cannot parse Restore-stages item {part!r}")
        if m.group(1) == "total":
            total_us = int(m.group(2))
        else:
            stages[m.group(1)] = int(m.group(2))
        if m.group(3):
            parallel[m.group(3)] = int(m.group(4))
    if total_us is None:
        raise ValueError("Restore-stages lacks the total")
    return RestoreStages(total_us, stages, parallel)
