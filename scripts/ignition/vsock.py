"""Host ends for the guest's vsock device (`boot --vsock-uds PATH`).

A host program reaches guest port P by connecting to PATH and sending
`CONNECT P\\n`; the VMM answers `OK <host port>\\n` once the guest accepted.
A guest connection to host port P arrives at the Unix socket `PATH_P`, where
a host program listens (EchoServer here).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

# The guest's tool (guest/tools/vsock.c), installed as /bin/vsock.
GUEST_TOOL = "vsock"
HOST_CID = 2


def read_line(sock: socket.socket, chunk: int = 64) -> bytes:
    """Reads until a newline (or the end), `chunk` bytes at a time at most."""
    line = b""
    while not line.endswith(b"\n"):
        b = sock.recv(chunk)
        if not b:
            break
        line += b
    return line


def connect(uds: Path | str, port: int, timeout: float = 60.0) -> socket.socket:
    """A stream to guest port `port` through the VMM's socket `uds`.

    Retries (until `timeout`) while the guest refuses, as it does until its
    listener is up; raises ConnectionRefusedError after that."""
    deadline = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout)
        s.connect(str(uds))
        s.sendall(f"CONNECT {port}\n".encode())
        # A byte at a time: what follows the line is the stream's.
        line = read_line(s, 1)
        if line.startswith(b"OK ") and line[3:-1].isdigit():
            return s
        s.close()
        if time.monotonic() > deadline:
            raise ConnectionRefusedError(f"guest port {port}: the VMM answered {line!r}")
        time.sleep(0.2)


def echo_round_trip(sock: socket.socket, data: bytes) -> str:
    """Sends `data` (then shuts the sending side) while reading the echo to
    its end; returns the echo's sha256 hex digest."""
    digest = hashlib.sha256()
    got = [0]

    def reader() -> None:
        while True:
            b = sock.recv(1 << 16)
            if not b:
                return
            digest.update(b)
            got[0] += len(b)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    view = memoryview(data)
    for i in range(0, len(data), 1 << 16):
        sock.sendall(view[i : i + (1 << 16)])
    sock.shutdown(socket.SHUT_WR)
    t.join(timeout=sock.gettimeout())
    assert not t.is_alive(), "the echo did not end"
    assert got[0] == len(data), f"{got[0]} of {len(data)} bytes echoed"
    return digest.hexdigest()


class PortServer:
    """A host program listening for guest connections to host port `port`
    (the socket `<uds>_<port>`), one thread per connection running
    `handle(conn)`. Use as a context manager."""

    def __init__(self, uds: Path | str, port: int, handle: Callable[[socket.socket], None]):
        self.path = Path(f"{uds}_{port}")
        self.handle = handle
        self.connections = 0
        self.errors: list[BaseException] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> PortServer:
        if self.path.exists():
            self.path.unlink()
        self._sock.bind(str(self.path))
        self._sock.listen(64)
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            self.connections += 1
            t = threading.Thread(target=self._run, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.handle(conn)
        except BaseException as e:  # reported by the test
            self.errors.append(e)

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def echo(conn: socket.socket) -> None:
    """Echoes a connection until its peer stops sending."""
    while True:
        b = conn.recv(1 << 16)
        if not b:
            return
        conn.sendall(b)


def count(conn: socket.socket) -> None:
    """Reads a connection to its end, then answers the byte count ("N\\n")."""
    n = 0
    while True:
        b = conn.recv(1 << 16)
        if not b:
            break
        n += len(b)
    conn.sendall(f"{n}\n".encode())


def send_timed(uds: Path | str, port: int, size: int) -> float:
    """Sends `size` zero bytes to the guest's `vsock sink PORT` and waits for
    its byte count; returns the seconds from the first byte to the count."""
    chunk = bytes(1 << 16)
    with connect(uds, port, timeout=120) as s:
        t = time.monotonic()
        left = size
        while left > 0:
            left -= s.send(chunk[: min(left, len(chunk))])
        s.shutdown(socket.SHUT_WR)
        answer = read_line(s)
        secs = time.monotonic() - t
    assert answer.strip() == str(size).encode(), f"the guest counted {answer!r} of {size}"
    return secs


class TimedCount:
    """A PortServer handler that counts each connection's bytes, answers the
    count, and records (bytes, seconds from first byte to end)."""

    def __init__(self) -> None:
        self.transfers: list[tuple[int, float]] = []

    def __call__(self, conn: socket.socket) -> None:
        n, t = 0, None
        while True:
            b = conn.recv(1 << 16)
            if not b:
                break
            if t is None:
                t = time.monotonic()
            n += len(b)
        self.transfers.append((n, time.monotonic() - (t or time.monotonic())))
        conn.sendall(f"{n}\n".encode())
