"""Summaries of repeated measurements and file digests, in the benchmarks' JSON shapes."""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def summarize(samples: Sequence[float]) -> dict[str, Any]:
    """Seconds: `median_s`, `min_s`, `max_s` and `samples_s`, rounded to 0.1 ms."""
    return {
        "median_s": round(statistics.median(samples), 4),
        "min_s": round(min(samples), 4),
        "max_s": round(max(samples), 4),
        "samples_s": [round(s, 4) for s in samples],
    }


def stats(samples: Sequence[float], nd: int = 1) -> dict[str, Any]:
    """median/min/max of unit-less samples (throughputs, page counts), rounded to nd digits."""
    return {
        "median": round(statistics.median(samples), nd),
        "min": round(min(samples), nd),
        "max": round(max(samples), nd),
        "samples": [round(s, nd) for s in samples],
    }


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_report(out: Path, result: Any, lines: Sequence[str]) -> None:
    """A benchmark's end: `result` as JSON at `out` (its directory made), then `lines` and
    where the JSON went, on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print("\n".join(lines))
    print(f"wrote {out}")
