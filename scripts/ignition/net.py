"""Host ends for the guest's network device: passt on a Unix socket, a bridge of TAP
interfaces in a network namespace of its own, and an HTTP server on the host's loopback that
the guest reaches through passt.

passt maps the guest's default gateway address to the host's loopback, so a
server bound to 127.0.0.1 here is `http://<gateway>:<port>/` in the guest.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

# What the guest prints for its default gateway (busybox route).
GATEWAY_CMD = "route -n | awk '$1 == \"0.0.0.0\" { print $2; exit }'"
# Waits (at most 60 s) until eth0 has its DHCP lease; fails otherwise.
LEASE_WAIT_CMD = (
    "i=0; until ifconfig eth0 | grep -q 'inet addr'; do i=$((i+1)); [ $i -lt 600 ] || exit 1; sleep 0.1; done"
)


def eth0_ipv4_cmd(busybox: str = "") -> str:
    """A guest command that waits (at most 60 s) until eth0 has an IPv4 address and prints it
    as ADDR/PREFIX; fails otherwise. A branch child is ready once its agent has asked for a
    lease (5 tries a second apart, then udhcpc goes on in the background), so on a loaded host
    the lease may come after ready. `busybox`: the busybox that runs `ip`, `awk` and `sleep`
    where /bin has none (an OCI image's or the Debian guest's `/.ignition/busybox`)."""
    bb = f"{busybox} " if busybox else ""
    return (
        f"i=0; until a=$({bb}ip -4 -o addr show dev eth0 | {bb}awk '{{ print $4 }}'); [ -n \"$a\" ]; "
        f"do i=$((i+1)); [ $i -lt 600 ] || exit 1; {bb}sleep 0.1; done; echo $a"
    )


def passt_bin() -> str | None:
    """The passt binary (Debian package passt), or None."""
    return shutil.which("passt")


def passt_pids(parent: int) -> list[int]:
    """The pids of the passt processes (`boot --net passt`'s) whose parent is `parent`
    (Debian's passt runs as passt.avx2 where the CPU has AVX2)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if comm.split(".")[0] == "passt" and int(rest[1]) == parent:
            found.append(int(d.name))
    return found


class Passt:
    """passt serving one client at a time on a Unix socket (it waits for the
    next client when one goes, so a restored VM can connect again).

    Use as a context manager: `with Passt(dir) as p: ... p.socket ...`."""

    def __init__(self, directory: Path, name: str = "passt.sock"):
        self.socket = Path(directory) / name
        self.log = Path(directory) / (name + ".log")
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Passt:
        binary = passt_bin()
        if binary is None:
            raise RuntimeError("passt is not installed (apt install passt)")
        with open(self.log, "wb") as log:
            # -f: foreground; -e: log to stderr (no syslog here); --runas:
            # as root, passt would switch to nobody, who cannot reach a
            # private test directory.
            argv = [binary, "-f", "-s", str(self.socket), "--runas", str(os.getuid())]
            argv += ["-e"] + (["-p", f"{self.log}.pcap"] if os.environ.get("PASST_PCAP") else [])
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not self.socket.exists():
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"passt exited with {self.proc.returncode}: {self.log.read_text(errors='replace')[-2000:]}"
                )
            if time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("passt did not create its socket in 30 s")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Bridge:
    """A network namespace of its own (root only) with a bridge br0 (10.0.3.1/24) and TAP
    interfaces on it, up; `wrap(boot)` is a script that runs `boot` in the namespace (and so do
    the VMs it starts: a branch's children), written into `directory`.

    Use as a context manager: `with Bridge(dir, ("tap0", "tap1")) as b: ... b.wrap(boot) ...`."""

    ADDRESS = "10.0.3.1/24"

    def __init__(self, directory: Path, taps: tuple[str, ...], name: str | None = None):
        self.directory = Path(directory)
        self.taps = taps
        self.name = name or f"ignition-{os.getpid()}"

    @staticmethod
    def available() -> bool:
        """Root, and iproute2's `ip`."""
        return os.geteuid() == 0 and shutil.which("ip") is not None

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """argv in the namespace; raises CalledProcessError if it fails."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv], capture_output=True, text=True, check=True, timeout=60
        )

    def __enter__(self) -> Bridge:
        subprocess.run(["ip", "netns", "add", self.name], check=True, timeout=60)
        try:
            self.run("ip", "link", "add", "br0", "type", "bridge")
            self.run("ip", "addr", "add", self.ADDRESS, "dev", "br0")
            self.run("ip", "link", "set", "br0", "up")
            for tap in self.taps:
                self.run("ip", "tuntap", "add", tap, "mode", "tap")
                self.run("ip", "link", "set", tap, "master", "br0")
                self.run("ip", "link", "set", tap, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def wrap(self, boot: Path) -> Path:
        """A script that runs `boot` with its arguments in the namespace."""
        wrapper = self.directory / f"boot-in-{self.name}"
        wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {self.name} {boot} "$@"\n')
        wrapper.chmod(0o755)
        return wrapper

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], timeout=60)


BRIDGE_UDHCPD_CONF = """start 10.0.3.100
end 10.0.3.200
interface eth0
lease_file /tmp/udhcpd.leases
opt subnet 255.255.255.0
opt router 10.0.3.1
"""
"""busybox udhcpd's configuration for a guest serving DHCP on a Bridge from eth0 (with a fixed
address of the bridge's subnet, not in the pool): leases 10.0.3.100 on, the bridge the router."""
BRIDGE_SERVER = "10.0.3.2"
"""The fixed address of the guest that serves DHCP on a Bridge (serve_dhcp_on_bridge)."""


class Guest(Protocol):
    """A VM reached through its guest agent (`ignition.vm.Vm`, `ignition.branch.Child`)."""

    def run(self, cmd: str) -> str: ...


class BranchChild(Guest, Protocol):
    name: str
    mac: str | None


def serve_dhcp_on_bridge(vm: Any, busybox: str = "") -> str:
    """Makes `vm` (an `ignition.vm.Vm` on a Bridge's TAP interface) the bridge's DHCP server:
    stops its own udhcpc, takes BRIDGE_SERVER/24 on eth0 and starts busybox udhcpd with
    BRIDGE_UDHCPD_CONF. `busybox` as for eth0_ipv4_cmd. Returns its MAC."""
    bb = f"{busybox} " if busybox else ""
    vm.run(f"kill $(cat /run/udhcpc.eth0.pid); {bb}ip addr flush dev eth0")
    vm.run(f"{bb}ip addr add {BRIDGE_SERVER}/24 dev eth0 && : >/tmp/udhcpd.leases")
    vm.write_file("/tmp/udhcpd.conf", BRIDGE_UDHCPD_CONF.encode())
    vm.run(f"{bb}udhcpd -S /tmp/udhcpd.conf")
    return str(vm.run("cat /sys/class/net/eth0/address"))


def check_bridge_children(children: Sequence[BranchChild], source_mac: str, busybox: str = "") -> list[str]:
    """Checks the children of a branch on a Bridge whose source serves DHCP
    (serve_dhcp_on_bridge): each child's eth0 has the MAC the branch gave it and gets a lease
    from the pool (waited for, bounded: eth0_ipv4_cmd); the addresses and MACs are distinct
    and not the source's; each child reaches every sibling, whose own MAC it sees, and the
    source. Returns their addresses; AssertionError names what failed."""
    bb = f"{busybox} " if busybox else ""
    addrs = []
    for c in children:
        mac = c.run("cat /sys/class/net/eth0/address")
        if mac != c.mac:
            raise AssertionError(f"{c.name}: eth0 has MAC {mac}, the branch gave {c.mac}")
        addr = c.run(eth0_ipv4_cmd(busybox))
        if not (addr.startswith("10.0.3.") and addr.endswith("/24")) or addr == f"{BRIDGE_SERVER}/24":
            raise AssertionError(f"{c.name}: eth0 has {addr!r}, not a lease of the bridge's pool")
        addrs.append(addr.split("/")[0])
    macs = [c.mac for c in children]
    if len(set(addrs)) != len(children) or len(set(macs)) != len(children) or source_mac in macs:
        raise AssertionError(f"addresses {addrs} and MACs {macs} (the source's {source_mac}) not all distinct")
    for c in children:
        for other, other_mac in zip(addrs, macs):
            if other_mac == c.mac:
                continue
            c.run(f"{bb}ping -c 1 -w 30 {other} >/dev/null && {bb}ping -c 1 -w 30 {BRIDGE_SERVER} >/dev/null")
            if other_mac is None or other_mac not in c.run(f"{bb}ip neigh show {other}"):
                raise AssertionError(f"{c.name} does not see {other}'s MAC {other_mac}")
    return addrs


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET /NAME serves a registered blob; POST answers "<sha256> <bytes>"
    of its body."""

    server: LoopbackHttp

    def do_GET(self) -> None:
        blob = self.server.blobs.get(self.path.lstrip("/"))
        if blob is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(blob)))
        self.end_headers()
        view = memoryview(blob)
        t0 = time.perf_counter()
        for i in range(0, len(blob), 1 << 16):
            self.wfile.write(view[i : i + (1 << 16)])
        self.wfile.flush()
        self.server.transfers.append(("GET", len(blob), time.perf_counter() - t0))

    def do_POST(self) -> None:
        left = int(self.headers.get("Content-Length", "0"))
        h = hashlib.sha256()
        n = 0
        t0 = time.perf_counter()
        while n < left:
            chunk = self.rfile.read(min(left - n, 1 << 16))
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
        self.server.transfers.append(("POST", n, time.perf_counter() - t0))
        body = f"{h.hexdigest()} {n}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read the transfers, not a log."""


class LoopbackHttp(http.server.ThreadingHTTPServer):
    """An HTTP server on `address` (by default 127.0.0.1, a free port) in a thread:
    `add(name, data)` serves data at /name; a POST is answered "<sha256> <bytes>" of its
    body.

    (The guest's busybox wget posts a file only up to its first NUL byte,
    and passt 2023.03 never passes on a host socket's close to a guest that
    half-closed first, so a guest upload is a POST of NUL-free data that
    wget ends by the response's Content-Length.)"""

    daemon_threads = True

    def __init__(self, address: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        super().__init__(address, _Handler)
        self.blobs: dict[str, bytes] = {}
        # (method, body bytes, seconds from the body's first byte to its
        # last, as the server sent or read it), in order.
        self.transfers: list[tuple[str, int, float]] = []
        self.port = self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def add(self, name: str, data: bytes) -> str:
        """Serves `data` at /name; returns its SHA-256."""
        self.blobs[name] = data
        return hashlib.sha256(data).hexdigest()

    def __enter__(self) -> LoopbackHttp:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()
