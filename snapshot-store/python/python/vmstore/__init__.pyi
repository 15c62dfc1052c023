"""Type stubs for `vmstore`, Python bindings to Ignition's snapshot store.

Sizes are in bytes; times are timezone-aware `datetime` (UTC) or seconds as
`float`. Calls that read or hash files release the GIL.
"""

from collections.abc import Sequence
from datetime import datetime

MEMORY_CHUNK_SIZE: int
"""Chunk size of a memory file's digest (FORMAT.md, "Memory digest"), bytes."""

class StoreError(Exception):
    """A store operation failed; the message names the file and the problem."""

class VerifyError(StoreError):
    """A verification found a damaged or inconsistent file."""

    path: str
    """The damaged file."""

class Layer:
    """One snapshot layer, as its manifest and directory describe it."""

    name: str
    kind: str
    """`"full"` or `"diff"`."""
    parent: str | None
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
    content_sha256: str
    """sha256 (hex) of manifest.json: pins the layer and its ancestry."""
    path: str
    """The layer directory."""
    vcpus: int
    backend: str
    gic_mode: str

class VerifyReport:
    """What a verification checked."""

    layers: int
    files: int
    """Files checked, manifests included."""
    bytes_hashed: int
    files_cached: int
    """Files trusted from the verified-file cache (verify(cached=True))."""
    bytes_cached: int

class Store:
    """A snapshot store directory (Ignition's `./vmstore` by default)."""

    def __init__(self, path: str) -> None:
        """Opens an existing store; raises StoreError if there is none."""
    @staticmethod
    def create(path: str) -> Store:
        """Creates the store directory if needed and opens it."""
    @property
    def root(self) -> str: ...
    def list(self) -> list[Layer]:
        """Every readable layer, in name order."""
    def layer(self, name: str) -> Layer: ...
    def resolve(self, spec: str) -> list[Layer]:
        """The chain `NAME` or `NAME+N` names, base first."""
    def verify(self, spec: str, cached: bool = False) -> VerifyReport:
        """Every file's size and digest, headers and parent links of the chain;
        raises VerifyError naming the file on damage."""
    def verify_all(self) -> list[tuple[str, VerifyReport | StoreError]]:
        """Every layer (each file hashed once), with its report or error."""
    def remove(self, name: str, recursive: bool = False) -> list[str]:
        """Removes a layer (and with `recursive` every layer built on it);
        returns the names removed."""
    def gc(self) -> tuple[list[tuple[str, int]], list[tuple[str, str]]]:
        """Removes work directories whose process is gone: `(removed as
        (name, bytes), kept as (name, reason))`."""
    def squash(self, spec: str, name: str) -> Layer:
        """Materialises the chain into the new full layer `name`."""
    def du(self) -> list[tuple[str, int, int, int | None]]:
        """`(name, logical_bytes, physical_bytes, shared_bytes)` per readable
        layer; shared_bytes is None where the file system cannot tell."""
    def overlay_into(self, spec: str, ram: bytearray | memoryview) -> tuple[float, int]:
        """Micro-benchmark: reads the chain's base memory into `ram` (writable,
        exactly the RAM size) and overlays its diffs; `(seconds, pages
        overlaid)`. Verifies nothing."""

def pack_diff(ram: bytes | bytearray | memoryview, pages: Sequence[int],
              page_size: int = 16384) -> tuple[bytes, float]:
    """Micro-benchmark: the packed diff file (header, index, pages) of `pages`
    (strictly increasing) of `ram`, and the seconds it took; writes nothing."""
