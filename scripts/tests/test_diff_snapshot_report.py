"""The diff-snapshot benchmark's Markdown report, on a fixed run (no VM): the report of
tests/data/diff_snapshot_run.json must equal tests/data/diff_snapshot_report.md byte for byte,
and the same for an older JSON (tests/data/diff_snapshot_report_older.md) that lacks the
figures later versions added. A change to the report's text changes these files with it.

To rewrite the expected files after an intended change: IGNITION_REGEN_REPORT=1 pytest this file.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

from ignition.diff_snapshot_report import report, summarize_all

DATA = Path(__file__).resolve().parent / "data"


def run() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / "diff_snapshot_run.json").read_text())
    return data


def older(raw: dict[str, Any], summary: dict[str, Any], info: dict[str, Any]) -> tuple[dict, dict, dict]:
    """The same run as an older version of the benchmark wrote it: no disk-write diff, no disk
    chunk counts, no restore disk-copy or verify figures, other restore stages (in sorted order,
    one the report does not know) and a restore target outside the plan, no §2 footprints, no
    disk.img in the root layer, no separate restore run count; on hvf, from a tree with
    uncommitted changes."""
    raw, summary, info = copy.deepcopy(raw), copy.deepcopy(summary), copy.deepcopy(info)
    del summary["snapshot_write"]["disk_8MiB"]
    for x in summary["snapshot_write"].values():
        del x["disk_chunks_hashed"]
    summary["restore"]["golden+2"] = copy.deepcopy(summary["restore"]["golden+1"])
    for x in summary["restore"].values():
        for k in ("disk_us_median", "verify_us_median"):
            del x[k]
        stages = x["stages_us_median"]
        stages["resolve+verify"] = stages.pop("resolve") + stages.pop("verify wait")
        stages["disk clone"] = 1500
        stages["prefetch"] = 7
        x["stages_us_median"] = dict(sorted(stages.items()))
    raw["write_layers_footprint"] = {}
    del raw["footprint"]["layers"]["golden"]["files"]["disk.img"]
    del info["restore_runs"]
    info.update(backend="hvf", git_dirty=True)
    return raw, summary, info


def check(text: str, expected: Path) -> None:
    if os.environ.get("IGNITION_REGEN_REPORT"):
        expected.write_text(text)
    assert text == expected.read_text(), f"the report differs from {expected}"


def test_report_of_a_fixed_run_is_unchanged():
    d = run()
    summary = summarize_all(d["raw"], d["runs"])
    check(report(d["raw"], summary, d["config"]), DATA / "diff_snapshot_report.md")


def test_report_of_an_older_json_is_unchanged():
    d = run()
    raw, summary, info = older(d["raw"], summarize_all(d["raw"], d["runs"]), d["config"])
    check(report(raw, summary, info), DATA / "diff_snapshot_report_older.md")


def test_report_sees_a_changed_figure():
    d = run()
    summary = summarize_all(d["raw"], d["runs"])
    base = report(d["raw"], summary, d["config"])
    summary["restore"]["golden"]["total_us"]["median"] += 1
    assert report(d["raw"], summary, d["config"]) != base
