"""A client of `boot --control PATH`: newline-delimited JSON, one request, one response
(the protocol is in the book's control-socket chapter)."""

from __future__ import annotations

import base64
import json
import os
import socket
import time
from typing import Any


class ControlError(Exception):
    """An error response: .code (e.g. `bad_request`, `refused`) and .message."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ControlClient:
    """One connection to a VM's control socket."""

    def __init__(self, path: os.PathLike[str] | str, timeout: float = 60.0):
        """Connects, waiting up to `timeout` s for the socket to appear."""
        deadline = time.monotonic() + timeout
        while True:
            self.sock = socket.socket(socket.AF_UNIX)
            try:
                self.sock.connect(os.fspath(path))
                break
            except OSError:
                self.sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        self.sock.settimeout(timeout)
        self.file = self.sock.makefile("rwb")

    def raw(self, line: bytes) -> dict[str, Any]:
        """Sends one raw request line (newline added if missing); returns the decoded response."""
        if not line.endswith(b"\n"):
            line += b"\n"
        try:
            self.file.write(line)
            self.file.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The VM may answer and close before reading (e.g. `too_many_clients`): its line
            # is still in the receive buffer.
            pass
        reply = self.file.readline()
        if not reply:
            raise ConnectionError("the VM closed the control connection")
        decoded: dict[str, Any] = json.loads(reply)
        return decoded

    def request(self, command: str, **args: Any) -> dict[str, Any]:
        """Sends a request; returns its result, or raises ControlError."""
        reply = self.raw(json.dumps({"command": command, **args}).encode())
        if not reply["ok"]:
            raise ControlError(reply["error"]["code"], reply["error"]["message"])
        result: dict[str, Any] = reply["result"]
        return result

    def snapshot(self, name: str | None = None) -> dict[str, Any]:
        """Writes a snapshot; returns {name, kind, pages, pause_us, write_ms} once it is stored."""
        return self.request("snapshot", **({"name": name} if name else {}))

    def branch(
        self, count: int, name: str | None = None, net: str | None = None, start: str | None = None
    ) -> dict[str, Any]:
        """Writes layer `name` and starts `count` children from it, on the network host ends
        of template `net` if given (`tap:vm{i}`, {i} each child's number), started as `start`
        says ("fork" or "exec"; default: fork where the VM can); returns {layer, start, dir,
        children, total_ms} once every child is ready (the book's control-socket chapter)."""
        fields: dict[str, Any] = {"name": name} if name else {}
        if net is not None:
            fields["net"] = net
        if start is not None:
            fields["start"] = start
        return self.request("branch", count=count, **fields)

    def pause(self) -> None:
        self.request("pause")

    def resume(self) -> None:
        self.request("resume")

    def status(self) -> dict[str, Any]:
        return self.request("status")

    def quit(self) -> None:
        self.request("quit")

    def exec(self, argv: list[str], stdin: bytes | None = None, timeout_ms: int | None = None) -> dict[str, Any]:
        """Runs argv in the guest through its agent (the `exec` request); returns {exit_code,
        signal, timed_out, stdout, stderr} with stdout and stderr decoded to bytes. Raises
        ControlError (`exec_failed`, `refused` without an agent)."""
        args: dict[str, Any] = {"argv": argv}
        if stdin is not None:
            args["stdin"] = base64.b64encode(stdin).decode()
        if timeout_ms is not None:
            args["timeout_ms"] = timeout_ms
        r = self.request("exec", **args)
        return {**r, "stdout": base64.b64decode(r["stdout"]), "stderr": base64.b64decode(r["stderr"])}

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass  # unsent bytes of a request the VM refused
        finally:
            self.sock.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
