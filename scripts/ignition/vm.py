"""An Ignition VM: a `boot` process whose console is a pty.

    cfg = VmConfig(backend="emu")
    with Vm.boot(cfg, disk=copy_of_rootfs, store=store, name="golden", track_dirty=True) as vm:
        vm.login()
        print(vm.sh("uname -m"))                  # -> "aarch64"
        snap = vm.snapshot("golden", "full")      # Ctrl-A s; snap.pages, snap.write_ms, ...
        assert vm.quit() == 0                     # Ctrl-A x
    with Vm.restore(cfg, "golden", store=store) as vm:   # returns at the shell prompt
        print(vm.restored.total_us)

Every wait has a timeout from the backend's policy (timeouts.py) and raises
console.ConsoleError naming what it waited for.
"""

from __future__ import annotations

import os
import re
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import pexpect

from . import console, loglines, paths, timeouts
from .agent import Agent, AgentError, Completed, Execution, Exposed
from .branch import Child
from .console import ConsoleError
from .control import ControlClient

CTRL_A = "\x01"


@dataclass(frozen=True)
class VmConfig:
    """Which `boot` to run and with which backend: shared by every VM of a test run."""

    boot: Path = field(default_factory=paths.boot_bin)
    """$IGNITION_BOOT, else target/release/boot."""
    backend: str | None = None
    """`--backend`; None leaves it to boot (hvf on macOS/aarch64, else emu)."""
    gic: str | None = None
    """`--gic` (`userspace`, `hvf`); None leaves it to boot."""
    kernel: Path = paths.KERNEL
    timeouts: timeouts.Timeouts | None = None
    """None: timeouts.for_backend(backend), set on creation."""

    def __post_init__(self) -> None:
        if self.timeouts is None:
            object.__setattr__(self, "timeouts", timeouts.for_backend(self.backend))

    def argv(self, *args: str) -> list[str]:
        """`boot ARGS` with this configuration's --backend and --gic."""
        argv = [str(self.boot), *args]
        if self.backend:
            argv += ["--backend", self.backend]
        if self.gic:
            argv += ["--gic", self.gic]
        return argv


@dataclass(frozen=True)
class Layer:
    """A layer written through the control socket (its `snapshot` response)."""

    name: str
    kind: str
    """`full` or `diff`."""
    pages: int
    """16 KiB pages of memory it holds."""
    pause_us: int
    """Snapshot-pause-time (0 if the VM was paused already)."""
    write_ms: int
    """Snapshot-write-time."""


@dataclass(frozen=True)
class Snapshot:
    """What a Ctrl-A s printed (loglines), and the host's wall time for it."""

    name: str
    kind: str
    """`full` or `diff`."""
    pause_us: int
    """Snapshot-pause-time: vCPUs stopped -> running again."""
    write_ms: int
    """Snapshot-write-time: writing and committing the layer (whole ms); in the background
    mode, from the resume, while the guest runs."""
    saved_early: tuple[int, int] | None
    """Background mode: pages saved before a guest write and before a device write."""
    device_hold_us: int | None
    """Background mode: Snapshot-device-hold-time."""
    pages: int
    mib: float
    disk: loglines.DiskClone
    console_wall_s: float
    """Ctrl-A s written to the pty -> the `[snapshot] ... written` line read."""


@dataclass(frozen=True)
class PendingSnapshot:
    """A Ctrl-A s whose pause is over (Vm.snapshot_start)."""

    name: str
    t0: float
    pause_us: int


@dataclass(frozen=True)
class Restored:
    """The restore's log lines, and the host's wall times (seconds from spawn)."""

    restore_ms: int
    """Restore-time, whole ms."""
    stages: loglines.RestoreStages
    disk_us: int
    """Opening the chain's disk under the VM's overlay (Restore-disk; part of the resolve stage)."""
    disk_layers: int
    """The layers the disk is read from (the whole image and the disk diffs above it)."""
    logged_wall_s: float
    """spawn -> all three lines read."""
    wall_s: float
    """spawn -> the shell prompt answering the Enter sent once logged (without a prompt
    asked for: the lines read)."""

    @property
    def total_us(self) -> int:
        return self.stages.total_us


