"""guest/build.sh input handling and the kernel config check (fast; no full build)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ignition.paths import REPO_ROOT

GUEST = REPO_ROOT / "guest"


def run_build(*args):
    return subprocess.run([str(GUEST / "build.sh"), *args], capture_output=True, text=True, timeout=60)


def test_help():
    r = run_build("--help")
    assert r.returncode == 0
    assert "--page-size 4k|16k" in r.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--page-size", "64k"], "invalid --page-size '64k'"),
        (["--page-size=8k"], "invalid --page-size '8k'"),
        (["--bogus"], "unknown option: --bogus"),
        (["--jobs", "0"], "invalid --jobs '0'"),
        (["--out"], "option --out needs a value"),
    ],
)
def test_usage_errors(args, message):
    r = run_build(*args)
    assert r.returncode == 2
    assert message in r.stderr


def write_kconfig_tree(root: Path) -> None:
    """A stand-in kernel source: check-config.sh only reads the Kconfig* files."""
    (root / "arch" / "arm64").mkdir(parents=True)
    (root / "Kconfig").write_text(
        "config PRINTK\n\tbool\nconfig NR_CPUS\n\tint\nmenuconfig SOUND\n\ttristate\n"
        "config PROC_FS\n\tbool\nconfig EFI\n\tbool\n"
    )
    (root / "arch" / "arm64" / "Kconfig").write_text("config ARM64_USE_LSE_ATOMICS\n\tbool\n")


def check_config(tmp_path: Path, fragment: str, dotconfig: str) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    write_kconfig_tree(src)
    (tmp_path / "frag").write_text(fragment)
    (tmp_path / ".config").write_text(dotconfig)
    return subprocess.run(
        [str(GUEST / "check-config.sh"), str(tmp_path / "frag"), str(tmp_path / ".config"), str(src)],
        capture_output=True,
        text=True,
        timeout=60,
    )


DOTCONFIG = "CONFIG_PRINTK=y\nCONFIG_NR_CPUS=8\nCONFIG_PROC_FS=y\nCONFIG_ARM64_USE_LSE_ATOMICS=y\n"


def test_config_check_accepts_matching_config(tmp_path):
    r = check_config(
        tmp_path,
        "# comment\n\nCONFIG_PRINTK=y\nCONFIG_NR_CPUS=8\nCONFIG_ARM64_USE_LSE_ATOMICS=y\n# CONFIG_EFI is not set\n",
        DOTCONFIG,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all 4 fragment options as requested" in r.stdout


def test_config_check_names_dropped_options(tmp_path):
    r = check_config(
        tmp_path,
        "CONFIG_PRINTK=y\n"
        "CONFIG_ARM64_USE_LSE_ATOMIC=y\n"  # misspelt: no Kconfig defines it
        "CONFIG_NR_CPUS=4\n"  # other value in .config
        "CONFIG_SOUND=y\n"  # defined, absent from .config
        "# CONFIG_PROC_FS is not set\n",  # set in .config
        DOTCONFIG,
    )
    assert r.returncode == 1
    out = r.stdout
    assert "CONFIG_ARM64_USE_LSE_ATOMIC: no Kconfig defines it" in out
    assert "CONFIG_NR_CPUS: wanted 4, got 8" in out
    assert "CONFIG_SOUND: wanted y, dropped by Kconfig" in out
    assert "CONFIG_PROC_FS: wanted not set, got y" in out
    assert "CONFIG_PRINTK" not in out
    assert "4 of 5 fragment options" in out


def test_real_fragment_parses(tmp_path):
    """Every line of guest/kernel.fragment is an option, a comment or blank."""
    r = check_config(tmp_path, (GUEST / "kernel.fragment").read_text(), DOTCONFIG)
    assert "cannot parse" not in r.stdout, r.stdout


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + script)
    (bin_dir / name).chmod(0o755)


def run_build_with_path(bin_dir: Path, *args):
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    return subprocess.run([str(GUEST / "build.sh"), *args], capture_output=True, text=True, timeout=60, env=env)


def test_refuses_macos_with_instructions(tmp_path):
    fake_tool(tmp_path / "bin", "uname", 'if [ "$1" = -s ]; then echo Darwin; else echo arm64; fi\n')
    r = run_build_with_path(tmp_path / "bin", "--out", str(tmp_path / "out"))
    assert r.returncode == 1
    assert "needs Debian-based Linux; this host is Darwin" in r.stderr
    assert 'docker run --rm -v "$PWD":/src -w /src debian:bookworm guest/build.sh' in r.stderr
    assert not (tmp_path / "out").exists(), "nothing should be created on a refused host"


def test_missing_package_is_named(tmp_path):
    # dpkg-query that reports bison as not installed and defers to the real one otherwise.
    real = subprocess.run(["sh", "-c", "command -v dpkg-query"], capture_output=True, text=True).stdout.strip()
    fake_tool(
        tmp_path / "bin",
        "dpkg-query",
        f'for a; do [ "$a" = bison ] && {{ echo not-installed; exit 0; }}; done\nexec {real} "$@"\n',
    )
    r = run_build_with_path(
        tmp_path / "bin", "--no-install", "--out", str(tmp_path / "out"), "--cache", str(tmp_path / "cache")
    )
    assert r.returncode == 1
    errors = [line for line in r.stderr.splitlines() if line.strip()]
    assert errors == ["[guest] error: missing package(s): bison; install with: sudo apt-get install bison"]
