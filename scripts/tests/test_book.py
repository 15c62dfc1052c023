"""The book: its command reference matches the binaries, its internal links resolve, and it builds.

The reference page (book/src/reference.md) is generated from `--help` by
scripts/cli_reference.py; the link check follows every relative link and
`#anchor` (mdBook's heading ids) between the book's pages; the build runs
mdBook when it is installed (.ci/run installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ignition import paths

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
    r = subprocess.run([sys.executable, str(paths.SCRIPTS / "cli_reference.py"), "--check"],
                       capture_output=True, text=True)
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
        (str(p) for p in [Path.home() / ".cargo" / "bin" / "mdbook"] if p.exists()), None)


@pytest.mark.skipif(mdbook() is None, reason="mdbook is not installed (.ci/run installs it)")
def test_the_book_builds(tmp_path):
    r = subprocess.run([mdbook(), "build", str(BOOK), "-d", str(tmp_path / "html")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ERROR" not in r.stderr, r.stderr
    assert (tmp_path / "html" / "reference.html").exists()
