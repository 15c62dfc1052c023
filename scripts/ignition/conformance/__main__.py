"""The architectural conformance suite, side by side: every group of guest/conformance/ on
Ignition's `boot` and on QEMU TCG (the reference), with the same images.

Builds the images (guest/conformance/build.sh, into target/conformance unless --images names
prebuilt ones), runs each group on both, prints a table (group, Ignition, QEMU), the
interrupt-delivery latency (raise to handler, median and p99 in ns, a benchmark figure) and
the ID registers that differ, and writes bench-results/conformance.json. See
book/src/conformance.md.

Exit status: 0 when every run completed (whatever its result), 1 when something could not
run (no boot, no QEMU, no cross compiler, a build error), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ignition import conformance, host, paths, qemu, timeouts
from ignition.paths import RESULTS_DIR
from ignition.stats import sha256


def fmt_ns(ns: float) -> str:
    return f"{ns / 1e6:.2f} ms" if ns >= 1e6 else f"{ns / 1e3:.1f} us"


def latency_cell(s: dict[str, Any] | None) -> str:
    if not s or not s.get("n"):
        return "n/a"
    return f"median {fmt_ns(s['median_ns'])}, p99 {fmt_ns(s['p99_ns'])} (n={s['n']})"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for j, r in enumerate(rows):
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.conformance",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--backend",
        choices=["emu", "hvf"],
        default=None,
        help="Ignition backend (default: boot's: hvf on macOS/aarch64, else emu)",
    )
    p.add_argument("--gic", choices=["userspace", "hvf"], default=None, help="boot --gic (default: boot's)")
    p.add_argument(
        "--boot",
        type=Path,
        default=paths.boot_bin(),
        help="the boot binary (default: $IGNITION_BOOT or target/release/boot)",
    )
    p.add_argument(
        "--images",
        type=Path,
        default=None,
        help="prebuilt images (e.g. guest/out/conformance); default: build into target/conformance",
    )
    p.add_argument(
        "--groups",
        default=",".join(conformance.GROUPS),
        help=f"comma-separated groups (default: all: {','.join(conformance.GROUPS)})",
    )
    p.add_argument("--no-qemu", action="store_true", help="skip the QEMU reference runs")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS_DIR / "conformance.json",
        help="JSON results file (default: bench-results/conformance.json)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="print every failed check and the consoles")
    args = p.parse_args(argv)
    groups = [g for g in args.groups.split(",") if g]
    unknown = [g for g in groups if g not in conformance.GROUPS]
    if unknown or not groups:
        p.error(f"unknown group(s) {', '.join(unknown) or '(none)'}; known: {', '.join(conformance.GROUPS)}")
    backend = args.backend or timeouts.default_backend()

    if not args.boot.is_file():
        print(f"conformance: {args.boot} not built: run `cargo build --release --bin boot`", file=sys.stderr)
        return 1
    qemu_ver = "" if args.no_qemu else conformance.qemu_version()
    if not args.no_qemu and not qemu_ver:
        print(
            f"conformance: {qemu.QEMU} not found (Debian package qemu-system-arm); or pass --no-qemu", file=sys.stderr
        )
        return 1
    if args.images is None:
        if conformance.cross_compiler() is None:
            print(
                "conformance: no aarch64-linux-gnu-gcc to build the images (Debian package "
                "gcc-aarch64-linux-gnu); or pass --images DIR with prebuilt ones",
                file=sys.stderr,
            )
            return 1
        try:
            images = conformance.build()
        except RuntimeError as e:
            print(f"conformance: {e}", file=sys.stderr)
            return 1
        image_dir = conformance.IMAGES_DIR
    else:
        image_dir = args.images
        images = conformance.images(image_dir)
    missing = [str(images[g]) for g in groups if not images[g].is_file()]
    if missing:
        print(f"conformance: missing image(s): {', '.join(missing)}", file=sys.stderr)
        return 1

    ign_name = f"Ignition ({backend}{', gic ' + args.gic if args.gic else ''})"
    results: dict[str, dict[str, conformance.Result]] = {}
    for g in groups:
        results[g] = {"ignition": conformance.run_ignition(g, image_dir, args.boot, args.backend, args.gic)}
        if not args.no_qemu:
            results[g]["qemu"] = conformance.run_qemu(g, image_dir)
        cells = [f"{t}: {r.summary()} ({r.elapsed_s:.1f} s)" for t, r in results[g].items()]
        print(f"[conformance] {g}: " + "; ".join(cells), file=sys.stderr, flush=True)

    targets = ["ignition"] + ([] if args.no_qemu else ["qemu"])
    heads = {"ignition": ign_name, "qemu": "QEMU TCG"}
    print(
        table(
            [["group"] + [heads[t] for t in targets]]
            + [[g] + [results[g][t].summary() for t in targets] for g in groups]
        )
    )
    failed = [(g, t) for g in groups for t in targets if results[g][t].status != "pass"]
    if failed:
        print("\nFailed checks:")
    for g, t in failed:
        r = results[g][t]
        if args.verbose:
            print(r.explain())
            continue
        for check, detail in r.failures.items() or [("(run)", r.problem or "")]:
            detail = detail if len(detail) <= 160 else detail[:157] + "..."
            print(f"  {heads[t]} {check}: {detail}")
        if r.problem and r.failures:
            print(f"  {heads[t]} {g}: {r.problem}")

    latency: dict[str, dict[str, dict[str, Any]]] = {}
    for g in groups:
        for t in targets:
            for name, s in results[g][t].latency.items():
                latency.setdefault(name, {})[t] = s
    if latency:
        print("\nInterrupt-delivery latency, raise to handler (guest CNTVCT; a benchmark figure, not a check):")
        print(
            table(
                [["interrupt"] + [heads[t] for t in targets]]
                + [[n] + [latency_cell(latency[n].get(t)) for t in targets] for n in latency]
            )
        )

    ids = {t: results["idregs"][t].ids for t in targets} if "idregs" in results else {}
    if len(ids) == 2 and ids["ignition"] and ids["qemu"]:
        diff = [
            [r, f"0x{ids['ignition'].get(r, 0):016x}", f"0x{ids['qemu'].get(r, 0):016x}"]
            for r in ids["ignition"]
            if ids["ignition"].get(r) != ids["qemu"].get(r)
        ]
        print(f"\nID registers that differ ({len(diff)} of {len(ids['ignition'])}; all in {args.out}):")
        print(table([["register", ign_name, "QEMU TCG (-cpu max)"]] + diff))

    doc = {
        "benchmark": "conformance",
        "description": "guest/conformance groups on Ignition and on QEMU TCG with the same images; latency is "
        "raise-to-handler in guest counter ticks converted to ns",
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {**host.summary(), "cpu_model": host.cpu_model(), "mem_total_mib": host.mem_total_mib()},
        "targets": {
            "ignition": {"boot": str(args.boot), "backend": backend, "gic": args.gic},
            **(
                {}
                if args.no_qemu
                else {"qemu": {"version": qemu_ver, "argv": conformance.qemu_argv(Path("<group>.Image"), 1)}}
            ),
        },
        "images": {
            g: {"sha256": sha256(images[g]), "cpus": conformance.GROUPS[g].cpus, "checks": conformance.GROUPS[g].checks}
            for g in groups
        },
        "groups": {g: {t: r.as_json() for t, r in results[g].items()} for g in groups},
        "latency": latency,
        "id_registers": {t: {k: f"0x{v:016x}" for k, v in d.items()} for t, d in ids.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
