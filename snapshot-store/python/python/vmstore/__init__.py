"""Ignition's snapshot store from Python: open or create a store, list and
inspect its layers, resolve `NAME+N`, verify, remove, gc, squash, measure
disk use, write layers, and time the store's core memory operations
in-process. See `__init__.pyi` for the API with types and units.
"""

from ._vmstore import (
    MAX_STATE_BYTES,
    MEMORY_CHUNK_SIZE,
    GcReport,
    Layer,
    Store,
    StoreError,
    Usage,
    VerifyError,
    VerifyReport,
    pack_diff,
)

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
