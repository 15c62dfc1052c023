"""The book: its command reference matches the binaries, its internal links resolve, it builds,
every shell command it shows is run (here, or by CI) or says why it cannot be, and every
Python example it shows is run here.

The reference page (book/src/reference.md) is generated from `--help` by
`python3 -m ignition.cli_reference`; the link check follows every relative link and
`#anchor` (mdBook's heading ids) between the book's pages; the build runs
mdBook when it is installed (.ci/run installs it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ignition import console, paths, timeouts

BOOK = paths.REPO_ROOT / "book"
SRC = BOOK / "src"
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def heading_ids(md: str) -> set[str]:
    """mdBook's ids for the page's headings: lower case, spaces to '-', other punctuation dropped."""
    ids = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", md), re.M):
        text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", m.group(1))
        ids.add("".join(c for c in text.lower().replace(" ", "-") if c.isalnum() or c in "-_"))
    return ids


def pages() -> list[Path]:
    return sorted(SRC.rglob("*.md"))


@pytest.mark.skipif(sys.platform != "linux", reason="the reference is generated from the Linux binaries' --help")
def test_cli_reference_matches_the_binaries_help():
    for b in (paths.boot_bin(), paths.vmstore_bin()):
        if not b.exists():
            pytest.fail(f"{b} is missing: cargo build --release first")
    r = subprocess.run([sys.executable, "-m", "ignition.cli_reference", "--check"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_every_page_is_in_the_summary_and_every_entry_exists():
    summary = (SRC / "SUMMARY.md").read_text()
    listed = {SRC / t for t in LINK.findall(summary)}
    for p in listed:
        assert p.exists(), f"SUMMARY.md lists {p.relative_to(SRC)}, which does not exist"
    orphans = [p.relative_to(SRC) for p in pages() if p.name != "SUMMARY.md" and p not in listed]
    assert not orphans, f"pages not in SUMMARY.md (mdBook would not build them): {orphans}"


def test_internal_links_resolve():
    ids = {p: heading_ids(p.read_text()) for p in pages()}
    broken = []
    for page in pages():
        text = FENCE.sub("", page.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if SRC.resolve() not in dest.parents:
                broken.append(f"{page.name}: {target} leaves the book")
            elif not dest.exists():
                broken.append(f"{page.name}: {target}: no such page")
            elif anchor and dest.suffix == ".md" and anchor not in ids.get(dest, heading_ids(dest.read_text())):
                broken.append(f"{page.name}: {target}: no heading with id '{anchor}'")
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_broken_links(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# A `b` title\n\n## Interrupt delivery latency\n")
    assert heading_ids(page.read_text()) == {"a-b-title", "interrupt-delivery-latency"}
    assert LINK.findall("see [x](a.md#b) and ![img](i.png) and [y](https://e)") == ["a.md#b", "https://e"]


def mdbook() -> str | None:
    return shutil.which("mdbook") or next(
        (str(p) for p in [Path.home() / ".cargo" / "bin" / "mdbook"] if p.exists()), None
    )


@pytest.mark.skipif(mdbook() is None, reason="mdbook is not installed (.ci/run installs it)")
def test_the_book_builds(tmp_path):
    exe = mdbook()
    assert exe is not None
    r = subprocess.run(
        [exe, "build", str(BOOK), "-d", str(tmp_path / "html")], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ERROR" not in r.stderr, r.stderr
    assert (tmp_path / "html" / "reference.html").exists()


# Every shell command the book shows (```sh blocks, comments stripped) is run:
# by .ci/run or scripts/test.sh (CI), by a test below (RUN, placeholders such as
# DIR filled in), or it cannot run here (EXCEPTIONS, with the reason).
CI = {
    "scripts/setup.sh": ".ci/run",
    "guest/build.sh": ".ci/run",
    (
        "scripts/mac-check.sh --backend emu --suites test_boot_e2e,test_vmgenid_e2e,test_guest_fetch_e2e "
        "--benches boot,snapshot,branch --bench-runs 1"
    ): ".ci/run",
    "pip install ./snapshot-store/python": "scripts/test.sh",
    "python3 -m pytest -q scripts/tests/test_conformance.py": "scripts/test.sh",
    (
        "python3 -m pytest -q scripts/tests/test_kvm_unit_tests.py scripts/tests/test_kvm_unit_tests_e2e.py"
    ): "scripts/test.sh",
}
RUN = [
    "python3 -m ignition.bench.snapshot --mem 512 --runs 1",
    "python3 -m ignition.conformance --groups sgi,vtimer -v",
    "guest/conformance/build.sh --out DIR",
    "python3 -m ignition.bench.net --runs 1 --mib 8",
    "python3 -m ignition.bench.oci --full-mib 64 --runs 1",
    "python3 -m ignition.bench.cpu --short --runs 1",
    "python3 -m ignition.kvm_unit_tests --entries timer,debug-sstep -v",
    "python3 -m ignition.bench.agent --runs 20 --mib 4 --pty-kib 4 --reps 1",
    "python3 -m ignition.bench.restore_disk --runs 1 --disk-mib 256 --data-mib 64",
    "python3 -m ignition.debian_guest --out DIR",
    "python3 -m ignition.bench.branch --counts 1,8 --runs 1 --methods branch,hand --state idle",
    "python3 -m ignition.debian_rootfs --out DIR",
    "python3 -m ignition.bench.guests --runs 1",
]
RUN_TO_LOGIN = "cargo run --release --bin boot"
EXCEPTIONS = {
    "passt -f -s /tmp/passt.sock": "an interactive session; test_net_e2e.py starts passt and boot the same way",
    "cargo run --release --bin boot -- --net stream:/tmp/passt.sock": "an interactive session; "
    "test_net_e2e.py boots with --net stream:PATH",
    "cargo run --release --bin boot -- --net passt": "an interactive session; "
    "test_net_e2e.py and test_branch_e2e.py boot with --net passt",
    "python3 -m ignition.conformance --backend hvf --no-qemu": "the hvf backend: macOS on Apple silicon only",
    "scripts/mac-check.sh": "the hvf backend: macOS on Apple silicon only (CI runs it on emu, with fewer suites)",
    "python3 -m ignition.bench.snapshot": "the full benchmark (about 10 minutes); the same module runs with "
    "--mem 512 --runs 1",
    "python3 -m ignition.conformance": "every group; the CI test runs them all (test_conformance.py) and this "
    "module with two groups",
    "vmstore push golden+3 localhost:5000/sandboxes/py:v1 --plain-http": "needs a registry at localhost:5000; "
    "test_oci_e2e.py pushes golden+3 the same way to its own registry on a free port",
    "vmstore --store vmstore pull localhost:5000/sandboxes/py:v1 --plain-http": "needs that registry; "
    "test_oci_e2e.py pulls the same way from its own registry into an empty store",
    "boot --restore d3": "an interactive session; test_oci_e2e.py restores golden+3 from the pulled store",
    "python3 -m ignition.bench.oci": "the full benchmark (a few minutes); the same module runs with --full-mib 64 "
    "--runs 1",
    "python3 -m ignition.bench.cpu --floor": "the full benchmark (several minutes), with the unicorn_floor "
    "example built; the same module runs with --short --runs 1",
    "python3 -m ignition.kvm_unit_tests": "every entry (several minutes); test_kvm_unit_tests_e2e.py runs the "
    "gating ones and this test two",
    "python3 -m ignition.kvm_unit_tests --qemu live": "every entry on boot and on QEMU (about ten minutes); the "
    "same runner runs with --entries here",
    "python3 -m ignition.kvm_unit_tests --record-qemu": "rewrites the vendored record; test_kvm_unit_tests.py "
    "checks the record against the suite",
    "python3 -m ignition.bench.agent": "the full benchmark (several minutes); the same module runs with --runs 20 "
    "--mib 4 --pty-kib 4 --reps 1",
    "boot --console socket:/tmp/vm.console --name golden &": "an interactive session; test_headless_e2e.py boots "
    "with --console socket:PATH",
    "python3 -m ignition.attach /tmp/vm.console": "an interactive session; test_headless_e2e.py attaches with "
    "ignition.attach on a pty",
    (
        "boot --daemonize --console socket:/tmp/vm.console --control /tmp/vm.sock --pid-file /tmp/vm.pid "
        "--log-file /tmp/vm.log --name golden"
    ): "test_headless_e2e.py daemonizes the same way, in its own directory",
    "boot --kernel DIR/Image --initrd DIR/initrd.cpio --vsock-uds /tmp/vm.vsock": "an interactive session; "
    "test_debian_guest_e2e.py boots Debian's kernel and initramfs the same way",
    "python3 -m ignition.image build REGISTRY/REPOSITORY:TAG -o rootfs.ext4": "needs a registry holding an arm64 "
    "image; test_image_e2e.py builds one from Debian's packages, pushes it to its own registry and builds it the same "
    "way (ignition.image.build)",
    "boot --disk rootfs.ext4 --vsock-uds /tmp/vm.vsock": "an interactive session; test_image_e2e.py boots the built "
    "image with the guest agent",
    "boot branch --control /tmp/vm.sock --count 4 --name web": "needs a VM listening on /tmp/vm.sock; "
    "test_branch_e2e.py runs boot branch (table and --json) against its own source",
    "python3 -m ignition.bench.restore_disk": "the full benchmark (a few minutes per boot binary); the same module "
    "runs with --runs 1 --disk-mib 256 --data-mib 64",
}


def book_commands() -> list[tuple[str, str]]:
    out = []
    for page in pages():
        for block in re.findall(r"^```(?:sh|bash)\n(.*?)^```", page.read_text(), re.M | re.S):
            for line in block.splitlines():
                cmd = re.sub(r"\s+#.*$", "", line).strip()
                if cmd and not cmd.startswith("#"):
                    out.append((page.name, cmd))
    return out


def test_every_book_command_is_run_by_a_test_or_ci():
    ci_text = {f: (paths.REPO_ROOT / f).read_text() for f in set(CI.values())}
    missing = []
    for page, cmd in book_commands():
        if cmd in CI:
            assert cmd.split()[0] in ci_text[CI[cmd]] or cmd in ci_text[CI[cmd]], f"{cmd}: not in {CI[cmd]}"
        elif cmd not in RUN and cmd != RUN_TO_LOGIN and cmd not in EXCEPTIONS:
            missing.append(f"{page}: {cmd}")
    assert not missing, "book commands no test or CI step runs (add them to test_book.py):\n" + "\n".join(missing)
    shown = {c for _, c in book_commands()}
    stale = [c for c in [*CI, *RUN, RUN_TO_LOGIN, *EXCEPTIONS] if c not in shown]
    assert not stale, f"listed here but no longer in the book: {stale}"


@pytest.mark.e2e
@pytest.mark.qemu
@pytest.mark.parametrize("cmd", RUN)
def test_book_command_runs(cmd, tmp_path, guest_out):
    argv = [a.replace("DIR", str(tmp_path / "out")) for a in shlex.split(cmd)]
    if argv[0] == "python3":
        argv[0] = sys.executable  # the interpreter the package is installed in
    # Benchmarks write their results under the test's directory, not bench-results/.
    env = dict(os.environ, IGNITION_RESULTS_DIR=str(tmp_path / "results"))
    # Bounded inside the test's hang limit, so that a hung benchmark's output is kept.
    r = subprocess.run(
        argv, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=0.75 * timeouts.hang_limit("qemu"), env=env
    )
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


@pytest.mark.e2e
@pytest.mark.skipif(
    sys.platform == "darwin",
    reason="on a Mac, cargo run relinks boot without the hypervisor entitlement (HV_DENIED), and would leave "
    "the signed boot the other tests run unsigned; the README's Mac path builds, signs, then runs it",
)
def test_book_boot_command_reaches_the_login_prompt(guest_out, tmp_path):
    """`cargo run --release --bin boot` boots guest/out's disk read-write: it is put back after."""
    rootfs = guest_out / "rootfs.ext4"
    saved = tmp_path / "rootfs.ext4"
    shutil.copy2(rootfs, saved)
    try:
        child = console.spawn(
            shlex.split(RUN_TO_LOGIN), log_path=tmp_path / "boot.log", timeout=600, cwd=str(paths.REPO_ROOT)
        )
        try:
            console.expect(child, console.LOGIN, 600, "the login prompt of cargo run --release --bin boot")
        finally:
            console.terminate(child)
    finally:
        shutil.copy2(saved, rootfs)


