#!/usr/bin/env bash
# Fetch a guest pushed with guest/push.sh (one OCI artifact: Image,
# rootfs.ext4, guest.json and conformance/*.Image) from any registry into
# guest/out, with vmstore's registry client (vmstore pull-files), then check
# Image and rootfs.ext4 against the sha256 guest.json records. For a Mac,
# which cannot run guest/build.sh (it needs Debian's packages).
#
#   guest/fetch.sh REGISTRY/REPOSITORY:TAG [--plain-http] [--out DIR]
#
# Credentials as for vmstore pull ($REGISTRY_AUTH_FILE, else
# ~/.docker/config.json). vmstore is $VMSTORE, else target/release/vmstore
# (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. guest/registry-common.sh
registry_args guest/fetch.sh "$@"
find_vmstore
echo "[guest] vmstore pull-files $ref $out"
"$vmstore" pull-files "$ref" "$out" ${extra[@]+"${extra[@]}"}
python3 - "$out" <<'PY'
import hashlib
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
record = json.loads((out / "guest.json").read_text())
for name, want in record["files"].items():
    h = hashlib.sha256()
    with open(out / name, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != want["sha256"]:
        sys.exit(f"[guest] error: {out / name} does not match guest.json (sha256 {h.hexdigest()})")
print(f"[guest] {', '.join(record['files'])} match guest.json (kernel {record.get('kernel_version', '?')})")
PY
