"""README says what the code does (issue 37, item 7): its example table names every model
`configs/generate.py` writes, and the tritonserver flags it calls ignored are exactly the ones
the flags code ignores (`--id` and `--backend-config` were said ignored; one is honoured, the
other in part)."""

from __future__ import annotations

import re
from pathlib import Path

from appliance.flags.serve import IGNORED_FLAGS
from configs.generate import write_repository

README = Path(__file__).resolve().parents[2] / "README.md"


def _example_table() -> set[str]:
    text = README.read_text()
    start = text.index("The example repository (`python -m configs.generate")
    table = text[start:].split("\n\n", 2)[1]  # the paragraph after the sentence
    names: set[str] = set()
    for row in table.splitlines()[2:]:  # past the header and the rule
        first = row.split("|")[1]
        names |= set(re.findall(r"`([a-z0-9_]+)`", first))
    return names


def test_the_readme_example_table_names_every_generated_model(tmp_path: Path) -> None:
    root = write_repository(tmp_path / "models")
    written = {p.name for p in root.iterdir() if p.is_dir()}
    shown = _example_table()
    assert written - shown == set(), f"generated but not in README's table: {written - shown}"
    assert shown - written == set(), f"in README's table but not generated: {shown - written}"


def test_the_readme_says_the_example_image_models_are_untrained() -> None:
    text = README.read_text()
    start = text.index("The example repository (`python -m configs.generate")
    table = text[start:].split("\n\n", 2)[1]
    for name in ("densenet_onnx", "squeezenet_onnx"):
        row = next(r for r in table.splitlines() if r.startswith(f"| `{name}`"))
        assert "untrained" in row, row


def test_the_flags_readme_calls_ignored_are_the_ones_the_code_ignores() -> None:
    text = README.read_text()
    listed = text.split("<!-- ignored-flags", 1)[1].split("<!-- /ignored-flags -->", 1)[0]
    listed = listed.split("-->", 1)[1]  # past the marker's own comment
    in_readme = set(re.findall(r"`--([a-z0-9-]+)`", listed))
    in_code = set(IGNORED_FLAGS)
    assert in_readme - in_code == set(), (
        f"README calls ignored, the code honours: {in_readme - in_code}"
    )
    assert in_code - in_readme == set(), (
        f"the code ignores, README does not say: {in_code - in_readme}"
    )
    assert "id" not in in_readme
    assert "backend-config" not in in_readme
