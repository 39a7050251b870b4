"""The SHA256SUMS examples in the docs are real SHA256SUMS lines: 64 hex digits, two spaces,
a path (a reader copies them to see the format)."""

from __future__ import annotations

import re

from tests.serverproc import ROOT

# A hex run long enough to be meant as a SHA256, before the two spaces of sha256sum's format.
SUMS_LINE = re.compile(r"^([0-9a-f]{40,80})  \S", re.MULTILINE)


def test_every_sha256_in_the_docs_has_64_digits() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = {
        (page.relative_to(ROOT).as_posix(), digest)
        for page in pages
        for digest in SUMS_LINE.findall(page.read_text())
    }
    assert found, "no SHA256SUMS example left to check"
    assert [(page, d, len(d)) for page, d in sorted(found) if len(d) != 64] == []