class Vm:
    """A running `boot` on a pty. Use Vm.boot or Vm.restore; end it with quit(),
    poweroff(), kill() or terminate() (a `with` block terminates it)."""

    def __init__(
        self,
        cfg: VmConfig,
        args: Sequence[str],
        log_path: os.PathLike[str] | str | None = None,
        control: bool = False,
        agent: bool = False,
    ):
        """Spawns `boot ARGS` (with cfg's backend and gic); the console goes to log_path. With
        control, `boot` also listens on a control socket in a private directory (snapshot(name)).
        With agent, the VM also gets a vsock device there (and a control socket): exec(),
        read_file(), write_file(), expose() and wait_ready() go to the guest agent."""
        self.cfg = cfg
        control = control or agent
        self._control_dir = tempfile.TemporaryDirectory(prefix="ignition-ctl-") if control else None
        self.control_path = Path(self._control_dir.name) / "control.sock" if self._control_dir else None
        if self.control_path is not None:
            args = [*args, "--control", str(self.control_path)]
        self.timeouts = cfg.timeouts or timeouts.for_backend(cfg.backend)
        self._agent: Agent | None = None
        if agent:
            assert self._control_dir is not None
            self.vsock_path: Path | None = Path(self._control_dir.name) / "vsock.sock"
            args = [*args, "--vsock-uds", str(self.vsock_path)]
            self._agent = Agent(self.vsock_path, timeout=self.timeouts.cmd)
        else:
            self.vsock_path = None
        self._ctl: ControlClient | None = None
        self.children: list[Child] = []
        """The children of this VM's branches (branch()); terminate() stops those still running."""
        self.branched: dict[str, Any] | None = None
        """The last branch()'s whole answer (layer, dir, children, total_ms)."""
        self.argv = cfg.argv(*args)
        self.log_path = log_path
        self.restored: Restored | None = None
        self._at_login = False
        self.t_spawn = time.perf_counter()
        self.child = console.spawn(self.argv, log_path=log_path, timeout=self.timeouts.boot)

    @classmethod
    def boot(
        cls,
        cfg: VmConfig,
        *,
        disk: os.PathLike[str] | str,
        log_path: os.PathLike[str] | str | None = None,
        mem: int | None = None,
        cpus: int | None = None,
        store: os.PathLike[str] | str | None = None,
        name: str | None = None,
        track_dirty: bool = False,
        extra: Sequence[str] = (),
        control: bool = False,
        agent: bool = False,
    ) -> Vm:
        """A fresh boot of cfg.kernel on `disk` (mem in MiB); returns at once (see login(), or
        wait_ready() with agent). With control, snapshot(name) works over the VM's control
        socket; with agent, the guest agent's methods too (exec, read_file, ...)."""
        args = ["--kernel", str(cfg.kernel), "--disk", str(disk)]
        if mem is not None:
            args += ["--mem", str(mem)]
        if cpus is not None:
            args += ["--cpus", str(cpus)]
        return cls(cfg, args + _snapshot_args(store, name, track_dirty) + list(extra), log_path, control, agent)

    @classmethod
    def restore(
        cls,
        cfg: VmConfig,
        spec: str,
        *,
        store: os.PathLike[str] | str,
        log_path: os.PathLike[str] | str | None = None,
        name: str | None = None,
        track_dirty: bool = False,
        extra: Sequence[str] = (),
        wait: bool = True,
        control: bool = False,
        agent: bool = False,
    ) -> Vm:
        """`boot --restore spec`. With wait (the default), returns once the restore is logged
        (self.restored) and the shell answers an Enter with its prompt; with agent too, once
        the guest agent answered with the new generation (wait_ready). With control and
        agent, as boot() (a snapshot taken with an agent needs agent=True: its vsock device)."""
        args = ["--restore", spec] + _snapshot_args(store, name, track_dirty) + list(extra)
        vm = cls(cfg, args, log_path, control, agent)
        if wait:
            try:
                vm.wait_restored(prompt=not agent)
                if agent:
                    vm.wait_ready()
            except BaseException:
                vm.terminate()
                raise
        return vm

    def __enter__(self) -> Vm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def control(self, path: os.PathLike[str] | str | None = None) -> ControlClient:
        """A new connection to this VM's control socket: `path` (`--control PATH` passed in
        extra), else the socket of a VM started with control=True."""
        path = path if path is not None else self.control_path
        if path is None:
            raise ValueError("this VM has no control socket: start it with control=True")
        return ControlClient(path, self.timeouts.boot)

    @property
    def pid(self) -> int:
        assert self.child.pid is not None, "spawned"
        return self.child.pid

    @property
    def match(self) -> re.Match[str]:
        """The re.Match of the last expect()."""
        return console.match(self.child)

    # The console

    def expect(self, patterns: str | type[pexpect.EOF] | Sequence[str], what: str, timeout: float | None = None) -> int:
        """Waits for a pattern (or one of a list: returns its index); timeout default: cmd."""
        return console.expect(self.child, patterns, self.timeouts.cmd if timeout is None else timeout, what)

    def send(self, text: str) -> None:
        """Writes text to the console at once (escapes, single keys)."""
        self.child.send(text)

    def type(self, text: str) -> None:
        """Types text at the guest's pace (console.paced_send)."""
        console.paced_send(self.child, text)

    def guest_boot_time_ms(self) -> int:
        """Waits for `Guest-boot-time = N ms`; returns N."""
        self.expect(loglines.GUEST_BOOT_TIME, "the Guest-boot-time line", self.timeouts.boot)
        return int(self.match.group(1))

    def wait_login(self) -> float:
        """Waits for `login:`; returns the seconds since spawn."""
        self.expect(console.LOGIN, "the login: prompt", self.timeouts.boot)
        self._at_login = True
        return time.perf_counter() - self.t_spawn

    def login(self, user: str = "root", password: str = "") -> None:
        """Logs in (waiting for `login:` unless wait_login() saw it) and waits for the prompt."""
        if not self._at_login:
            self.wait_login()
        self._at_login = False
        console.answer_login(self.child, self.timeouts.boot, user, password)

    def sh_status(self, cmd: str, timeout: float | None = None) -> tuple[int, str]:
        """Runs a shell command at the prompt; returns (exit status, output) (console.run_status)."""
        return console.run_status(self.child, cmd, self.timeouts.cmd if timeout is None else timeout)

    def sh(self, cmd: str, timeout: float | None = None) -> str:
        """Runs a shell command; returns its output; raises ConsoleError if it exits non-zero."""
        return console.run(self.child, cmd, self.timeouts.cmd if timeout is None else timeout)

    # The guest agent (a VM started with agent=True)

    @property
    def agent(self) -> Agent:
        """The guest agent's client."""
        if self._agent is None:
            raise ValueError("this VM has no guest agent: start it with agent=True")
        return self._agent

    def wait_ready(self, timeout: float | None = None, agent: bool | None = None) -> dict[str, object]:
        """Waits until the VMM calls the VM ready (its control socket's status: the vCPUs run,
        and a restore of a snapshot whose agent had answered has its agent's answer) and, with
        agent (default: the VM was started with agent=True), until the guest agent answered
        with the VM's generation ID (status agent "ready"); returns that status. Raises
        AgentError if the VMM reports the agent failed (or, with agent, absent), ConsoleError
        on the timeout (default: boot) or if boot exited."""
        timeout = self.timeouts.boot if timeout is None else timeout
        agent = self._agent is not None if agent is None else agent
        deadline = time.monotonic() + timeout
        while self.control_path is not None and not self.control_path.exists():  # boot is starting
            if not self.child.isalive() or time.monotonic() > deadline:
                raise ConsoleError("boot exited or made no control socket")
            time.sleep(0.05)
        with self.control() as c:
            while True:
                st = c.status()
                if st["ready"] and (not agent or st["agent"] == "ready"):
                    return st
                if st["agent"] == "failed":
                    raise AgentError(f"the VMM reports the guest agent failed: {st['agent_error']}")
                if agent and st["agent"] == "absent":
                    raise AgentError("the VMM reports no guest agent (nothing listened on its port)")
                if not self.child.isalive():
                    raise ConsoleError("boot exited before the VM was ready")
                if time.monotonic() > deadline:
                    raise ConsoleError(f"the VM was not ready within {timeout:.0f} s (agent: {st['agent']})")
                time.sleep(0.05)

    def exec(
        self,
        argv: Sequence[str],
        *,
        input: bytes | None = None,
        env: dict[str, str] | None = None,
        cwd: str = "",
        timeout: float | None = None,
    ) -> Completed:
        """Runs argv in the guest through the agent; returns Completed(stdout, stderr,
        exit_code). timeout: seconds until the agent kills it (default: cmd)."""
        return self.agent.exec(
            argv, input=input, env=env, cwd=cwd, timeout=self.timeouts.cmd if timeout is None else timeout
        )

    def run(self, cmd: str, timeout: float | None = None) -> str:
        """Runs a shell command (`sh -c cmd`) through the agent; returns its stdout, stripped
        (as sh() returns console output); raises AgentError with its stderr if it exits
        non-zero. Each call is a new shell: background jobs outlive it, `jobs` does not."""
        return self.exec(["sh", "-c", cmd], timeout=timeout).check().stdout.decode().strip()

    def run_status(self, cmd: str, timeout: float | None = None) -> tuple[int, str]:
        """Runs a shell command through the agent; returns (exit code, stdout and stderr
        stripped)."""
        r = self.exec(["sh", "-c", cmd], timeout=timeout)
        return r.exit_code, (r.stdout + r.stderr).decode().strip()

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
        """A command whose output streams as it comes (Agent.exec_stream)."""
        return self.agent.exec_stream(argv, stdin=stdin, env=env, cwd=cwd, timeout=timeout, pty=pty)

    def read_file(self, path: str, max_bytes: int = 1 << 30) -> bytes:
        """A guest file's content, through the agent."""
        return self.agent.read_file(path, max_bytes)

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        """Writes a guest file atomically, through the agent."""
        self.agent.write_file(path, data, mode)

    def expose(self, guest_port: int, host: str = "tcp") -> Exposed:
        """Forwards a host address (Exposed.address: 127.0.0.1:PORT, or a Unix socket with
        host="unix") to guest TCP port guest_port."""
        return self.agent.expose(guest_port, host)

    # Snapshots and restore

    @overload
    def snapshot(self, name: str) -> Layer: ...

    @overload
    def snapshot(self, name: str, kind: str) -> Snapshot: ...

    def snapshot(self, name: str, kind: str | None = None) -> Layer | Snapshot:
        """snapshot(name): over the control socket (a VM started with control=True), once the
        layer is stored; returns its Layer. Raises ControlError if the VMM refuses or fails.

        snapshot(name, kind): Ctrl-A s on the console: waits for the pause time, the write
        time, the disk clone and the `[snapshot] KIND 'name'` lines, and returns what they
        say. Raises ConsoleError if the VMM reports a failure or writes another kind."""
        if kind is None:
            if self._ctl is None:
                self._ctl = self.control()
            r = self._ctl.snapshot(name)
            return Layer(r["name"], r["kind"], r["pages"], r["pause_us"], r["write_ms"])
        return self.snapshot_finish(self.snapshot_start(name), kind)

    def branch(
        self, count: int, name: str | None = None, net: str | None = None, start: str | None = None
    ) -> list[Child]:
        """The control socket's `branch` (a VM started with control=True and track_dirty):
        writes layer `name` and starts `count` children restored from it (name-1 ..
        name-count, each a daemonized boot with its own sockets in the branch directory, next
        to this VM's control socket), on the host ends of template `net` if given
        (`tap:vm{i}`), started as `start` says ("fork", "exec"; default: fork where the VM
        can); returns their handles once every child is ready.
        Raises ControlError if the VMM refuses or a child fails (then none runs)."""
        with self.control() as c:
            c.sock.settimeout(None)  # as long as the children take; the VMM bounds it
            answer = c.branch(count, name, net, start)
        self.branched = answer
        children = [Child.from_answer(ch, self.timeouts) for ch in answer["children"]]
        self.children += children
        return children

    def snapshot_start(self, name: str) -> PendingSnapshot:
        """Ctrl-A s, until the guest runs again (`Snapshot-pause-time`); in the background
        mode the layer is still being written: see snapshot_finish."""
        t0 = time.perf_counter()
        self.send(CTRL_A + "s")
        if (
            self.expect([loglines.SNAPSHOT_PAUSE_TIME, loglines.SNAPSHOT_FAILED], f"Snapshot-pause-time of '{name}'")
            == 1
        ):
            raise ConsoleError(f"the VMM refused the snapshot: {self.match.group(0).strip()}")
        return PendingSnapshot(name, t0, int(self.match.group(1)))

    def snapshot_finish(self, pending: PendingSnapshot, kind: str) -> Snapshot:
        """The rest of snapshot(): waits until the layer is written."""
        name = pending.name
        saved_early = device_hold_us = None
        pats = [
            loglines.SNAPSHOT_WRITE_TIME,
            loglines.SNAPSHOT_FAILED,
            loglines.SNAPSHOT_SAVED_BEFORE_WRITE,
            loglines.SNAPSHOT_DEVICE_HOLD_TIME,
        ]
        while (i := self.expect(pats, f"Snapshot-write-time of '{name}'")) != 0:
            if i == 1:
                raise ConsoleError(f"the VMM refused the snapshot: {self.match.group(0).strip()}")
            if i == 2:
                saved_early = (int(self.match.group(2)), int(self.match.group(3)))
            else:
                device_hold_us = int(self.match.group(1))
        write_ms = int(self.match.group(1))
        self.expect(loglines.SNAPSHOT_DISK_CLONE, "Snapshot-disk-clone")
        try:
            disk = loglines.parse_disk_clone(self.match.group(1))
        except ValueError as e:
            raise ConsoleError(str(e)) from None
        self.expect(loglines.snapshot_written(name), f"the [snapshot] line of '{name}'")
        wall = time.perf_counter() - pending.t0
        got = self.match.group(1)
        if got != kind:
            raise ConsoleError(f"expected a {kind} snapshot of '{name}', the VMM wrote a {got}")
        return Snapshot(
            name,
            kind,
            pending.pause_us,
            write_ms,
            saved_early,
            device_hold_us,
            int(self.match.group(2)),
            float(self.match.group(3)),
            disk,
            wall,
        )

    def wait_restored(self, prompt: bool = True) -> Restored:
        """Waits for `Restore-disk`, `Restore-time` and `Restore-stages`, then, with prompt,
        presses Enter and waits for the shell prompt (a console logged in when the snapshot
        was taken). Sets and returns self.restored."""
        pats = [loglines.RESTORE_TIME, loglines.RESTORE_STAGES, loglines.RESTORE_DISK]
        seen: dict[int, re.Match[str]] = {}
        while len(seen) < len(pats):
            i = self.expect(pats, "the Restore-disk, -time and -stages lines", self.timeouts.boot)
            seen[i] = self.match
        t_logged = time.perf_counter()
        try:
            stages = loglines.parse_restore_stages(seen[1].group(1))
        except ValueError as e:
            raise ConsoleError(str(e)) from None
        if prompt:
            self.type("\n")
            self.expect(console.PROMPT, "the shell prompt after Enter on the restored console")
        t_prompt = time.perf_counter()
        self.restored = Restored(
            int(seen[0].group(1)),
            stages,
            int(seen[2].group(1)),
            int(seen[2].group(2)),
            t_logged - self.t_spawn,
            t_prompt - self.t_spawn,
        )
        return self.restored

    # Ending

    def quit(self) -> int:
        """Ctrl-A x; returns boot's exit status (0 expected)."""
        self.send(CTRL_A + "x")
        return self.wait_exit()

    def poweroff(self) -> int:
        """`poweroff` in the guest; returns boot's exit status (0 expected)."""
        self.type("poweroff\n")
        return self.wait_exit()

    def wait_exit(self, timeout: float | None = None) -> int:
        """Waits for boot to exit; returns its status (128+N if killed by signal N)."""
        return console.wait_exit(self.child, self.timeouts.cmd if timeout is None else timeout)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        """Sends sig to boot and reaps it (so its pid is gone); returns its exit status."""
        os.kill(self.pid, sig)
        return self.wait_exit()

    def terminate(self) -> None:
        """Kills boot if it still runs and closes the pty and the log (console.terminate)."""
        if self._ctl is not None:
            self._ctl.close()
            self._ctl = None
        for ch in self.children:
            if ch.alive():
                ch.stop()
        console.terminate(self.child)
        if self._control_dir is not None:
            self._control_dir.cleanup()


def _snapshot_args(store: os.PathLike[str] | str | None, name: str | None, track_dirty: bool) -> list[str]:
    args = [] if store is None else ["--store", str(store)]
    if name is not None:
        args += ["--name", name]
    return args + (["--track-dirty"] if track_dirty else [])
