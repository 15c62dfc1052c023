"""The guest agent's client: exec, files, ports and info over vsock.

The guest runs `/bin/ignition-agent` (guest/tools/ignition-agent.c) on vsock
port 1024; a host program reaches it through the VMM's vsock socket
(`boot --vsock-uds PATH`) with one connection per request. The wire format
(the book's chapter "The guest agent"; the Rust crate agent-client speaks
the same): frames of an 8-byte header (u8 version 1, u8 type, u16 0, u32
little-endian payload length, at most 1 MiB) and a payload.

    agent = Agent("/tmp/vm.vsock")
    done = agent.exec(["uname", "-m"])          # Completed(stdout=b"aarch64\\n", stderr=b"", exit_code=0)
    agent.write_file("/tmp/f", data, mode=0o600)
    assert agent.read_file("/tmp/f") == data
    with agent.expose(8000) as ex:              # a host socket forwarded to guest port 8000
        urllib.request.urlopen(f"http://{ex.address[0]}:{ex.address[1]}/")

The guest is not trusted: frames are bounded, collected output and files are
bounded by the caller, and every read has a timeout (an exec's reads wait as
long as its own timeout allows).
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

VERSION = 1
HEADER = struct.Struct("<BBHI")
MAX_PAYLOAD = 1 << 20
CHUNK = 256 << 10
AGENT_PORT = 1024
MAX_ADDRESSES = 256

# Frame types (FrameType in agent-client/src/frame.rs).
EXEC, READ_FILE, WRITE_FILE, STAT, LIST, EXPOSE, INFO, IDENTITY = range(0x01, 0x09)
DATA, SIGNAL, RESIZE = 0x10, 0x11, 0x12
STARTED, STDOUT, STDERR, EXIT, FILE_DATA, ENTRY, OK, ERROR = range(0x20, 0x28)
KNOWN = {*range(0x01, 0x09), DATA, SIGNAL, RESIZE, *range(0x20, 0x28)}

# Error codes beside errno values.
BAD_REQUEST, BUSY, UNSUPPORTED = 4096, 4097, 4098


class AgentError(Exception):
    """A request failed: the agent's error (code set: an errno value or BAD_REQUEST, BUSY,
    UNSUPPORTED), a protocol violation, a connection the agent closed, or a timeout."""

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


class NoAgent(AgentError):
    """Nothing in the guest listens on the agent's port (yet): the VMM closed the connection."""


class AgentClosed(AgentError):
    """The connection ended before the request's answer: the agent, or its process serving this
    connection, is gone (killed, or restarting)."""


@dataclass(frozen=True)
class Completed:
    """A finished command: its output and how it ended."""

    stdout: bytes
    stderr: bytes
    exit_code: int
    """The exit status, or -N if signal N killed it (subprocess's convention)."""
    timed_out: bool = False
    """The agent killed it at the exec's timeout (exit_code is then -9)."""

    def check(self) -> Completed:
        """Returns self if exit_code is 0, else raises AgentError with stderr."""
        if self.exit_code != 0:
            raise AgentError(f"exit code {self.exit_code}: {self.stderr.decode(errors='replace').strip()}")
        return self


@dataclass(frozen=True)
class Stat:
    """A guest file's metadata."""

    mode: int
    """st_mode: type and permission bits."""
    uid: int
    gid: int
    size: int
    mtime: float
    """Seconds since the epoch."""

    @property
    def is_dir(self) -> bool:
        return self.mode & 0o170000 == 0o040000


@dataclass(frozen=True)
class Entry:
    """A directory entry (its own metadata, not a symlink's target's)."""

    name: str
    stat: Stat


@dataclass(frozen=True)
class Info:
    """The agent's view of the guest."""

    version: int
    generation: int
    """Identity rotations since the guest booted (0 until its first restore)."""
    generation_id: str
    """The last generation ID the host sent, 32 hex digits (zeros until then)."""
    uptime_ms: int
    boot_id: str
    machine_id: str
    """/etc/machine-id, or "" without one."""
    addresses: list[str] = field(default_factory=list)
    """"IFNAME ADDRESS/PREFIX" per address of a non-loopback interface."""


