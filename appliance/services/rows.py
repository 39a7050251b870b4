"""Typed rows from the runtime's state: the repository index and model statistics."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from appliance.runtime.registry import READY, UNAVAILABLE, ModelRecord, ServedVersion
from appliance.scheduling.stats import Duration
from appliance.services.results import (
    INFER_DURATIONS,
    BatchStatistics,
    IndexRow,
    InferStatistics,
    ModelStatistics,
    StatisticDuration,
)


def _duration(duration: Duration) -> StatisticDuration:
    return StatisticDuration(duration.count, duration.ns)


def model_statistics(served: ServedVersion) -> ModelStatistics:
    """A snapshot of a served version's counters."""
    stats = served.stats
    return ModelStatistics(
        name=served.name,
        version=served.version,
        last_inference_ms=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=InferStatistics(
            **{name: _duration(getattr(stats, name)) for name in INFER_DURATIONS}
        ),
        batch_stats=tuple(
            BatchStatistics(
                batch_size=size,
                compute_input=_duration(per_size.compute_input),
                compute_infer=_duration(per_size.compute_infer),
                compute_output=_duration(per_size.compute_output),
            )
            for size, per_size in sorted(stats.by_batch_size.items())
        ),
    )


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def _model_rows(record: ModelRecord, pending: Mapping[int, str]) -> list[IndexRow]:
    """One model's rows; `pending`: its versions not fetched into the store yet, and why."""
    note = "; ".join(record.notes)
    rows: dict[int, tuple[str, str]] = {}
    for version in record.versions:
        if version in record.failed:  # new content failed; the loaded copy keeps serving
            rows[version] = (READY, _join(note, f"new content failed: {record.failed[version]}"))
        else:
            rows[version] = (READY, note)
    for version, why in record.failed.items():
        if version not in record.versions:
            rows[version] = (UNAVAILABLE, why)
    for version, why in pending.items():
        if version in record.versions:  # an older copy of this version still serves
            rows[version] = (READY, _join(note, f"new content not fetched: {why}"))
        else:
            rows[version] = (UNAVAILABLE, f"not fetched: {why}")
    if not rows:
        return [IndexRow(record.name, None, record.state, record.reason)]
    return [IndexRow(record.name, v, state, reason) for v, (state, reason) in rows.items()]


def index_rows(
    records: Iterable[ModelRecord],
    pending: Mapping[tuple[str, int], str],
    on_disk: Iterable[str] = (),
    ready_only: bool = False,
) -> list[IndexRow]:
    """The repository index from the runtime's records, the versions still to be fetched
    (model, version -> why) and the model folders on disk (listed, never loaded, unless
    `ready_only`). Sorted by name, then version, as Triton lists them."""
    by_name = {record.name: record for record in records}
    names = by_name.keys() | {model for model, _ in pending}
    rows: list[IndexRow] = []
    for name in names:
        record = by_name.get(name) or ModelRecord(name=name, path=None)
        rows += _model_rows(record, {v: why for (m, v), why in pending.items() if m == name})
    if ready_only:
        rows = [row for row in rows if row.state == READY]
    else:
        rows += [IndexRow(name, None, "", "") for name in on_disk if name not in names]
    rows.sort(key=lambda row: (row.name, -1 if row.version is None else row.version))
    return rows
