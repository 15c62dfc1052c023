"""Drive a guest's serial console over a pty with pexpect.

Generic helpers for console tests and benchmarks: spawn a command (a VMM, QEMU,
...) whose stdio is the guest console, log in, run shell commands and read their
output, read a console no one else reads so it never fills (`Drain`). Nothing
here knows about a particular VMM (vm.py drives `boot`). Default timeouts are the
software-CPU base of timeouts.py; callers pass their backend's.

    from ignition import console
    child = console.spawn(["qemu-system-aarch64", ...], log_path="console.log")
    console.login(child, timeout=60)
    print(console.run(child, "uname -m"))        # -> "aarch64"
    console.paced_send(child, "poweroff\\n")
    status = console.wait_exit(child, timeout=30)
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator, Sequence

import pexpect

from .timeouts import BASE

# A shell prompt ends in "# " (root) or "$ ". Ignition's guest prints "ignition:~# ".
PROMPT = r"[#$] "
LOGIN = r"login: ?"
PASSWORD = r"[Pp]assword: ?"

_counter = itertools.count(1)


class ConsoleError(Exception):
    """The console did not show what was expected (timeout, EOF, failed command)."""


def spawn(
    argv: Sequence[str],
    *,
    timeout: float = BASE.cmd,
    log_path: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    dimensions: tuple[int, int] = (24, 80),
) -> pexpect.spawn[str]:
    """Start argv on a new pty (fixed window size, host-side echo off).

    Output is decoded as UTF-8 with undecodable bytes replaced. With log_path,
    everything read from the console is also written there.
    """
    child = pexpect.spawn(
        argv[0],
        list(argv[1:]),
        timeout=timeout,
        dimensions=dimensions,
        encoding="utf-8",
        codec_errors="replace",
        env=env,
        cwd=None if cwd is None else str(cwd),
        echo=False,
    )
    child.delaybeforesend = None  # pexpect sleeps 50 ms per send() by default; paced_send paces instead
    if log_path is not None:
        # Lives as long as the child: wait_exit() and terminate() close it.
        child.logfile_read = open(log_path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
    return child


def before(child: pexpect.spawn[str]) -> str:
    """The console's text before what the last expect matched ("" if nothing was read)."""
    return child.before if isinstance(child.before, str) else ""


def after(child: pexpect.spawn[str]) -> str:
    """The text the last expect matched ("" if it matched EOF or TIMEOUT)."""
    return child.after if isinstance(child.after, str) else ""


def match(child: pexpect.spawn[str]) -> re.Match[str]:
    """The re.Match of the last expect(), which must have matched a regular expression."""
    m = child.match
    if not isinstance(m, re.Match):
        raise ConsoleError(f"the last expect() matched no regular expression but {m!r}")
    return m


def _tail(child: pexpect.spawn[str], n: int = 600) -> str:
    return before(child)[-n:]


def expect(
    child: pexpect.spawn[str], patterns: str | type[pexpect.EOF] | Sequence[str], timeout: float, what: str
) -> int:
    """child.expect(patterns): the index of the pattern that matched (a regular expression,
    pexpect.EOF, or a sequence of regular expressions); raises ConsoleError naming `what` on
    timeout or EOF."""
    try:
        if isinstance(patterns, (str, type)):
            return child.expect(patterns, timeout=timeout)
        return child.expect([*patterns], timeout=timeout)
    except pexpect.TIMEOUT:
        raise ConsoleError(f"timed out after {timeout:g}s waiting for {what}; last output:\n{_tail(child)}") from None
    except pexpect.EOF:
        raise ConsoleError(
            f"console closed (process exited) while waiting for {what}; last output:\n{_tail(child)}"
        ) from None


def paced_send(child: pexpect.spawn[str], text: str, chunk: int = 8, delay: float = 0.02) -> None:
    """Type text in chunks of `chunk` bytes with `delay` seconds between them.

    A PL011's RX FIFO holds 16 bytes; writing faster than the guest drains it
    loses characters.
    """
    for i in range(0, len(text), chunk):
        child.send(text[i : i + chunk])
        if i + chunk < len(text):
            time.sleep(delay)


def login(
    child: pexpect.spawn[str],
    timeout: float = BASE.boot,
    user: str = "root",
    password: str = "",
    prompt: str = PROMPT,
) -> None:
    """Wait for `login:`, log in as `user`, and wait for the shell prompt."""
    expect(child, LOGIN, timeout, "the login: prompt")
    answer_login(child, timeout, user, password, prompt)


