"""The guests' udhcpc event scripts (the busybox rootfs's and ignition.image's) run on the host,
in network and mount namespaces of their own, with iproute2's `ip` in place of busybox's: a
lease is applied with its prefix in one step, so nothing watching the interface ever sees the
address with another prefix (ifconfig sets the address, with its classful /8 for 10.x, before
the netmask: a test reading the address in between saw 10.0.3.156/8), a renewal of the same
lease leaves the address alone, and the default route is the lease's router."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from ignition import image

ROOTFS_SCRIPT = Path(__file__).resolve().parents[2] / "guest/rootfs/etc/udhcpc/default.script"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("unshare") is None,
    reason="needs root, iproute2's ip and unshare",
)

# In fresh namespaces: a TAP interface t0; `ip monitor address` records every address event
# until a sentinel address, added after the script, shows the script's events are all in.
# /etc/resolv.conf is a private copy (the scripts write it).
HARNESS = r"""
set -e
mount --bind "$WORK/resolv.conf" /etc/resolv.conf
ip link set lo up
ip tuntap add t0 mode tap
ip link set t0 up
ip -o monitor address >"$WORK/events" 2>&1 &
mon=$!
# Until the monitor is listening: a probe address added and removed until it is seen.
until grep -q 192.0.2.1/32 "$WORK/events"; do
    ip addr add 192.0.2.1/32 dev lo; ip addr del 192.0.2.1/32 dev lo
done
for event in $EVENTS; do
    interface=t0 ip=10.0.3.156 mask=24 subnet=255.255.255.0 router=10.0.3.1 dns=10.0.3.1 \
        sh "$SCRIPT" "$event"
done
ip addr add 192.0.2.2/32 dev lo
until grep -q 192.0.2.2/32 "$WORK/events"; do :; done
kill $mon
ip -4 -o addr show dev t0 >"$WORK/addr"
ip route show default >"$WORK/route"
"""


def image_script(tmp_path: Path) -> Path:
    """ignition.image's script with the host's tools in place of /.ignition/busybox."""
    text = image.UDHCPC_SCRIPT.replace("B=/.ignition/busybox\n", "B=\n")
    assert text != image.UDHCPC_SCRIPT
    p = tmp_path / "image.script"
    p.write_text(text)
    return p


def apply(tmp_path: Path, script: Path, events: str) -> tuple[list[str], str, str]:
    """Runs `script` with each of `events` in fresh namespaces; returns the address events seen
    on t0, t0's addresses afterwards and the default route."""
    (tmp_path / "resolv.conf").write_text("")
    env = dict(os.environ, WORK=str(tmp_path), SCRIPT=str(script), EVENTS=events)
    r = subprocess.run(
        ["unshare", "--net", "--mount", "sh", "-c", HARNESS], env=env, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    events_seen = [line for line in (tmp_path / "events").read_text().splitlines() if " t0 " in line]
    return events_seen, (tmp_path / "addr").read_text(), (tmp_path / "route").read_text()


@pytest.mark.parametrize("which", ["rootfs", "image"])
def test_a_lease_is_applied_with_its_prefix_in_one_step(tmp_path: Path, which: str) -> None:
    script = ROOTFS_SCRIPT if which == "rootfs" else image_script(tmp_path)
    seen, addr, route = apply(tmp_path, script, "deconfig bound")
    added = [e for e in seen if "inet 10.0.3.156/" in e]
    assert added, seen
    assert all("inet 10.0.3.156/24 " in e for e in added), added
    assert "inet 10.0.3.156/24 " in addr, addr
    assert route.startswith("default via 10.0.3.1 dev t0"), route
    assert (tmp_path / "resolv.conf").read_text() == "nameserver 10.0.3.1\n"


@pytest.mark.parametrize("which", ["rootfs", "image"])
def test_a_renewal_of_the_same_lease_leaves_the_address_alone(tmp_path: Path, which: str) -> None:
    script = ROOTFS_SCRIPT if which == "rootfs" else image_script(tmp_path)
    seen, addr, route = apply(tmp_path, script, "bound renew renew")
    assert not [e for e in seen if e.startswith("Deleted") and "10.0.3.156" in e], seen
    assert len([e for e in seen if "inet 10.0.3.156/24 " in e]) == 1, seen
    assert "inet 10.0.3.156/24 " in addr and route.startswith("default via 10.0.3.1 dev t0"), (addr, route)
