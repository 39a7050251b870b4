"""What the runtime serves of a model, as a fleet device report tells it (fleet_agent.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from appliance.repository.fleet_agent import ServingView
from appliance.runtime.models import ModelRuntime


def serving_view(runtime: ModelRuntime, name: str) -> ServingView | None:
    """The versions a model serves, their requests and errors since they loaded, and the p50 /
    p99 latency of each served version's last 512 successful requests (the ring the status page
    reads; kept whatever the metrics flags, so reports always carry them); None: not loaded."""
    record = runtime.registry.find(name)
    if record is None or not record.versions:
        return None
    served = list(record.versions.values())
    latencies = sorted(ns for s in served for ns in s.stats.recent_latencies_ns())
    return ServingView(
        versions=tuple(sorted(record.versions)),
        requests=sum(s.stats.success.count + s.stats.fail.count for s in served),
        errors=sum(s.stats.fail.count for s in served),
        p50_ms=percentile_ms(latencies, 0.5),
        p99_ms=percentile_ms(latencies, 0.99),
        on_probation=runtime.on_probation(name),
    )


def percentile_ms(ordered_ns: Sequence[int], q: float) -> float | None:
    """The q-quantile (nearest rank) of sorted latencies in ns, in ms to the microsecond; None
    without any."""
    if not ordered_ns:
        return None
    rank = max(1, math.ceil(q * len(ordered_ns)))
    return round(ordered_ns[rank - 1] / 1e6, 3)
