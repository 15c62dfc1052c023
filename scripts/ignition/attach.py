"""Attach to a VM's socket console (`boot --console socket:PATH`), as a terminal would.

    python3 -m ignition.attach PATH

The terminal goes into raw mode; what is typed goes to the guest, what the guest (and the
VMM) writes comes back. The console's escapes are the VMM's: Ctrl-A d detaches (the VM runs
on), Ctrl-A x quits the VM, Ctrl-A s writes a snapshot, Ctrl-A h lists them. The client ends
when the console closes the connection (a detach, the VM's end, or another client attached:
the console says so). On stdin's end (a pipe), the client stops sending and reads on until
the console closes. Exit status: 0, or 1 if the socket cannot be reached.

From Python, `spawn(path)` runs this client on a pty under pexpect, for the console helpers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import socket
import sys
import termios
import tty
from collections.abc import Iterator, Sequence
from pathlib import Path

import pexpect

from . import console
from .timeouts import BASE


@contextlib.contextmanager
def _raw(fd: int) -> Iterator[None]:
    """The terminal on fd in raw mode for the block (nothing if fd is not a terminal)."""
    if not os.isatty(fd):
        yield
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def attach(path: os.PathLike[str] | str, stdin: int = 0, stdout: int = 1) -> int:
    """Relays between the console at path and the file descriptors stdin and stdout until the
    console closes. Returns 0, or 1 (with a message on stderr) if it cannot connect."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(os.fspath(path))
    except OSError as e:
        print(f"ignition.attach: cannot attach to {os.fspath(path)}: {e}", file=sys.stderr)
        sock.close()
        return 1
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(stdin, selectors.EVENT_READ)
    with sock, _raw(stdin):
        while True:
            for key, _ in sel.select():
                if key.fileobj is sock:
                    data = sock.recv(65536)
                    if not data:
                        return 0
                    os.write(stdout, data)
                else:
                    data = os.read(stdin, 4096)
                    if data:
                        sock.sendall(data)
                    else:
                        sel.unregister(stdin)
                        sock.shutdown(socket.SHUT_WR)


def spawn(
    path: os.PathLike[str] | str,
    *,
    timeout: float = BASE.cmd,
    log_path: os.PathLike[str] | str | None = None,
) -> pexpect.spawn[str]:
    """This client attached to the console at path, on a pty under pexpect (console.spawn)."""
    return console.spawn([sys.executable, "-m", "ignition.attach", os.fspath(path)], timeout=timeout, log_path=log_path)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m ignition.attach",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", type=Path, help="the console socket (boot --console socket:PATH)")
    a = p.parse_args(argv)
    return attach(a.path)


if __name__ == "__main__":
    sys.exit(main())
