"""ignition.console (imported as harness) against a local shell on a pty (no guest needed)."""

from __future__ import annotations

import pytest

from ignition import console as harness

# A stand-in console: prompts for a login name, then runs an interactive sh
# with the prompt "box:~# ". With echo, the pty echoes typed input like a
# guest tty does.
FAKE_CONSOLE = 'stty {echo}; printf "box login: "; read user; echo "welcome $user"; PS1="box:~# " exec sh -i'


@pytest.fixture(params=["echo", "-echo"])
def console(request, tmp_path):
    child = harness.spawn(["sh", "-c", FAKE_CONSOLE.format(echo=request.param)], log_path=tmp_path / "console.log")
    yield child
    harness.terminate(child)


def test_login_and_run(console):
    harness.login(console, timeout=10)
    assert harness.run(console, "echo hello") == "hello"
    assert harness.run(console, "printf 'no newline'") == "no newline"
    assert harness.run(console, "printf 'a\\nb\\n\\nc\\n'") == "a\nb\n\nc"
    assert harness.run(console, "true") == ""
    assert harness.run(console, "echo $((6 * 7)); echo done") == "42\ndone"
    assert harness.run(console, "cd /; pwd") == "/"
    assert harness.run(console, "pwd") == "/", "commands run in the login shell, not a subshell"
    long = "x" * 300
    assert harness.run(console, f"echo {long}") == long


def test_status_and_failure(console):
    harness.login(console, timeout=10)
    assert harness.run_status(console, "sh -c 'echo out; exit 3'") == (3, "out")
    with pytest.raises(harness.ConsoleError, match="exited with status 1"):
        harness.run(console, "false")
    assert harness.run(console, "echo still-alive") == "still-alive"


def test_timeout_names_what_was_awaited(console):
    harness.login(console, timeout=10)
    with pytest.raises(harness.ConsoleError, match="timed out after 0.5s waiting for the end of output"):
        harness.run(console, "sleep 5", timeout=0.5)


def test_exit_status():
    child = harness.spawn(["sh", "-c", "echo bye; exit 5"])
    try:
        assert harness.wait_exit(child, timeout=10) == 5
    finally:
        harness.terminate(child)
