"""The children of a `branch` (the control socket's verb; `Vm.branch`): handles to drive them.

    with Vm.boot(cfg, disk=d, store=s, name="src", track_dirty=True, agent=True) as vm:
        vm.wait_ready()
        children = vm.branch(4, name="b")        # b-1 .. b-4, all ready
        print(children[0].run("cat /proc/sys/kernel/random/boot_id"))
        for c in children:
            c.stop()

A child is a daemonized `boot` (not this process's child): its handle talks to its control
socket, its guest agent (through its vsock socket) and its console socket (ignition.attach).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pexpect

from . import attach
from .agent import Agent, Completed
from .control import ControlClient, ControlError
from .timeouts import BASE, Timeouts


def pid_alive(pid: int) -> bool:
    """Whether process pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


@dataclass
class Child:
    """One child of a branch, as the VM's answer lists it."""

    name: str
    pid: int
    control_path: Path
    console_path: Path
    vsock_path: Path | None
    cid: int | None
    log_path: Path
    pid_file: Path
    generation_id: str | None
    # Its network device's MAC ("52:54:00:12:34:56") and host end ("passt"), if the source
    # has a network device.
    mac: str | None = None
    net: str | None = None
    timeouts: Timeouts = BASE

    @classmethod
    def from_answer(cls, c: dict[str, Any], timeouts: Timeouts = BASE) -> Child:
        """A handle from one entry of the answer's `children`."""
        return cls(
            name=c["name"],
            pid=c["pid"],
            control_path=Path(c["control"]),
            console_path=Path(c["console"]),
            vsock_path=Path(c["vsock"]) if c["vsock"] else None,
            cid=c["cid"],
            log_path=Path(c["log"]),
            pid_file=Path(c["pid_file"]),
            generation_id=c["generation_id"],
            mac=c.get("mac"),
            net=c.get("net"),
            timeouts=timeouts,
        )

    def control(self) -> ControlClient:
        """A new connection to the child's control socket."""
        return ControlClient(self.control_path, self.timeouts.cmd)

    def status(self) -> dict[str, Any]:
        with self.control() as c:
            return c.status()

    @property
    def agent(self) -> Agent:
        """The child's guest agent."""
        if self.vsock_path is None:
            raise ValueError(f"{self.name} has no vsock device (its source had none)")
        return Agent(self.vsock_path, timeout=self.timeouts.cmd)

    def exec(self, argv: Sequence[str], *, input: bytes | None = None) -> Completed:
        return self.agent.exec(argv, input=input, timeout=self.timeouts.cmd)

    def run(self, cmd: str) -> str:
        """`sh -c cmd` through the agent; its stdout, stripped; AgentError if it fails."""
        return self.exec(["sh", "-c", cmd]).check().stdout.decode().strip()

    def read_file(self, path: str) -> bytes:
        return self.agent.read_file(path)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self.agent.write_file(path, data, mode)

    def console(self, log_path: os.PathLike[str] | str | None = None) -> pexpect.spawn[str]:
        """A client attached to the child's console socket (python3 -m ignition.attach)."""
        return attach.spawn(self.console_path, timeout=self.timeouts.cmd, log_path=log_path)

    def alive(self) -> bool:
        """Whether the child's `boot` runs: its pid is alive and, where /proc tells, still a
        process with `--name` this child's (a pid is reused once its process has ended)."""
        if not pid_alive(self.pid):
            return False
        try:
            argv = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            return False
        except OSError:
            return True  # no /proc (macOS): the pid is all there is
        return any(a == b"--name" and v == self.name.encode() for a, v in zip(argv, argv[1:]))

    def wait_gone(self, timeout: float | None = None) -> bool:
        """Waits until the child's process is gone; returns whether it is."""
        deadline = time.monotonic() + (self.timeouts.cmd if timeout is None else timeout)
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def stop(self) -> None:
        """Quits the child (the control socket's `quit`), or kills it if it does not end."""
        try:
            with self.control() as c:
                c.quit()
        except (OSError, ControlError):
            pass
        if not self.wait_gone():
            self.kill()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Sends sig to the child, if it runs, and waits until it is gone (for SIGKILL and
        SIGTERM)."""
        if not self.alive():
            return
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return
        if sig in (signal.SIGKILL, signal.SIGTERM):
            self.wait_gone()
