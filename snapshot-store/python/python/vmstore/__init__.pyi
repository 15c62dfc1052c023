"""Type stubs for `vmstore`, Python bindings to Ignition's snapshot store.

Sizes are in bytes; times are timezone-aware `datetime` (UTC) or seconds as
`float`. Calls that read, write or hash files release the GIL.
"""

import builtins
import os
from collections.abc import Sequence
from datetime import datetime
from typing import Union, final

from typing_extensions import Buffer

__all__ = [
    "MAX_STATE_BYTES",
    "MEMORY_CHUNK_SIZE",
    "GcReport",
    "Layer",
    "Store",
    "StoreError",
    "Usage",
    "VerifyError",
    "VerifyReport",
    "pack_diff",
]

_Path = Union[str, os.PathLike[str]]

MEMORY_CHUNK_SIZE: int
"""Chunk size of a memory file's digest (FORMAT.md, "Memory digest"), bytes."""
MAX_STATE_BYTES: int
"""Largest machine state a layer holds, bytes."""

class StoreError(Exception):
    """A store operation failed; the message names the file or snapshot and the problem."""

class VerifyError(StoreError):
    """A file is missing, damaged or inconsistent with its manifest."""

    path: str
    """The file."""
    problem: str
    """What is wrong with it."""

@final
class Layer:
    """One snapshot layer, as its manifest and directory describe it."""

    name: str
    kind: str
    """`"full"` or `"diff"`."""
    parent: str | None
    """The parent's name (diffs); None for a full layer."""
    created: datetime
    """Creation time (UTC)."""
    ram_size: int
    """Guest RAM, bytes."""
    page_size: int
    """Bytes (Ignition: 16384)."""
    diff_pages: int | None
    """Pages a diff holds; None for a full layer."""
    disk_size: int | None
    """The disk image's bytes; None without a disk."""
    logical_bytes: int
    """Sum of the layer files' sizes (st_size), bytes."""
    physical_bytes: int
    """Sum of their allocated blocks (st_blocks * 512), bytes; blocks shared
    with clones count in each layer."""
    content_sha256: str
    """sha256 (hex) of manifest.json: pins the layer and its ancestry."""
    path: str
    """The layer directory."""
    vcpus: int
    backend: str
    """`"emu"` or `"hvf"`."""
    gic_mode: str
    """`"userspace"` or `"hvf"`."""
    creator: str
    """Program and version that wrote the layer."""

@final
class Usage:
    """The disk space one layer takes, bytes (`Store.du`)."""

    name: str
    logical_bytes: int
    """Sum of its files' sizes (st_size)."""
    physical_bytes: int
    """Sum of their allocated blocks (st_blocks * 512)."""
    shared_bytes: int | None
    """Of those, bytes in extents shared with other files through clones
    (Linux FIEMAP), counted in every layer sharing them; None where the file
    system cannot tell (macOS)."""

@final
class VerifyReport:
    """What a verification checked."""

    layers: int
    files: int
    """Files checked, manifests included."""
    bytes_hashed: int
    files_cached: int
    """Files trusted from the verified-file cache (verify(cached=True))."""
    bytes_cached: int
    """Bytes in those files."""

@final
class GcReport:
    """What `Store.gc` did."""

    removed: list[tuple[str, int]]
    """Work directories removed, as (name, allocated bytes freed)."""
    kept: list[tuple[str, str]]
    """Work directories left alone, as (name, reason)."""

@final
class Store:
    """A snapshot store directory (Ignition's `./vmstore` by default)."""

    def __new__(cls, path: _Path) -> Store:
        """Opens an existing store; raises StoreError if there is none."""
    @staticmethod
    def create(path: _Path) -> Store:
        """Creates the store directory (and its parents) if needed and opens it."""
    @property
    def root(self) -> str:
        """The store directory."""
    def list(self) -> builtins.list[Layer]:
        """Every readable layer, in name order."""
    def layer(self, name: str) -> Layer:
        """The layer `name`; StoreError if there is none."""
    def resolve(self, spec: str) -> builtins.list[Layer]:
        """The chain `NAME` or `NAME+N` names, base first."""
    def verify(self, spec: str, cached: bool = False) -> VerifyReport:
        """Every file's size and digest, headers and parent links of the chain;
        raises VerifyError naming the file and the problem on damage. With
        `cached`, files unchanged since they were last verified are trusted."""
    def verify_all(self) -> dict[str, VerifyReport | StoreError]:
        """Every layer (each file hashed once), with its report or the error
        it failed with (returned, not raised)."""
    def remove(self, name: str, recursive: bool = False) -> builtins.list[str]:
        """Removes a layer (and with `recursive` every layer built on it);
        returns the names removed, deepest first. StoreError if others build
        on it and not `recursive`."""
    def gc(self) -> GcReport:
        """Removes work directories whose process is gone."""
    def squash(self, spec: str, name: str) -> Layer:
        """Materialises the chain (verified first) into the new full layer `name`."""
    def du(self) -> builtins.list[Usage]:
        """Disk use of every readable layer, in name order."""
    def write_full(self, name: str, ram: Buffer, state: Buffer, *, disk: _Path | None = None,
                   page_size: int = 16384, ram_base_gpa: int = 0, vcpus: int = 1, backend: str = "emu",
                   gic_mode: str = "userspace") -> Layer:
        """Writes and commits the full layer `name`: `ram` is all of guest RAM
        (a whole number of `page_size`-byte pages; pages of zeros are holes),
        `state` the machine state (opaque to the store, at most
        MAX_STATE_BYTES; `boot` restores only its own), `disk` a disk image
        to copy (cloned where the file system can). StoreError if the name
        exists or is invalid."""
    def write_diff(self, name: str, parent: str, ram: Buffer, pages: Sequence[int], state: Buffer, *,
                   disk: _Path | None = None) -> Layer:
        """Writes and commits the diff layer `name` on `parent`: the pages
        numbered `pages` (strictly increasing) of `ram`, all of guest RAM
        (the parent's RAM size); geometry, vCPUs, backend and GIC mode are
        the parent's."""
    def overlay_into(self, spec: str, ram: bytearray | memoryview) -> tuple[float, int]:
        """Micro-benchmark: reads the chain's base memory into `ram` (writable,
        exactly the RAM size) and overlays its diffs; `(seconds, pages
        overlaid)`. Verifies nothing."""

def pack_diff(ram: Buffer, pages: Sequence[int], page_size: int = 16384) -> tuple[bytes, float]:
    """Micro-benchmark: the packed diff file (header, index, pages) of `pages`
    (strictly increasing) of `ram`, and the seconds packing took; writes nothing."""
