"""Every relative link in every Markdown file of the repository resolves: its file exists and, where it names a
heading (`file.md#a-heading`), that heading is in the file (GitHub's anchor for it). Issue 49: lab/kernels/README.md
linked ../docs/gpu.md and ../README.md, dead since the kernels moved into lab/."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def _markdown_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / p for p in out if (ROOT / p).exists()]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces to
    hyphens."""
    text = re.sub(r"[`*_]{1,2}(.+?)[`*_]{1,2}", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text, re.M)}


def broken_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())
    out = []
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file, _, frag = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif frag and dest.suffix == ".md" and frag not in _anchors(dest):
            out.append(f"{target}: no heading #{frag} in {dest.name}")
    return out


MARKDOWN = _markdown_files()


def test_the_markdown_files_are_found():
    assert ROOT / "README.md" in MARKDOWN and len(MARKDOWN) > 20


@pytest.mark.parametrize("path", MARKDOWN, ids=[str(p.relative_to(ROOT)) for p in MARKDOWN])
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_a_dead_link_and_a_missing_heading_are_found(tmp_path):
    (tmp_path / "b.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#a-heading-with-code) [gone](c.md) [bad](b.md#nothing) [web](https://x.y/z)\n"
                    "```\n[in a fence](nowhere.md)\n```\n")
    assert broken_links(page) == ["c.md: no such file", "b.md#nothing: no heading #nothing in b.md"]