# Every Python example the book shows (```python blocks, by page and first
# line) is run by one of the tests below, as the book shows it.
PY_RUN = {
    ("python.md", "import vmstore"): "test_book_python_vmstore_example",
    ("python.md", "from ignition import Vm, VmConfig"): "test_book_python_ignition_example",
    ("control-socket.md", "from ignition.control import ControlClient"): "test_book_python_control_example",
    ("agent.md", "from ignition import Vm, VmConfig"): "test_book_python_agent_example",
    ("branching.md", "from ignition import Vm, VmConfig"): "test_book_python_branch_example",
}


def book_python_blocks() -> dict[tuple[str, str], str]:
    out = {}
    for page in pages():
        for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S):
            out[(page.name, block.splitlines()[0])] = block
    return out


def test_every_book_python_example_is_run():
    shown = book_python_blocks()
    assert set(shown) == set(PY_RUN), (
        f"not run (add them to PY_RUN): {sorted(set(shown) - set(PY_RUN))}; "
        f"no longer in the book: {sorted(set(PY_RUN) - set(shown))}"
    )


def run_python(block: str, cwd: Path, timeout: float = 60) -> str:
    """Runs `block` in a fresh interpreter in `cwd` (the `ignition` package is installed: pip install -e ./scripts)."""
    r = subprocess.run([sys.executable, "-c", block], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


def test_book_python_vmstore_example(tmp_path):
    """On a store `golden` -> d1 -> d2 -> d3 the vmstore module writes in ./vmstore."""
    vmstore = pytest.importorskip("vmstore", reason="pip install ./snapshot-store/python")
    s = vmstore.Store.create(tmp_path / "vmstore")
    ram = bytearray(os.urandom(64 * 4096))
    s.write_full("golden", ram, b"", page_size=4096)
    for i, (name, parent) in enumerate([("d1", "golden"), ("d2", "d1"), ("d3", "d2")]):
        ram[i * 4096] ^= 1
        s.write_diff(name, parent, ram, [i], b"")
    out = run_python(book_python_blocks()[("python.md", "import vmstore")], tmp_path)
    assert sorted(line.split()[0] for line in out.splitlines()[:4]) == ["d1", "d2", "d3", "golden"], out
    assert re.search(r"^\d+ bytes hashed$", out, re.M), out


@pytest.mark.e2e
def test_book_python_ignition_example(tmp_path, guest_out):
    """Boots a copy of the guest's disk as ./copy.ext4 and snapshots it into ./vmstore."""
    shutil.copyfile(guest_out / "rootfs.ext4", tmp_path / "copy.ext4")
    out = run_python(book_python_blocks()[("python.md", "from ignition import Vm, VmConfig")], tmp_path, 900)
    kind, pages_, pause_us = out.split()
    assert kind == "full" and int(pages_) > 0 and float(pause_us) > 0, out
    assert (tmp_path / "vmstore" / "golden" / "manifest.json").is_file()


@pytest.mark.e2e
def test_book_python_control_example(tmp_path, guest_out, cfg):
    """Against a VM listening on the example's socket path (a private one in its place)."""
    from ignition.vm import Vm

    shutil.copyfile(guest_out / "rootfs.ext4", tmp_path / "copy.ext4")
    sock = tmp_path / "vm.sock"
    block = book_python_blocks()[("control-socket.md", "from ignition.control import ControlClient")]
    assert "/tmp/vm.sock" in block
    with Vm.boot(
        cfg,
        disk=tmp_path / "copy.ext4",
        store=tmp_path / "vmstore",
        name="golden",
        track_dirty=True,
        extra=["--control", str(sock)],
        log_path=tmp_path / "boot.log",
    ) as vm:
        vm.login()
        out = run_python(block.replace("/tmp/vm.sock", str(sock)), tmp_path, 900)
        assert out.split() == ["paused"], out
        assert vm.sh("echo alive") == "alive"
        assert vm.quit() == 0
    assert (tmp_path / "vmstore" / "golden" / "manifest.json").is_file()


@pytest.mark.e2e
def test_book_python_agent_example(tmp_path, guest_out):
    """Boots a copy of the guest's disk as ./copy.ext4 with the agent."""
    shutil.copyfile(guest_out / "rootfs.ext4", tmp_path / "copy.ext4")
    out = run_python(book_python_blocks()[("agent.md", "from ignition import Vm, VmConfig")], tmp_path, 900)
    lines = out.splitlines()
    assert lines[0] == "b'aarch64\\n' b'oops\\n' 3", out
    assert lines[1].startswith("guest port 8080 is at ('127.0.0.1', "), out


@pytest.mark.e2e
def test_book_python_branch_example(tmp_path, guest_out):
    """Boots a copy of the guest's disk as ./copy.ext4 with the agent and branches it."""
    shutil.copyfile(guest_out / "rootfs.ext4", tmp_path / "copy.ext4")
    out = run_python(book_python_blocks()[("branching.md", "from ignition import Vm, VmConfig")], tmp_path, 900)
    rows = [line.split() for line in out.splitlines()]
    assert [r[0] for r in rows] == ["web-1", "web-2"] and all(r[2] == "hello" for r in rows), out
    assert rows[0][1] != rows[1][1], out
