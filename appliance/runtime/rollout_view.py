"""What the runtime serves of a model, as a fleet device report tells it (fleet_agent.py)."""

from __future__ import annotations

from appliance.repository.fleet_agent import ServingView
from appliance.runtime.models import ModelRuntime
from appliance.scheduling.stats import LATENCY_BUCKETS_MS


def serving_view(runtime: ModelRuntime, name: str) -> ServingView | None:
    """The versions a model serves, their requests and errors since they loaded, and latency
    percentiles (with --metrics-config histogram_latencies=true); None: not loaded."""
    record = runtime.registry.find(name)
    if record is None or not record.versions:
        return None
    served = list(record.versions.values())
    counts = [0] * (len(LATENCY_BUCKETS_MS) + 1)
    histograms = [s.stats.latency for s in served if s.stats.latency is not None]
    for histogram in histograms:
        counts = [a + b for a, b in zip(counts, histogram.counts, strict=True)]
    return ServingView(
        versions=tuple(sorted(record.versions)),
        requests=sum(s.stats.success.count + s.stats.fail.count for s in served),
        errors=sum(s.stats.fail.count for s in served),
        p50_ms=percentile_ms(counts, 0.5) if histograms else None,
        p99_ms=percentile_ms(counts, 0.99) if histograms else None,
        on_probation=runtime.on_probation(name),
    )


def percentile_ms(counts: list[int], q: float) -> float | None:
    """The q-quantile of a latency histogram's bucket counts, interpolated in its bucket
    (the last, unbounded bucket reads as its lower bound); None without observations."""
    total = sum(counts)
    if not total:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            low = LATENCY_BUCKETS_MS[index - 1] if index else 0.0
            if index >= len(LATENCY_BUCKETS_MS):
                return low
            high = LATENCY_BUCKETS_MS[index]
            return round(low + (high - low) * (rank - seen) / count, 3)
        seen += count
    return float(LATENCY_BUCKETS_MS[-1])
