"""Two guest builds into different output directories give byte-identical outputs.

The kernel comes from the build cache (CI builds it first); the rootfs is built
from scratch by each run. The second run uses a different umask and TMPDIR.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from ignition.paths import REPO_ROOT

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        sys.platform == "darwin", reason="guest/build.sh needs Debian; a Mac fetches the guest (guest/fetch.sh)"
    ),
]

BUILD = REPO_ROOT / "guest" / "build.sh"
BUILD_TIMEOUT = 3600  # s, one build (not a VM: the timeout policy's backends do not apply)
OUTPUTS = ("Image", "rootfs.ext4", "guest.json")


def build(out, tmpdir, umask):
    env = dict(os.environ, TMPDIR=str(tmpdir))
    tmpdir.mkdir()
    r = subprocess.run(
        [str(BUILD), "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        preexec_fn=lambda: os.umask(umask),
    )
    assert r.returncode == 0, f"build.sh failed:\n{r.stdout}\n{r.stderr}"
    assert "[guest] rootfs: building" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.timeout(2 * BUILD_TIMEOUT + 600)
def test_two_builds_identical(guest_out, tmp_path):
    a, b = tmp_path / "out-a", tmp_path / "elsewhere" / "out-b"
    build(a, tmp_path / "tmp-a", 0o022)
    build(b, tmp_path / "tmp-b", 0o077)
    for name in OUTPUTS:
        da, db = (a / name).read_bytes(), (b / name).read_bytes()
        assert da == db, f"{name} differs between two builds"

    manifest = json.loads((a / "guest.json").read_text())
    for name in ("Image", "rootfs.ext4"):
        data = (a / name).read_bytes()
        assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    assert list(manifest) == sorted(manifest), "guest.json keys must be sorted"
