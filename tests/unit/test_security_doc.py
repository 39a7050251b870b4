"""docs/security.md names a test for every defence: each one it names must exist, so that the
page cannot keep a defence whose test was renamed or removed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "security.md"
# `tests/x/test_y.py::test_z`, `test_y.py::test_z`, then `::test_w` continuing the same file;
# a `[param]` suffix names a parametrised case of the same function.
_REF = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)?::(test_\w+)(?:\[[^\]]*\])?`")
_FILE = re.compile(r"`((?:tests/[\w/]+/)?test_\w+\.py)(?:::[^`]*)?`")


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def _find(name: str) -> Path:
    if "/" in name:
        return ROOT / name
    found = sorted((ROOT / "tests").rglob(name))
    assert len(found) == 1, f"{name}: {found or 'no such test file'}"
    return found[0]


def test_every_test_the_security_page_names_exists() -> None:
    named: list[tuple[str, str]] = []
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        current = ""
        for match in re.finditer(r"`[^`]+`", line):
            token = match.group(0)
            file_only = _FILE.fullmatch(token)
            ref = _REF.fullmatch(token)
            if ref and ref.group(1):
                current = ref.group(1)
            elif file_only and not ref:
                current = file_only.group(1)
                continue
            if ref:
                assert current, f"{token} names no file before it: {line[:120]}"
                named.append((current, ref.group(2)))
    assert len(named) > 40  # the page was read
    missing = [f"{f}::{t}" for f, t in named if t not in _tests_in(_find(f))]
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"
