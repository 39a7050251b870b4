"""The repository index built from the runtime's records: a pure function over plain data."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from appliance.runtime.registry import READY, UNAVAILABLE, ModelRecord, ServedVersion
from appliance.services.results import IndexRow
from appliance.services.rows import index_rows

# The index looks only at which versions serve, never at the served objects themselves.
SERVED = cast(ServedVersion, object())


def record(
    name: str,
    *serving: int,
    state: str = UNAVAILABLE,
    reason: str = "",
    failed: dict[int, str] | None = None,
    notes: list[str] | None = None,
) -> ModelRecord:
    return ModelRecord(
        name=name,
        path=Path(name),
        state=READY if serving else state,
        reason=reason,
        versions=dict.fromkeys(serving, SERVED),
        failed=failed or {},
        notes=notes or [],
    )


def test_one_row_per_served_version_sorted_by_number() -> None:
    rows = index_rows([record("m", 10, 2, 1)], {})
    assert rows == [
        IndexRow("m", 1, READY, ""),
        IndexRow("m", 2, READY, ""),
        IndexRow("m", 10, READY, ""),  # numerically, as Triton lists versions
    ]


def test_a_model_without_versions_is_one_row_with_its_state_and_reason() -> None:
    unloaded = record("gone", state=UNAVAILABLE, reason="unloaded")
    assert index_rows([unloaded], {}) == [IndexRow("gone", None, UNAVAILABLE, "unloaded")]


def test_failed_versions_and_versions_whose_new_content_failed() -> None:
    model = record("m", 1, failed={1: "bad file", 2: "bad config"}, notes=["on CPU"])
    assert index_rows([model], {}) == [
        IndexRow("m", 1, READY, "on CPU; new content failed: bad file"),
        IndexRow("m", 2, UNAVAILABLE, "bad config"),
    ]


def test_versions_not_fetched_yet() -> None:
    pending = {("m", 1): "timeout", ("m", 3): "403", ("remote_only", 1): "offline"}
    rows = index_rows([record("m", 1)], pending)
    assert rows == [
        IndexRow("m", 1, READY, "new content not fetched: timeout"),  # old copy serves
        IndexRow("m", 3, UNAVAILABLE, "not fetched: 403"),
        IndexRow("remote_only", 1, UNAVAILABLE, "not fetched: offline"),
    ]


def test_models_on_disk_never_loaded_are_listed_unless_ready_only() -> None:
    records = [record("a", 1), record("c", state=UNAVAILABLE, reason="broken")]
    rows = index_rows(records, {}, on_disk=["a", "b", "c"])
    assert rows == [
        IndexRow("a", 1, READY, ""),
        IndexRow("b", None, "", ""),
        IndexRow("c", None, UNAVAILABLE, "broken"),
    ]
    assert index_rows(records, {}, on_disk=["a", "b", "c"], ready_only=True) == [
        IndexRow("a", 1, READY, "")
    ]


def test_ready_only_drops_failed_and_pending_versions() -> None:
    model = record("m", 2, failed={1: "bad"})
    assert index_rows([model], {("m", 3): "later"}, ready_only=True) == [
        IndexRow("m", 2, READY, "")
    ]
