"""The server's side of Python models' custom metrics (`pb_utils.MetricFamily` / `Metric`).

One store per server holds every family by name, as Triton's single metrics registry does:
instances (of one model or several) that create the same family and labels share one series,
and a family lives while an instance that created it does. Each instance answers its model's
metric calls here and lists the families it holds through `ModelInstance.custom_metrics`.
Errors carry Triton's texts, so a model that checks them behaves the same.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_backends.api import CustomMetricFamily, MetricSample

KINDS = ("counter", "gauge", "histogram")  # by pb_utils.MetricKind number
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

LabelKey = tuple[tuple[str, str], ...]


class MetricError(Exception):
    """A metric call the model made wrongly; the message goes back to it."""


@dataclass
class _Series:
    value: float = 0.0
    bounds: tuple[float, ...] = ()  # histogram bucket upper bounds, ascending
    counts: list[int] = field(default_factory=list)  # per bucket, then +Inf (not cumulative)
    sum: float = 0.0
    count: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    holders: int = 0
    series: dict[LabelKey, _Series] = field(default_factory=dict)


class MetricStore:
    """Every custom metric family of the server's Python models; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}

    def hold_family(self, name: str, description: str, kind_number: int) -> None:
        """Create the family, or take the existing one of that name; one hold per call."""
        if not _NAME.fullmatch(name):
            raise MetricError(
                f"Failed to create metric family: invalid metric name '{name}' (letters, "
                "digits, '_' and ':', not starting with a digit)"
            )
        if not 0 <= kind_number < len(KINDS):
            raise MetricError("Unknown metric kind")
        kind = KINDS[kind_number]
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, description, kind)
            elif family.kind != kind or family.description != description:
                raise MetricError(
                    f"Failed to create metric family: a metric family named '{name}' already "
                    f"exists as a {family.kind} described '{family.description}'"
                )
            family.holders += 1

    def release_family(self, name: str) -> None:
        """Drop one hold; the family and its values go with the last one."""
        with self._lock:
            family = self._families.get(name)
            if family is not None:
                family.holders -= 1
                if family.holders <= 0:
                    del self._families[name]

    def series(self, name: str, labels: Mapping[str, str], buckets: list[float] | None) -> LabelKey:
        """The family's series for these labels, made on first use; its key."""
        for label in labels:
            if not _LABEL.fullmatch(label):
                raise MetricError(f"Error when creating Metric: invalid label name '{label}'")
        key = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
        with self._lock:
            family = self._family(name)
            if family.kind == "histogram":
                if buckets is None:
                    raise MetricError("Failed to create metric. Missing required buckets.")
                bounds = tuple(float(b) for b in buckets)
                if any(b >= c for b, c in itertools.pairwise(bounds)):
                    raise MetricError(
                        "Error when creating Metric: histogram buckets must be in increasing order"
                    )
            elif buckets is not None:
                raise MetricError("Failed to create metric. Unexpected buckets found.")
            else:
                bounds = ()
            if key not in family.series:
                family.series[key] = _Series(bounds=bounds, counts=[0] * (len(bounds) + 1))
        return key

    def operate(self, name: str, key: LabelKey, operation: str, value: float) -> float:
        """increment | set | observe | value on one series; the value for "value"."""
        with self._lock:
            family = self._family(name)
            series = family.series.get(tuple((str(k), str(v)) for k, v in key))
            if series is None:
                raise MetricError(f"metric family '{name}' has no series with labels {key}")
            kind = family.kind
            if operation == "increment":
                if kind == "histogram":
                    raise MetricError(
                        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM "
                        "does not support Increment"
                    )
                if kind == "counter" and value < 0:
                    raise MetricError(
                        "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER "
                        "can only be incremented monotonically by non-negative values"
                    )
                series.value += value
            elif operation == "set":
                if kind != "gauge":
                    raise MetricError(
                        f"Failed to set metric value: TRITONSERVER_METRIC_KIND_{kind.upper()} "
                        "does not support Set"
                    )
                series.value = value
            elif operation == "observe":
                if kind != "histogram":
                    raise MetricError(
                        "Failed to observe metric value: "
                        f"TRITONSERVER_METRIC_KIND_{kind.upper()} does not support Observe"
                    )
                series.counts[bisect.bisect_left(series.bounds, value)] += 1
                series.sum += value
                series.count += 1
            elif operation == "value":
                if kind == "histogram":
                    raise MetricError(
                        "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does "
                        "not support Value"
                    )
            else:
                raise MetricError(f"Unknown metric operation '{operation}'")
            return series.value

    def snapshot(self, names: Iterable[str]) -> list[CustomMetricFamily]:
        """The named families as they are now (names no longer held are left out)."""
        out = []
        with self._lock:
            for name in names:
                family = self._families.get(name)
                if family is not None:
                    out.append(_snapshot(family))
        return out

    def _family(self, name: str) -> _Family:
        family = self._families.get(name)
        if family is None:
            raise MetricError(
                "Invalid metric operation as the corresponding 'MetricFamily' has been deleted."
            )
        return family


def _snapshot(family: _Family) -> CustomMetricFamily:
    samples = []
    for labels, series in family.series.items():
        if family.kind == "histogram":
            cumulative, buckets = 0, []
            for bound, count in zip(series.bounds, series.counts, strict=False):
                cumulative += count
                buckets.append((bound, cumulative))
            samples.append(
                MetricSample(labels, buckets=tuple(buckets), sum=series.sum, count=series.count)
            )
        else:
            samples.append(MetricSample(labels, value=series.value))
    return CustomMetricFamily(family.name, family.description, family.kind, tuple(samples))


def answer(store: MetricStore, held: dict[str, int], operation: str, arguments: Any) -> Any:
    """Serve one metric call of an instance's model; `held` counts the families it holds."""
    if operation == "metric_family":
        name, description, kind = arguments
        store.hold_family(name, description, int(kind))
        held[name] = held.get(name, 0) + 1
        return None
    if operation == "metric_new":
        name, labels, buckets = arguments
        if not isinstance(labels, dict):
            raise MetricError("Failed to create metric. Labels must be a dictionary.")
        return store.series(name, labels, buckets)
    name, key, op, value = arguments
    if not math.isfinite(value) and op != "set":
        raise MetricError(f"metric value must be a finite number, got {value}")
    return store.operate(name, key, op, value)
