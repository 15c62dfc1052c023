"""Benchmark (not a test): `vmstore push` / `vmstore pull` throughput against a
local registry (Debian's docker-registry, CNCF distribution 2.8, on 127.0.0.1),
beside `skopeo copy` of an equivalent blob set, in one run.

Two layers, written with the vmstore Python module: a full layer of
--full-mib MiB of random bytes (incompressible; no holes) and a diff on it of
--diff-mib MiB of random pages. For each layer, each tool pushes into a fresh
registry of its own and pulls back into an empty directory; the diff is
pushed after its base and pulled into a store holding the base, so only the
diff's blobs move. skopeo copies the same files as one OCI image per layer
(`dir:` to `docker://` and back: an OCI manifest, a small config, one blob per
file). Wall time of each command, from spawn to exit; MB/s = 10^6 bytes of
the layer's files per second. vmstore's push includes verifying the chain
(cached) and hashing each file (the store keeps chunk digests, not a file's
plain sha256); its pull includes verifying every file and the atomic commit;
skopeo's `dir:` source already names its blobs by digest. Also a zstd push
and pull of the full layer. Median of --runs; prints a table and writes
bench-results/oci.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ignition import paths
from ignition.paths import RESULTS_DIR
from ignition.registry import LocalRegistry, environ_with_auth
from ignition.stats import write_report

PAGE = 16384
SKOPEO = "/usr/bin/skopeo"


def timed(argv: list[str]) -> float:
    """Runs argv (output captured; must succeed); returns wall seconds."""
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env=environ_with_auth(None), stdin=subprocess.DEVNULL)
    secs = time.monotonic() - t
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout}\n{r.stderr}")
    return secs


def vmstore(store: Path, *args: str) -> list[str]:
    return [str(paths.vmstore_bin()), "--store", str(store), *args]


def make_store(root: Path, full_mib: int, diff_mib: int) -> Path:
    """A store with `full` (random RAM) and `diff` on it (diff_mib of random pages)."""
    import vmstore as vm

    store = root / "src"
    s = vm.Store.create(str(store))
    ram = bytearray(os.urandom(full_mib << 20))
    s.write_full("full", ram, b"bench state")
    pages = (diff_mib << 20) // PAGE
    stride = max(1, (full_mib << 20) // PAGE // pages)
    dirty = [i * stride for i in range(pages)]
    for p in dirty:
        ram[p * PAGE : (p + 1) * PAGE] = os.urandom(PAGE)
    s.write_diff("diff", "full", ram, dirty, b"bench state 2")
    return store


def skopeo_dir(layer: Path, out: Path) -> None:
    """The layer's files (manifest.json as config) as a skopeo `dir:` image in out."""
    out.mkdir(parents=True)
    layers = []

    def put(data_path: Path) -> tuple[str, int]:
        h = hashlib.sha256()
        with open(data_path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        digest = h.hexdigest()
        shutil.copyfile(data_path, out / digest)
        return digest, data_path.stat().st_size

    cd, cs = put(layer / "manifest.json")
    for f in ("memory.bin", "state.bin"):
        d, s = put(layer / f)
        layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": f"sha256:{d}", "size": s})
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": f"sha256:{cd}", "size": cs},
        "layers": layers,
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    (out / "version").write_text("Directory Transport Version: 1.1\n")


def layer_bytes(layer: Path) -> int:
    return sum(p.stat().st_size for p in layer.iterdir() if p.name != "verified.json")


def one_run(src: Path, work: Path, compress: bool) -> dict[str, Any]:
    """Push full, then diff, into a fresh registry; pull full, then diff, into an empty store. Seconds each."""
    out = {}
    extra = ["--compress", "zstd"] if compress else []
    with LocalRegistry(work / "reg-vmstore") as reg:
        out["push_full"] = timed(vmstore(src, "push", "full", f"{reg.host}/b/full:v1", "--plain-http", *extra))
        out["push_diff"] = timed(vmstore(src, "push", "diff", f"{reg.host}/b/full:v2", "--plain-http", *extra))
        dst = work / "pulled"
        out["pull_full"] = timed(vmstore(dst, "pull", f"{reg.host}/b/full:v1", "--plain-http"))
        out["pull_diff"] = timed(vmstore(dst, "pull", f"{reg.host}/b/full:v2", "--plain-http"))
    shutil.rmtree(work / "reg-vmstore")
    shutil.rmtree(work / "pulled")
    return out


def skopeo_run(dirs: dict[str, Path], work: Path) -> dict[str, Any]:
    out = {}
    with LocalRegistry(work / "reg-skopeo") as reg:
        for name, d in dirs.items():
            ref = f"docker://{reg.host}/b/{name}:v1"
            out[f"push_{name}"] = timed([SKOPEO, "copy", "--quiet", "--dest-tls-verify=false", f"dir:{d}", ref])
            dst = work / f"skopeo-{name}"
            out[f"pull_{name}"] = timed([SKOPEO, "copy", "--quiet", "--src-tls-verify=false", ref, f"dir:{dst}"])
            shutil.rmtree(dst)
    shutil.rmtree(work / "reg-skopeo")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.bench.oci", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--full-mib", type=int, default=512, help="full layer's RAM (default 512)")
    p.add_argument("--diff-mib", type=int, default=8, help="diff layer's pages, MiB (default 8)")
    p.add_argument("--runs", type=int, default=3, help="runs per figure; the median is reported (default 3)")
    p.add_argument("--out", type=Path, default=None, help="JSON output (default RESULTS_DIR/oci.json)")
    args = p.parse_args(argv)
    out_path = args.out or RESULTS_DIR / "oci.json"
    if not paths.vmstore_bin().is_file():
        sys.exit(f"{paths.vmstore_bin()} missing: cargo build --release -p snapshot-store")
    if not Path(SKOPEO).is_file():
        sys.exit(f"{SKOPEO} missing: scripts/setup.sh installs skopeo")
    work = Path(tempfile.mkdtemp(prefix="oci-bench-", dir=os.environ.get("TMPDIR")))
    try:
        src = make_store(work, args.full_mib, args.diff_mib)
        sizes = {"full": layer_bytes(src / "full"), "diff": layer_bytes(src / "diff")}
        dirs = {}
        for name in ("full", "diff"):
            dirs[name] = work / f"dir-{name}"
            skopeo_dir(src / name, dirs[name])
        runs: dict[str, list[dict[str, Any]]] = {"vmstore": [], "vmstore_zstd": [], "skopeo": []}
        for _ in range(args.runs):
            runs["vmstore"].append(one_run(src, work, False))
            runs["vmstore_zstd"].append(one_run(src, work, True))
            runs["skopeo"].append(skopeo_run(dirs, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "full_mib": args.full_mib,
        "diff_mib": args.diff_mib,
        "runs": args.runs,
        "bytes": sizes,
        "seconds": {},
        "mb_per_s": {},
    }
    lines = [
        f"layer files: full {sizes['full'] / 1e6:.1f} MB, diff {sizes['diff'] / 1e6:.1f} MB; "
        f"median of {args.runs} run(s), MB/s (10^6 bytes of layer files per wall second)",
        f"{'tool':<14} {'push full':>10} {'pull full':>10} {'push diff':>10} {'pull diff':>10}",
    ]
    for tool, rs in runs.items():
        secs = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        rate = {k: sizes[k.split("_")[1]] / v / 1e6 for k, v in secs.items()}
        result["seconds"][tool] = secs
        result["mb_per_s"][tool] = rate
        lines.append(
            f"{tool:<14} " + " ".join(f"{rate[k]:>10.0f}" for k in ("push_full", "pull_full", "push_diff", "pull_diff"))
        )
    write_report(out_path, result, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