# ---------------------------------------------------------------- encoding


def frame(kind: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise AgentError(f"a frame of {len(payload)} bytes (at most {MAX_PAYLOAD})")
    return HEADER.pack(VERSION, kind, 0, len(payload)) + payload


def _str(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    if b"\0" in b:
        raise AgentError(f"{s!r} holds a NUL byte")
    return struct.pack("<I", len(b)) + b


def exec_payload(
    argv: Sequence[str],
    env: dict[str, str] | None = None,
    cwd: str = "",
    stdin: bool = False,
    pty: tuple[int, int] | None = None,
    timeout_ms: int = 0,
) -> bytes:
    """An exec request's payload (see agent-client/src/frame.rs ExecRequest)."""
    envs = [f"{k}={v}" for k, v in (env or {}).items()]
    if not 1 <= len(argv) <= 4096 or len(envs) > 4096:
        raise AgentError("an exec needs 1 to 4096 arguments and at most 4096 variables")
    flags = (1 if pty else 0) | (2 if stdin else 0)
    rows, cols = pty or (0, 0)
    p = struct.pack("<IIHHII", flags, timeout_ms, rows, cols, len(argv), len(envs)) + _str(cwd)
    return p + b"".join(_str(a) for a in argv) + b"".join(_str(e) for e in envs)


class _In:
    """A payload from the guest being decoded; every read is bounds-checked."""

    def __init__(self, p: bytes, what: str):
        self.p, self.at, self.what = p, 0, what

    def take(self, n: int) -> bytes:
        if n > len(self.p) - self.at:
            raise AgentError(f"malformed {self.what} payload")
        b = self.p[self.at : self.at + n]
        self.at += n
        return b

    def u32(self) -> int:
        return int(struct.unpack("<I", self.take(4))[0])

    def u64(self) -> int:
        return int(struct.unpack("<Q", self.take(8))[0])

    def str(self) -> str:
        b = self.take(self.u32())
        try:
            if b"\0" in b:
                raise ValueError
            return b.decode()
        except ValueError:
            raise AgentError(f"malformed {self.what} payload") from None

    def end(self) -> None:
        if self.at != len(self.p):
            raise AgentError(f"malformed {self.what} payload")


def _stat(i: _In) -> Stat:
    mode, uid, gid, nsec = struct.unpack("<IIII", i.take(16))
    size = i.u64()
    (sec,) = struct.unpack("<q", i.take(8))
    if nsec >= 10**9:
        raise AgentError("malformed stat payload")
    return Stat(mode, uid, gid, size, sec + nsec / 1e9)


def decode_info(p: bytes) -> Info:
    i = _In(p, "info")
    version = i.u32()
    generation = i.u64()
    gen_id = i.take(16).hex()
    uptime = i.u64()
    boot_id, machine_id = i.str(), i.str()
    n = i.u32()
    if n > MAX_ADDRESSES:
        raise AgentError("malformed info payload")
    addresses = [i.str() for _ in range(n)]
    i.end()
    return Info(version, generation, gen_id, uptime, boot_id, machine_id, addresses)


# ---------------------------------------------------------------- the connection


class Connection:
    """One request's connection to the agent (the VMM's CONNECT handshake done)."""

    def __init__(self, uds: Path | str, port: int, timeout: float):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(str(uds))
            self.sock.sendall(f"CONNECT {port}\n".encode())
            line = b""
            while not line.endswith(b"\n") and len(line) < 32:
                b = self.sock.recv(1)  # a byte at a time: what follows is the agent's
                if not b:
                    break
                line += b
        except ConnectionResetError:
            line = b""
        except BaseException:
            self.sock.close()
            raise
        if not line.startswith(b"OK "):
            self.sock.close()
            raise NoAgent(f"no agent answers on vsock port {port} (the VMM answered {line!r})")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, kind: int, payload: bytes = b"") -> None:
        self.sock.sendall(frame(kind, payload))

    def _exact(self, n: int, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                b = self.sock.recv(min(n - len(buf), 1 << 20))
            except ConnectionResetError:
                b = b""
            except TimeoutError:
                raise AgentError(f"the agent did not answer {what} in time") from None
            if not b:
                if not buf and n == HEADER.size:
                    raise AgentClosed(f"the agent closed the connection during {what} without an answer")
                raise AgentError(f"the stream ended inside a frame during {what}")
            buf += b
        return bytes(buf)

    def recv(self, what: str) -> tuple[int, bytes]:
        """The next frame (type, payload); an ERROR frame raises AgentError with its code."""
        version, kind, reserved, length = HEADER.unpack(self._exact(HEADER.size, what))
        if version != VERSION:
            raise AgentError(f"protocol version {version} (this client speaks {VERSION})")
        if reserved or kind not in KNOWN:
            raise AgentError(f"bad frame header (type {kind:#x}, reserved {reserved:#x})")
        if length > MAX_PAYLOAD:
            raise AgentError(f"frame of {length} bytes (at most {MAX_PAYLOAD})")
        payload = self._exact(length, what) if length else b""
        if kind == ERROR:
            i = _In(payload, "error")
            code, message = i.u32(), i.str()
            i.end()
            raise AgentError(f"the agent answered error {code}: {message}", code)
        return kind, payload

    def expect_ok(self, what: str) -> bytes:
        kind, p = self.recv(what)
        if kind != OK:
            raise AgentError(f"the agent sent a frame of type {kind:#x} during {what}")
        return p


class Execution:
    """A running command (Agent.exec_stream): iterate for ("stdout" | "stderr", bytes) as
    they come; then .completed has how it ended. Write stdin with send_stdin/close_stdin,
    signal it with signal(), resize its pty with resize(); close() kills it."""

    def __init__(self, conn: Connection, stdin: bool):
        self.conn = conn
        self.stdin_open = stdin
        self.pid: int | None = None
        self.completed: Completed | None = None
        self._lock = threading.Lock()
        self._stdout = bytearray()
        self._stderr = bytearray()

    def __enter__(self) -> Execution:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connection: a command still running is killed by the agent."""
        self.conn.close()

    def _send(self, kind: int, payload: bytes) -> None:
        with self._lock:
            self.conn.send(kind, payload)

    def send_stdin(self, data: bytes) -> None:
        """Sends bytes to the command's stdin (exec_stream(stdin=True), or a pty)."""
        view = memoryview(data)
        for i in range(0, len(data), CHUNK):
            self._send(DATA, bytes(view[i : i + CHUNK]))

    def close_stdin(self) -> None:
        """Ends the command's stdin (in pty mode: the terminal's end of file, VEOF)."""
        if self.stdin_open:
            self.stdin_open = False
            self._send(DATA, b"")

    def signal(self, sig: int) -> None:
        """Sends signal `sig` to the command's process group."""
        self._send(SIGNAL, struct.pack("<I", sig))

    def resize(self, rows: int, cols: int) -> None:
        """A pty's new size."""
        self._send(RESIZE, struct.pack("<HH", rows, cols))

    def __iter__(self) -> Iterator[tuple[str, bytes]]:
        while self.completed is None:
            kind, p = self.conn.recv("exec")
            if kind == STARTED:
                i = _In(p, "started")
                self.pid = i.u32()
                i.end()
            elif kind in (STDOUT, STDERR):
                yield ("stdout" if kind == STDOUT else "stderr"), p
            elif kind == EXIT:
                if len(p) != 8:
                    raise AgentError("malformed exit payload")
                signaled, timed_out, reserved, code = struct.unpack("<BBHI", p)
                if signaled > 1 or timed_out > 1 or reserved or (not signaled and code > 255):
                    raise AgentError("malformed exit payload")
                self.completed = Completed(
                    bytes(self._stdout), bytes(self._stderr), -code if signaled else code, bool(timed_out)
                )
                self.conn.close()
            else:
                raise AgentError(f"the agent sent a frame of type {kind:#x} during exec")

    def wait(self, max_output: int = 1 << 30) -> Completed:
        """Collects the output to the end (each stream at most max_output bytes) and returns
        how the command ended."""
        for stream, b in self:
            buf = self._stdout if stream == "stdout" else self._stderr
            if len(buf) + len(b) > max_output:
                self.close()
                raise AgentError(f"{stream} exceeds {max_output} bytes")
            buf += b
        assert self.completed is not None
        return self.completed


# ---------------------------------------------------------------- the agent


class Agent:
    """The agent of one VM, through the VMM's vsock socket `uds` (boot --vsock-uds)."""

    def __init__(self, uds: Path | str, port: int = AGENT_PORT, timeout: float = 60.0):
        self.uds = Path(uds)
        self.port = port
        self.timeout = timeout

    def connect(self) -> Connection:
        return Connection(self.uds, self.port, self.timeout)

    def _request(self, kind: int, payload: bytes) -> Connection:
        c = self.connect()
        try:
            c.send(kind, payload)
        except BaseException:
            c.close()
            raise
        return c

    def wait_listening(self, timeout: float) -> Info:
        """Retries info() while nothing listens on the agent's port, or the agent closes the
        connection (it is being restarted), for at most `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.info()
            except (NoAgent, AgentClosed):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def info(self) -> Info:
        with self._request(INFO, b"") as c:
            return decode_info(c.expect_ok("info"))

    def exec_stream(
        self,
        argv: Sequence[str],
        *,
        stdin: bool = False,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float | None = None,
        pty: tuple[int, int] | None = None,
    ) -> Execution:
        """Starts a command; returns its Execution to iterate over its output as it comes.
        stdin=True: send it with send_stdin()/close_stdin() (else it reads /dev/null);
        pty=(rows, cols): a pty for stdin, stdout and stderr (output arrives as stdout);
        timeout: seconds until the agent kills it (exit_code -9, timed_out)."""
        timeout_ms = 0 if timeout is None else max(1, int(timeout * 1000))
        c = self._request(EXEC, exec_payload(argv, env, cwd, stdin or pty is not None, pty, timeout_ms))
        # The command may run long without output: reads wait for its own timeout, if any.
        c.sock.settimeout(None if timeout is None else timeout + self.timeout)
        return Execution(c, stdin or pty is not None)

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float | None = None,
        max_output: int = 1 << 30,
    ) -> Completed:
        """Runs a command to its end with `input` on stdin (else /dev/null); returns its
        Completed (output at most max_output bytes per stream)."""
        ex = self.exec_stream(argv, stdin=input is not None, env=env, cwd=cwd, timeout=timeout)
        errors: list[BaseException] = []

        def feed() -> None:
            assert input is not None
            try:
                ex.send_stdin(input)
                ex.close_stdin()
            except OSError as e:  # the command ended or the connection broke: the reader says which
                errors.append(e)

        writer = threading.Thread(target=feed, daemon=True) if input is not None else None
        with ex:
            if writer:
                writer.start()
            done = ex.wait(max_output)
        if writer:
            writer.join()
        return done

    def read_file(self, path: str, max_bytes: int = 1 << 30) -> bytes:
        """A guest file's content (at most max_bytes)."""
        with self._request(READ_FILE, _str(path)) as c:
            data = bytearray()
            while True:
                kind, p = c.recv("read_file")
                if kind == FILE_DATA:
                    if len(data) + len(p) > max_bytes:
                        raise AgentError(f"{path} exceeds {max_bytes} bytes")
                    data += p
                elif kind == OK:
                    i = _In(p, "read_file")
                    n = i.u64()
                    i.end()
                    if n != len(data):
                        raise AgentError(f"read_file: the agent counted {n} bytes, sent {len(data)}")
                    return bytes(data)
                else:
                    raise AgentError(f"the agent sent a frame of type {kind:#x} during read_file")

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Writes a guest file atomically (a temporary file beside it, synced, renamed over it)."""
        if mode & ~0o7777:
            raise AgentError(f"mode {mode:#o}")
        with self._request(WRITE_FILE, struct.pack("<II", mode, 0) + _str(path)) as c:
            view = memoryview(data)
            sent: OSError | None = None
            try:
                for i in range(0, len(data), CHUNK):
                    c.send(DATA, bytes(view[i : i + CHUNK]))
                c.send(DATA, b"")
            except OSError as e:  # an early ERROR frame explains it: read that first
                sent = e
            p = c.expect_ok("write_file")
            if sent is not None:
                raise AgentError(f"write_file: {sent}")
            count = _In(p, "write_file")
            n = count.u64()
            count.end()
            if n != len(data):
                raise AgentError(f"write_file: the agent wrote {n} of {len(data)} bytes")

    def stat(self, path: str) -> Stat:
        with self._request(STAT, _str(path)) as c:
            i = _In(c.expect_ok("stat"), "stat")
            s = _stat(i)
            i.end()
            return s

    def list(self, path: str, max_entries: int = 100_000) -> list[Entry]:
        """A guest directory's entries (not . and ..), in the directory's order."""
        with self._request(LIST, _str(path)) as c:
            entries: list[Entry] = []
            while True:
                kind, p = c.recv("list")
                if kind == ENTRY:
                    if len(entries) >= max_entries:
                        raise AgentError(f"{path} has more than {max_entries} entries")
                    i = _In(p, "entry")
                    s = _stat(i)
                    name = i.str()
                    i.end()
                    if name in ("", ".", "..") or "/" in name:
                        raise AgentError(f"malformed entry name {name!r}")
                    entries.append(Entry(name, s))
                elif kind == OK:
                    i = _In(p, "list")
                    n = i.u32()
                    i.end()
                    if n != len(entries):
                        raise AgentError(f"list: the agent counted {n} entries, sent {len(entries)}")
                    return entries
                else:
                    raise AgentError(f"the agent sent a frame of type {kind:#x} during list")

    def open_port(self, guest_port: int) -> socket.socket:
        """A stream to guest TCP port 127.0.0.1:guest_port, through the agent (blocking, no
        timeout: set your own)."""
        c = self._request(EXPOSE, struct.pack("<HH", guest_port, 0))
        try:
            p = c.expect_ok("expose")
            if p:
                raise AgentError("malformed expose payload")
        except BaseException:
            c.close()
            raise
        c.sock.settimeout(None)
        return c.sock

    def expose(self, guest_port: int, host: str = "tcp") -> Exposed:
        """Forwards a host socket to guest TCP port `guest_port`: host="tcp" listens on
        127.0.0.1 (a free port), host="unix" on a Unix socket in a private directory. Each
        host connection is a new agent connection. Close the Exposed (or use `with`)."""
        return Exposed(self, guest_port, host)


class Exposed:
    """A guest TCP port reachable at a host address (Agent.expose): .address is
    ("127.0.0.1", port) or a Unix socket's path."""

    def __init__(self, agent: Agent, guest_port: int, host: str):
        self.agent = agent
        self.guest_port = guest_port
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        if host == "tcp":
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.bind(("127.0.0.1", 0))
            self.address: tuple[str, int] | str = self._listener.getsockname()
        elif host == "unix":
            self._dir = tempfile.TemporaryDirectory(prefix="ignition-expose-")
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            path = os.path.join(self._dir.name, f"port-{guest_port}.sock")
            self._listener.bind(path)
            self.address = path
        else:
            raise ValueError(f"host must be 'tcp' or 'unix', not {host!r}")
        self._listener.listen(64)
        self.errors: list[BaseException] = []
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def __enter__(self) -> Exposed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        try:
            guest = self.agent.open_port(self.guest_port)
        except (AgentError, OSError) as e:
            self.errors.append(e)
            conn.close()
            return
        self._open.update((conn, guest))

        def pump(src: socket.socket, dst: socket.socket) -> None:
            try:
                while b := src.recv(1 << 16):
                    dst.sendall(b)
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_RDWR)

        t = threading.Thread(target=pump, args=(guest, conn), daemon=True)
        t.start()
        pump(conn, guest)
        t.join()
        for s in (conn, guest):
            self._open.discard(s)
            s.close()

    def close(self) -> None:
        """Stops listening and ends the forwarded connections."""
        self._listener.close()
        for s in list(self._open):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        if self._dir is not None:
            self._dir.cleanup()