def answer_login(
    child: pexpect.spawn[str],
    timeout: float = BASE.boot,
    user: str = "root",
    password: str = "",
    prompt: str = PROMPT,
) -> None:
    """Log in at a `login:` already read: type `user` (and `password` if asked), wait for the prompt."""
    paced_send(child, user + "\n")
    if expect(child, [PASSWORD, prompt], timeout, "a password prompt or the shell prompt") == 0:
        paced_send(child, password + "\n")
        expect(child, prompt, timeout, "the shell prompt after the password")


KERNEL_LINE = re.compile(r"^\[ *\d+\.\d+\] [^\n]*(?:\n|$)", re.MULTILINE)
"""A kernel message on the console (printk with CONFIG_PRINTK_TIME)."""


def run_status(child: pexpect.spawn[str], cmd: str, timeout: float = BASE.cmd, prompt: str = PROMPT) -> tuple[int, str]:
    """Run a shell command at the prompt; return (exit status, output).

    The command is bracketed by echoes of unique markers. The markers are typed
    with a quote pair inside ('ab''cd'), so the terminal's echo of the typed
    line never matches the printed marker. The command runs in a { } group on
    its own line, so it may be a list, end in & or span lines. Line ends in
    the output become "\\n" (a pty may add a \\r: QEMU's stdio keeps ONLCR on,
    giving "\\r\\r\\n"), and the final one is removed. Kernel messages the serial
    console interleaves (printk lines, `[    6.824626] text`, such as the RNG reseed a
    restore announces) are dropped.
    """
    tag = f"{next(_counter)}{secrets.token_hex(4)}"
    begin_a, begin_b = f"@@B{tag}", "@@"
    end_a, end_b = f"@@E{tag}", "@@"
    begin, end = begin_a + begin_b, end_a + end_b
    paced_send(child, f"echo '{begin_a}''{begin_b}'; {{\n{cmd}\n}}; echo '{end_a}''{end_b}' $?\n")
    expect(child, re.escape(begin) + r"\r*\n", timeout, f"the start of output of {cmd!r}")
    expect(child, r"(?:\r*\n)?" + re.escape(end) + r" (\d+)\r*\n", timeout, f"the end of output of {cmd!r}")
    output = re.sub(r"\r+\n", "\n", before(child))
    output = KERNEL_LINE.sub("", output)
    status = int(match(child).group(1))
    expect(child, prompt, timeout, f"the prompt after {cmd!r}")
    return status, output


def run(child: pexpect.spawn[str], cmd: str, timeout: float = BASE.cmd, prompt: str = PROMPT) -> str:
    """Run a shell command; return its output. Raises ConsoleError if it exits non-zero."""
    status, output = run_status(child, cmd, timeout, prompt)
    if status != 0:
        raise ConsoleError(f"{cmd!r} exited with status {status}; output:\n{output}")
    return output


def wait_exit(child: pexpect.spawn[str], timeout: float = BASE.cmd) -> int:
    """Wait for the process to exit; return its exit status (128+N if killed by signal N)."""
    expect(child, pexpect.EOF, timeout, "the process to exit")
    child.close()
    _close_log(child)
    if child.exitstatus is not None:
        return child.exitstatus
    return 128 + (child.signalstatus or 0)


def terminate(child: pexpect.spawn[str]) -> None:
    """Kill the process if it is still running and close the pty and log file."""
    try:
        if child.isalive():
            child.terminate(force=True)
        child.close(force=True)
    finally:
        _close_log(child)


class Drain:
    """Reads a pexpect child's console on a thread of its own while nothing else does, so
    that its output never fills the pty: a VMM writing its console to a full pty blocks (its
    guest's serial output and its own messages, on the threads that write them). `paused()`
    hands the console back for a `run`."""

    def __init__(self, child: pexpect.spawn[str]):
        self.child = child
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                try:
                    self.child.read_nonblocking(65536, timeout=0.2)
                except pexpect.TIMEOUT:
                    pass
                except (pexpect.EOF, OSError, ValueError):
                    return
            time.sleep(0.01)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            yield

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def _close_log(child: pexpect.spawn[str]) -> None:
    """Closes the console log spawn() opened, if any."""
    log = child.logfile_read
    if isinstance(log, io.IOBase) and not log.closed:
        log.close()


def time_to_login(
    argv: Sequence[str],
    timeout: float = BASE.boot,
    pattern: str = LOGIN,
    log_path: os.PathLike[str] | str | None = None,
) -> float:
    """Seconds from spawning argv to `pattern` (default `login:`) on its console.

    The process is killed afterwards. Raises ConsoleError on timeout or
    if the process exits first.
    """
    start = time.perf_counter()
    child = spawn(argv, log_path=log_path)
    try:
        expect(child, pattern, timeout, "the login: prompt")
        return time.perf_counter() - start
    finally:
        terminate(child)
