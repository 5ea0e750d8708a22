"""The README and the notes under docs/ stay navigable: every relative link (and image) points to
a file of the repository, every #anchor to a heading of the file it names, and the README's two
set-up commands are targets of the Makefile."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]

#: [text](target) and ![alt](target); the target ends at the first space or closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and inline code."""
    return LINK.findall(INLINE_CODE.sub("", FENCE.sub("", text)))


def is_relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # http:, https:, mailto:, ...


def anchors(markdown: Path) -> set[str]:
    """GitHub's anchors for a file's headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", markdown.read_text()).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(document: Path) -> list[str]:
    broken = []
    for target in links(document.read_text()):
        if not is_relative(target):
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (document.parent / path_part).resolve() if path_part else document
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return broken


@pytest.mark.parametrize("document", DOCUMENTS, ids=[str(d.relative_to(REPO_ROOT)) for d in DOCUMENTS])
def test_every_relative_link_points_to_an_existing_file_and_heading(document):
    assert broken_links(document) == []


def test_every_note_under_docs_is_linked_from_the_readme():
    linked = {(REPO_ROOT / target.partition("#")[0]).resolve()
              for target in links((REPO_ROOT / "README.md").read_text()) if is_relative(target)}
    unlinked = [d.name for d in DOCUMENTS[1:] if d.resolve() not in linked]
    assert unlinked == [], "docs/ notes the README does not link"


def test_the_readmes_two_commands_are_makefile_targets():
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"^make (\w+)", section, re.M)
    targets = set(re.findall(r"^([\w-]+):", (REPO_ROOT / "Makefile").read_text(), re.M))
    assert commands == ["demo", "test"]
    assert set(commands) <= targets


def test_the_link_check_finds_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "note.md").write_text("# A note\n\n## Its part\n")
    doc = tmp_path / "doc.md"
    doc.write_text("[ok](note.md#its-part) [file](missing.md) [anchor](note.md#nowhere) "
                   "[web](https://example.com/x) `[code](ignored.md)`\n")
    assert broken_links(doc) == ["missing.md: no such file", "note.md#nowhere: no heading #nowhere in note.md"]
