"""The ledger: durable per-model records (failures with their content, last good, pin)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from appliance.repository.ledger import (
    LOAD,
    PROBATION,
    VERIFICATION,
    Failure,
    LedgerEntry,
    ModelLedger,
    content_id,
    held_back,
    listing_id,
    record_failure,
    record_good,
    record_loading,
    record_pin,
    record_rollout_revision,
)
from appliance.repository.store import write_record


def _version(model_dir: Path, version: int, data: bytes = b"model") -> Path:
    folder = model_dir / str(version)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.onnx").write_bytes(data)
    return folder


def test_held_back_is_the_present_content_that_failed() -> None:
    entry = LedgerEntry(
        failed={
            2: Failure(LOAD, "corrupt", "files:a"),
            3: Failure(PROBATION, "rolled back", "files:b"),
            4: Failure(VERIFICATION, "bad sum", "listing:c"),
        }
    )
    contents = {1: "files:z", 2: "files:a", 3: "files:new"}  # 3 changed, 4 is not there
    assert held_back(entry, contents) == {2: entry.failed[2]}


def test_a_record_survives_a_new_ledger_and_is_written_whole(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "m"
    _version(model, 1)
    _version(model, 2, b"corrupt")
    ledger = ModelLedger(tmp_path / "state")
    content = content_id(model / "2")
    assert ledger.change(model, record_failure(2, LOAD, "cannot load", content))
    assert ledger.change(model, record_good(1))
    assert not ledger.change(model, record_good(1))  # nothing new: nothing to write
    ledger.save(model)
    files = list((tmp_path / "state" / "ledger").rglob("*.json"))
    assert [f.name for f in files] == ["m.json"]
    assert not list((tmp_path / "state" / "ledger").rglob("*.tmp"))
    assert json.loads(files[0].read_text())["last_good"] == 1

    again = ModelLedger(tmp_path / "state")  # a restart
    entry = again.entry(model)
    assert entry.last_good == 1
    assert entry.failed[2].stage == LOAD
    assert entry.failed[2].at  # when it was first seen
    assert set(again.held_back(model, [1, 2])) == {2}
    (model / "2" / "model.onnx").write_bytes(b"fixed upload")  # new content: a new chance
    assert again.held_back(model, [1, 2]) == {}


def test_the_same_failure_again_keeps_its_first_time(tmp_path: Path) -> None:
    ledger = ModelLedger(None)
    model = tmp_path / "m"
    ledger.change(model, record_failure(2, LOAD, "x", "files:a"))
    first = ledger.entry(model).failed[2]
    assert not ledger.change(model, record_failure(2, LOAD, "x", "files:a"))
    assert ledger.entry(model).failed[2] == first


def test_records_belong_to_their_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = ModelLedger(tmp_path / "state")
    one, two = tmp_path / "one" / "m", tmp_path / "two" / "m"
    ledger.change(one, record_pin(3))
    ledger.save(one)
    assert ModelLedger(tmp_path / "state").entry(two).pinned is None
    assert ModelLedger(tmp_path / "state").entry(one).pinned == 3
    # However the folder is spelled, it is one record.
    monkeypatch.chdir(tmp_path)
    assert ledger.entry(Path("one") / "m").pinned == 3


def test_a_pin_gives_the_pinned_version_a_new_chance(tmp_path: Path) -> None:
    ledger = ModelLedger(None)
    model = tmp_path / "m"
    ledger.change(model, record_failure(1, PROBATION, "rolled back", "files:a"))
    ledger.change(model, record_pin(1))
    assert ledger.entry(model).pinned == 1
    assert ledger.entry(model).failed == {}
    ledger.change(model, record_pin(None))
    assert ledger.entry(model).pinned is None


def test_a_store_version_is_identified_by_its_listing(tmp_path: Path) -> None:
    folder = _version(tmp_path / "m", 1)
    write_record(folder, {"model.onnx": ["etag1", 5]})
    assert content_id(folder) == listing_id({"model.onnx": ("etag1", 5)})
    os.utime(folder / "model.onnx", ns=(1, 1))  # a copy with other times is the same content
    assert content_id(folder) == listing_id({"model.onnx": ["etag1", 5]})
    write_record(folder, {"model.onnx": ["etag2", 5]})
    assert content_id(folder) != listing_id({"model.onnx": ["etag1", 5]})


def test_an_unreadable_record_starts_afresh(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "m"
    ledger = ModelLedger(tmp_path / "state")
    ledger.change(model, record_good(4))
    ledger.save(model)
    (file,) = (tmp_path / "state" / "ledger").rglob("m.json")
    file.write_text("{not json")
    assert ModelLedger(tmp_path / "state").entry(model) == LedgerEntry()
    file.write_text(json.dumps({"last_good": "x", "failed": {"2": {"stage": "load"}, "y": 1}}))
    entry = ModelLedger(tmp_path / "state").entry(model)
    assert entry.last_good is None
    assert list(entry.failed) == [2]


def test_a_loading_marker_left_by_an_earlier_process_is_that_versions_failure(
    tmp_path: Path,
) -> None:
    # Issue 31 item 11: the marker is on disk before the load; a new process finding it
    # records the version failed (its load killed the old one) and writes that at once.
    model = tmp_path / "repo" / "m"
    _version(model, 1)
    _version(model, 2, b"too big for memory")
    ledger = ModelLedger(tmp_path / "state")
    ledger.change(model, record_good(1))
    ledger.change(model, record_loading(2))
    ledger.save(model)  # ... and the process dies here
    after = ModelLedger(tmp_path / "state")
    entry = after.entry(model)
    assert entry.loading is None
    assert entry.last_good == 1
    assert "died while loading version 2" in entry.failed[2].reason
    assert after.held_back(model, [1, 2]).keys() == {2}
    on_disk = json.loads(next((tmp_path / "state" / "ledger").rglob("m.json")).read_text())
    assert on_disk["loading"] is None
    assert "2" in on_disk["failed"]
    # A load that ended cleared its marker: nothing is blamed.
    ledger.change(model, record_loading(None))
    ledger.save(model)
    assert 1 not in ModelLedger(tmp_path / "state").entry(model).failed


def test_the_highest_rollout_revision_is_kept_across_restarts(tmp_path: Path) -> None:
    # Issue 31 item 6.
    model = tmp_path / "repo" / "m"
    _version(model, 1)
    ledger = ModelLedger(tmp_path / "state")
    assert ledger.change(model, record_rollout_revision(3))
    assert not ledger.change(model, record_rollout_revision(2))  # never lowered
    ledger.save(model)
    assert ModelLedger(tmp_path / "state").entry(model).rollout_revision == 3


def test_the_last_good_version_is_held_back_only_at_its_second_death_in_a_row(
    tmp_path: Path,
) -> None:
    # A power cut while the boot loads the last good version leaves the same marker as a kill.
    model = tmp_path / "repo" / "m"
    _version(model, 1)

    def dies_loading() -> ModelLedger:
        ledger = ModelLedger(tmp_path / "state")
        ledger.change(model, record_loading(1))
        ledger.save(model)
        return ModelLedger(tmp_path / "state")  # the next start

    ledger = ModelLedger(tmp_path / "state")
    ledger.change(model, record_good(1))
    ledger.save(model)
    assert 1 not in dies_loading().entry(model).failed  # tried once more
    assert "died while loading version 1" in dies_loading().entry(model).failed[1].reason
