"""Ignition's snapshot store from Python: open a store, list and inspect its
layers, resolve `NAME+N`, verify, remove, gc, squash, and time the store's
core memory operations in-process. See `__init__.pyi` for the API with types.
"""

from ._vmstore import (
    MEMORY_CHUNK_SIZE,
    Layer,
    Store,
    StoreError,
    VerifyError,
    VerifyReport,
    pack_diff,
)

__all__ = [
    "MEMORY_CHUNK_SIZE",
    "Layer",
    "Store",
    "StoreError",
    "VerifyError",
    "VerifyReport",
    "pack_diff",
]
