"""The fuzz corpus (fuzz/corpus/<target>/, kept in the repository) replayed through its
targets in plain Python, without atheris: every seed and every input a long run found (the
findings, once fixed, and the inputs that reached new code) must end in a result or the
target's expected error. A finding's file is named `finding-*`; each one failed before its fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz.run import NAMES
from fuzz.targets import CORPUS, TARGETS, corpus

CASES = [(name, path) for name in sorted(TARGETS) for path in corpus(name)]
MOST_CORPUS_BYTES = 1 << 20


def test_every_target_has_a_corpus_and_nothing_else_does() -> None:
    assert set(NAMES) == set(TARGETS)
    assert len(TARGETS) >= 12
    assert {p.name for p in CORPUS.iterdir() if p.is_dir()} == set(TARGETS)
    assert all(corpus(name) for name in TARGETS)


def test_the_corpus_stays_small() -> None:
    assert sum(p.stat().st_size for p in CORPUS.rglob("*") if p.is_file()) < MOST_CORPUS_BYTES


@pytest.mark.parametrize(("name", "path"), CASES, ids=[f"{n}/{p.name}" for n, p in CASES])
def test_corpus_input(name: str, path: Path) -> None:
    TARGETS[name](path.read_bytes())
