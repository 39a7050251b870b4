"""Poll-mode decisions and folder fingerprints."""

from __future__ import annotations

import os
from pathlib import Path

from appliance.repository.local import fingerprint
from appliance.repository.poller import Changes, plan_changes


def test_a_change_waits_until_it_has_settled() -> None:
    served = {"a": "1", "b": "1"}
    # first poll sees a new fingerprint for a: not yet
    assert plan_changes(served, {"a": "1", "b": "1"}, {"a": "2", "b": "1"}) == Changes((), ())
    # second poll sees the same: load it
    assert plan_changes(served, {"a": "2", "b": "1"}, {"a": "2", "b": "1"}) == Changes(("a",), ())


def test_new_and_removed_models() -> None:
    served = {"a": "1", "gone": "1"}
    seen = {"a": "1", "new": "5"}
    assert plan_changes(served, seen, {"a": "1", "new": "5"}) == Changes(("new",), ("gone",))


def test_a_still_changing_folder_is_not_loaded() -> None:
    assert plan_changes({}, {"a": "1"}, {"a": "2"}) == Changes((), ())


def test_fingerprint_follows_content_size_and_time(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    model = tmp_path / "1" / "model.onnx"
    model.write_bytes(b"abc")
    first = fingerprint(tmp_path)
    assert fingerprint(tmp_path) == first
    model.write_bytes(b"abcd")
    assert fingerprint(tmp_path) != first
    second = fingerprint(tmp_path)
    os.utime(model, ns=(1, 1))
    assert fingerprint(tmp_path) != second
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "model.onnx").write_bytes(b"x")
    assert fingerprint(tmp_path) not in (first, second)


def test_bad_entries_in_a_local_folder_are_skipped(tmp_path: Path) -> None:
    """Issue 31: a version folder '²' (int() raises) or a file named like a version stopped
    the scan of every model."""
    from appliance.repository.local import list_models, list_versions

    model = tmp_path / "m"
    for name in ("1", "\u00b2", "07", "9" * 30):
        (model / name).mkdir(parents=True)
    (model / "3").write_text("a file where version 3's folder would be")
    assert list_versions(model) == [1]
    (tmp_path / ("x" * 240)).mkdir()  # longer than a model name may be
    (tmp_path / "file").write_text("not a model")
    assert list(list_models([tmp_path])) == ["m"]
