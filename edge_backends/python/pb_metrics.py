"""`pb_utils.MetricFamily` and `pb_utils.Metric`: a model's own Prometheus metrics.

Every call goes to the server and waits for it, as in Triton: the server holds the values
(edge_backends/python/custom_metrics.py), so instances that create the same family and labels
share one metric, misuse raises TritonModelException at the call, and a scrape right after a
response sees every update the model made before it. Example::

    family = pb_utils.MetricFamily(
        name="preprocess_latency_ns",
        description="Cumulative time spent pre-processing requests",
        kind=pb_utils.MetricFamily.COUNTER,
    )
    latency = family.Metric(labels={"model": "m", "version": "1"})
    latency.increment(1200)
"""

from __future__ import annotations

import enum
from typing import Any

from edge_backends.python.pb_errors import TritonModelException, call


class MetricKind(enum.IntEnum):
    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


class Metric:
    """One labelled series of a MetricFamily; made by `MetricFamily.Metric(labels=...)`."""

    def __init__(self, family: str, key: Any) -> None:
        self._family = family
        self._key = key

    def increment(self, value: float) -> None:
        """Counter (value >= 0) or gauge: add `value`."""
        call("metric_op", self._family, self._key, "increment", float(value))

    def set(self, value: float) -> None:
        """Gauge: set to `value`."""
        call("metric_op", self._family, self._key, "set", float(value))

    def observe(self, value: float) -> None:
        """Histogram: record one observation."""
        call("metric_op", self._family, self._key, "observe", float(value))

    def value(self) -> float:
        """Counter or gauge: the current value (shared by every instance that made it)."""
        return float(call("metric_op", self._family, self._key, "value", 0.0))


class MetricFamily:
    """A named metric of one kind (COUNTER, GAUGE or HISTOGRAM) with a description; creating
    one that exists (same name, kind and description) gives the same family."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if name is None or description is None or kind is None:
            raise TypeError("MetricFamily(name, description, kind): none may be None")
        try:
            kind = MetricKind(kind)
        except ValueError:
            raise TritonModelException(f"Unknown metric kind {kind!r}") from None
        call("metric_family", str(name), str(description), int(kind))
        self._name = str(name)
        self._kind = kind

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: list[float] | None = None
    ) -> Metric:
        """The family's series for these labels (made on first use); a histogram needs its
        bucket upper bounds, ascending."""
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None:
            if not isinstance(buckets, list):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            buckets = [float(b) for b in buckets]
        text_labels = {str(k): str(v) for k, v in labels.items()}
        key = call("metric_new", self._name, text_labels, buckets)
        return Metric(self._name, key)
