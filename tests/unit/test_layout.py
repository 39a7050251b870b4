"""appliance/'s top level holds folders that name their layer, each in the layers contract.

lint-imports checks the arrows between the folders it is told about; this test checks that it is
told about every one: a module left at appliance/'s top level, or a new folder missing from
pyproject.toml's layers contract, would otherwise sit under no contract at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import appliance

PACKAGE = Path(appliance.__file__).parent
PYPROJECT = PACKAGE.parent / "pyproject.toml"


def layers_contract() -> set[str]:
    """The folders the layers contract lists (read from pyproject.toml as text: Python 3.10
    has no tomllib)."""
    text = PYPROJECT.read_text()
    contract = re.search(r'type = "layers"\nlayers = \[(.*?)\]', text, flags=re.S)
    assert contract, "pyproject.toml has no import-linter layers contract"
    return set(re.findall(r"appliance\.(\w+)", contract.group(1)))


def test_nothing_but_the_package_files_at_the_top() -> None:
    loose = sorted(
        p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )
    assert loose == [], f"modules at appliance/'s top level, in no layer: {loose}"


def test_every_folder_is_a_layer_of_the_contract() -> None:
    folders = {
        p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    listed = layers_contract()
    assert folders - listed == set(), f"folders in no layer of the contract: {folders - listed}"
    assert listed - folders == set(), f"layers with no folder: {listed - folders}"
