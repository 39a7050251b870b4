"""Prometheus metrics with Triton's names, read from the model statistics at scrape time: the
collectors (as Triton's core collects; the front end's frontends/metrics.py serves /metrics).

Nothing is counted twice: the collector turns the same per-version counters that the
statistics API reports into Triton's metric families when /metrics is scraped, so the request
path pays nothing for metrics. Each Appliance has its own registry (no global state).

Models' own metric families (Triton's custom metrics, `pb_utils.MetricFamily`) are read from
the served versions' instances (`ModelInstance.custom_metrics`) at scrape time and exposed
next to the server's, named exactly as the model named them: a custom counter has no `_total`
suffix, as in Triton, so `exposition` writes those lines itself; so are Triton's own `nv_*`
counters (`nv_inference_request_success{model="m",version="1"} 3`, as tritonserver).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from appliance.common.protocol import model_config_pb2 as mc
from appliance.ops.gpu import GpuCollector, GpuSource
from appliance.repository.poller import RepositoryPoller
from appliance.repository.sources import RemoteSources
from appliance.runtime.models import ModelRuntime
from appliance.runtime.registry import ServedVersion
from appliance.scheduling.stats import LATENCY_BUCKETS_MS, SUMMARY_NAMES
from appliance.services.cache import ResponseCache
from edge_backends.api import CustomMetricFamily

_LABELS = ["model", "version"]
_FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")

# (metric name, help, attribute of ModelStats holding a Duration) for Triton's µs counters.
_DURATIONS = (
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        "success",
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds",
        "queue",
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds",
        "compute_input",
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds",
        "compute_infer",
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds",
        "compute_output",
    ),
)


# --metrics-config summary_latencies=true: Triton's summary families, by SUMMARY_NAMES.
_SUMMARIES = {
    "request": (
        "nv_inference_request_summary_us",
        "request durations (us): quantiles of the last 60 s",
    ),
    "queue": ("nv_inference_queue_summary_us", "queue waits (us): quantiles of the last 60 s"),
    "compute_input": (
        "nv_inference_compute_input_summary_us",
        "input preparation durations (us): quantiles of the last 60 s",
    ),
    "compute_infer": (
        "nv_inference_compute_infer_summary_us",
        "model execution durations (us): quantiles of the last 60 s",
    ),
    "compute_output": (
        "nv_inference_compute_output_summary_us",
        "output extraction durations (us): quantiles of the last 60 s",
    ),
}
assert tuple(_SUMMARIES) == SUMMARY_NAMES


def _summaries(versions: Iterable[ServedVersion]) -> Iterator[Metric]:
    """Each summary family, one quantile sample per configured quantile, _count and _sum."""
    families = {name: Metric(*_SUMMARIES[name], "summary") for name in SUMMARY_NAMES}
    now = time.monotonic_ns()
    for served in versions:
        summaries = served.stats.summaries
        if summaries is None:
            continue
        labels = {"model": served.metric_name, "version": str(served.version)}
        wanted = [q for q, _ in summaries.quantiles]
        with served.stats.lock:
            for name in SUMMARY_NAMES:
                summary, family = summaries.by_name[name], families[name]
                for q, value in zip(wanted, summary.quantiles(wanted, now), strict=True):
                    family.add_sample(family.name, {**labels, "quantile": f"{q:g}"}, value)
                family.add_sample(f"{family.name}_count", labels, summary.count)
                family.add_sample(f"{family.name}_sum", labels, summary.sum_us)
    yield from (family for family in families.values() if family.samples)


class InferenceCollector(Collector):
    """Per model version counters, as Triton names them."""

    def __init__(self, versions: Callable[[], Iterable[ServedVersion]]) -> None:
        self._versions = versions

    def collect(self) -> Iterator[Metric]:
        success = CounterMetricFamily(
            "nv_inference_request_success",
            "Number of successful inference requests, all batch sizes",
            labels=_LABELS,
        )
        failure = CounterMetricFamily(
            "nv_inference_request_failure",
            "Number of failed inference requests, all batch sizes",
            labels=[*_LABELS, "reason"],
        )
        count = CounterMetricFamily(
            "nv_inference_count",
            "Number of inferences performed (does not include cached requests)",
            labels=_LABELS,
        )
        executions = CounterMetricFamily(
            "nv_inference_exec_count",
            "Number of model executions performed (does not include cached requests)",
            labels=_LABELS,
        )
        pending = GaugeMetricFamily(
            "nv_inference_pending_request_count",
            "Instantaneous number of pending requests awaiting execution per-model.",
            labels=_LABELS,
        )
        durations = [
            (CounterMetricFamily(name, text, labels=_LABELS), attribute)
            for name, text, attribute in _DURATIONS
        ]
        histogram = HistogramMetricFamily(
            "nv_inference_first_response_histogram_ms",
            "Duration from request to first response in milliseconds",
            labels=_LABELS,
        )
        for served in self._versions():
            labels = [served.metric_name, str(served.version)]
            totals = served.stats.metric_totals()  # carried across a reload, as Triton's
            success.add_metric(labels, totals.success)
            for reason in _FAILURE_REASONS:
                failure.add_metric([*labels, reason], totals.failures.get(reason, 0))
            count.add_metric(labels, totals.inference_count)
            executions.add_metric(labels, totals.execution_count)
            pending.add_metric(labels, served.scheduler.pending)
            for family, attribute in durations:
                family.add_metric(labels, totals.ns[attribute] // 1000)
            if served.stats.latency is not None:
                cumulative, buckets = 0, []
                for bound, in_bucket in zip(
                    (*LATENCY_BUCKETS_MS, float("inf")), totals.latency_counts, strict=True
                ):
                    cumulative += in_bucket
                    buckets.append((str(bound) if bound != float("inf") else "+Inf", cumulative))
                histogram.add_metric(labels, buckets, totals.latency_sum_ms)
        if histogram.samples:
            yield histogram
        yield from _summaries(self._versions())
        yield from (success, failure, count, executions, pending)
        yield from (family for family, _ in durations)
        yield self._placement()

    def _placement(self) -> Metric:
        """Where each version's instances run: the server's GPU / CPU decision, per model."""
        placed = GaugeMetricFamily(
            "edge_model_instances",
            "Model instances by where they run (KIND_GPU or KIND_CPU) and backend",
            labels=[*_LABELS, "kind", "backend"],
        )
        for served in self._versions():
            counts: dict[str, int] = {}
            for group in served.config.instance_group:
                kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
                counts[kind] = counts.get(kind, 0) + group.count
            for kind, total in sorted(counts.items()):
                placed.add_metric(
                    [served.metric_name, str(served.version), kind, served.config.backend], total
                )
        return placed


class CpuCollector(Collector):
    """Triton's CPU metrics from /proc (Linux): utilisation since the last scrape, memory."""

    def __init__(self) -> None:
        self._last = _cpu_times()

    def collect(self) -> Iterator[Metric]:
        now = _cpu_times()
        if now is not None and self._last is not None:
            busy = (now[0] - self._last[0]) / max(1, now[1] - self._last[1])
            self._last = now
            yield GaugeMetricFamily(
                "nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", value=busy
            )
        memory = _memory()
        if memory is not None:
            total, used = memory
            yield GaugeMetricFamily(
                "nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", value=total
            )
            yield GaugeMetricFamily(
                "nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", value=used
            )


class PinnedMemoryCollector(Collector):
    """Triton's pinned memory pool gauges, which it exposes whenever metrics are on. This
    server keeps no pool of pinned (page-locked, CUDA host) memory: both are 0, as a CPU-only
    tritonserver reports them."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "nv_pinned_memory_pool_total_bytes",
            "Pinned memory pool total memory size, in bytes",
            value=0,
        )
        yield GaugeMetricFamily(
            "nv_pinned_memory_pool_used_bytes",
            "Pinned memory pool used memory size, in bytes",
            value=0,
        )


def _cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies from /proc/stat."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def _memory() -> tuple[int, int] | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            values = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo}
    except (OSError, ValueError, IndexError):
        return None
    total = values.get("MemTotal", 0)
    return total, total - values.get("MemAvailable", values.get("MemFree", 0))


class CacheCollector(Collector):
    """Triton's response cache metrics, server-wide and per model."""

    def __init__(self, cache: ResponseCache, versions: Callable[[], Iterable[ServedVersion]]):
        self._cache = cache
        self._versions = versions

    def collect(self) -> Iterator[Metric]:
        cache = self._cache
        yield GaugeMetricFamily(
            "nv_cache_num_entries", "Number of responses stored in response cache", value=len(cache)
        )
        yield GaugeMetricFamily(
            "nv_cache_num_lookups",
            "Number of cache lookups in response cache",
            value=cache.hits + cache.misses,
        )
        yield GaugeMetricFamily(
            "nv_cache_num_hits", "Number of cache hits in response cache", value=cache.hits
        )
        yield GaugeMetricFamily(
            "nv_cache_num_misses", "Number of cache misses in response cache", value=cache.misses
        )
        yield GaugeMetricFamily(
            "nv_cache_num_evictions",
            "Number of cache evictions in response cache",
            value=cache.evictions,
        )
        yield GaugeMetricFamily(
            "nv_cache_util",
            "Cache utilization [0.0 - 1.0]",
            value=cache.used_bytes / max(1, cache.max_bytes),
        )
        hits = CounterMetricFamily(
            "nv_cache_num_hits_per_model", "Number of cache hits per model", labels=_LABELS
        )
        misses = CounterMetricFamily(
            "nv_cache_num_misses_per_model", "Number of cache misses per model", labels=_LABELS
        )
        for served in self._versions():
            if served.cache_enabled:
                labels = [served.metric_name, str(served.version)]
                totals = served.stats.metric_totals()
                hits.add_metric(labels, totals.cache_hits)
                misses.add_metric(labels, totals.cache_misses)
        yield hits
        yield misses


class LifecycleCollector(Collector):
    """Model loads (success / failure) and, in poll mode, when the repository was last read."""

    def __init__(self, runtime: ModelRuntime, poller: RepositoryPoller | None) -> None:
        self._runtime = runtime
        self._poller = poller

    def collect(self) -> Iterator[Metric]:
        loads = CounterMetricFamily(
            "edge_model_load", "Model loads and reloads by result", labels=["model", "result"]
        )
        for (model, result), count in sorted(self._runtime.load_results.items()):
            loads.add_metric([model, result], count)
        yield loads
        if self._poller is not None:
            yield GaugeMetricFamily(
                "edge_repository_last_poll_timestamp_seconds",
                "Unix time of the last successful repository poll",
                value=self._poller.last_poll_s,
            )


class MemoryCollector(Collector):
    """The memory budget (runtime/on_demand.py): the budget, each loaded version's measured
    cost, loads on demand, unloads (idle or to make room) and refused loads."""

    def __init__(self, runtime: ModelRuntime) -> None:
        self._residency = runtime.residency
        self._runtime = runtime

    def collect(self) -> Iterator[Metric]:
        residency = self._residency
        if residency.budget:
            yield GaugeMetricFamily(
                "edge_model_memory_budget_bytes",
                "The memory the loaded models may take together (--model-memory-budget)",
                value=residency.budget,
            )
            cost = GaugeMetricFamily(
                "edge_model_memory_bytes",
                "Memory a loaded model version took, measured at its load",
                labels=_LABELS,
            )
            for served in self._runtime.ready_versions():
                cost.add_metric([served.name, str(served.version)], served.memory_bytes)
            yield cost
        on_demand = CounterMetricFamily(
            "edge_model_load_on_demand", "Loads a request started", labels=["model"]
        )
        for model, count in sorted(residency.loads_on_demand.items()):
            on_demand.add_metric([model], count)
        yield on_demand
        evictions = CounterMetricFamily(
            "edge_model_unload_idle_or_budget",
            "Models unloaded for being idle or to make room under the budget",
            labels=["model", "reason"],
        )
        for (model, reason), count in sorted(residency.evictions.items()):
            evictions.add_metric([model, reason], count)
        yield evictions
        refused = CounterMetricFamily(
            "edge_model_load_refused", "Loads the memory budget had no room for", labels=["model"]
        )
        for model, count in sorted(residency.refusals.items()):
            refused.add_metric([model], count)
        yield refused


class SourceCollector(Collector):
    """Per remote repository: reachable, last good sync, bytes downloaded, API requests."""

    def __init__(self, remote: RemoteSources) -> None:
        self._remote = remote

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "edge_repository_source_up",
            "1 when the last sync of the remote repository succeeded, 0 when it failed",
            labels=["source"],
        )
        synced = GaugeMetricFamily(
            "edge_repository_last_sync_timestamp_seconds",
            "Unix time of the last successful sync of the remote repository",
            labels=["source"],
        )
        downloaded = CounterMetricFamily(
            "edge_repository_download_bytes",
            "Bytes downloaded from the remote repository into the model store",
            labels=["source"],
        )
        requests = CounterMetricFamily(
            "edge_repository_requests",
            "Requests made to the remote repository (listing pages and downloads)",
            labels=["source"],
        )
        pending = GaugeMetricFamily(
            "edge_repository_pending_versions",
            "Versions listed in the remote repository that the store does not hold yet",
            labels=["source"],
        )
        frozen = GaugeMetricFamily(
            "edge_repository_updates_frozen",
            "1 while the remote repository's TUF metadata has expired: the device serves what "
            "it has and takes nothing new (--model-repository-tuf-root)",
            labels=["source"],
        )
        for source in self._remote.sources:
            labels = [source.url]
            frozen.add_metric(labels, 1.0 if source.frozen_since_s else 0.0)
            up.add_metric(labels, 1.0 if source.reachable else 0.0)
            synced.add_metric(labels, source.last_sync_s)
            downloaded.add_metric(labels, source.downloaded_bytes)
            requests.add_metric(labels, source.requests)
            pending.add_metric(labels, len(source.pending))
        yield from (up, synced, downloaded, requests, pending, frozen)


def number_text(value: float) -> str:
    """As Prometheus' text format (and Triton) writes a number: 12, 0.25, +Inf."""
    if isinstance(value, int):  # the server's counters are ints
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


class CustomFamily:
    """Marks a family a model defined, so that the endpoint's `exposition`
    (frontends/metrics.py) can tell it from the server's."""


class CustomCounter(Metric, CustomFamily):
    """A model's counter, exposed as Triton exposes it: `name{labels} value`, no `_total`."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "counter")

    def add_metric(self, labels: dict[str, str], value: float) -> None:
        self.samples.append(Sample(self.name, labels, value))


class CustomGauge(GaugeMetricFamily, CustomFamily):
    """A model's gauge."""


class CustomHistogram(HistogramMetricFamily, CustomFamily):
    """A model's histogram."""


class CustomMetricsCollector(Collector):
    """The metric families the served versions' models defined; a family that several
    instances or models share (one name) is listed once."""

    def __init__(self, versions: Callable[[], Iterable[ServedVersion]]) -> None:
        self._versions = versions

    def families(self) -> list[CustomMetricFamily]:
        found: dict[str, CustomMetricFamily] = {}
        for served in self._versions():
            for instance in served.instances:
                for family in instance.custom_metrics():
                    found.setdefault(family.name, family)
        return list(found.values())

    def collect(self) -> Iterator[Metric]:
        for family in self.families():
            if family.kind == "counter":
                counter = CustomCounter(family.name, family.description)
                for sample in family.samples:
                    counter.add_metric(dict(sample.labels), sample.value)
                yield counter
            elif family.kind == "gauge":
                gauge = CustomGauge(family.name, family.description, labels=[])
                for sample in family.samples:
                    gauge.samples.append(Sample(family.name, dict(sample.labels), sample.value))
                yield gauge
            else:
                histogram = CustomHistogram(family.name, family.description, labels=[])
                for sample in family.samples:
                    labels = dict(sample.labels)
                    for bound, count in (*sample.buckets, (float("inf"), sample.count)):
                        le = number_text(bound)
                        histogram.samples.append(
                            Sample(f"{family.name}_bucket", {**labels, "le": le}, count)
                        )
                    histogram.samples.append(Sample(f"{family.name}_count", labels, sample.count))
                    histogram.samples.append(Sample(f"{family.name}_sum", labels, sample.sum))
                yield histogram


def build_registry(
    versions: Callable[[], Iterable[ServedVersion]],
    cpu_metrics: bool,
    cache: ResponseCache | None = None,
    runtime: ModelRuntime | None = None,
    poller: RepositoryPoller | None = None,
    remote: RemoteSources | None = None,
    gpu: GpuSource | None = None,
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InferenceCollector(versions))
    registry.register(CustomMetricsCollector(versions))
    registry.register(PinnedMemoryCollector())
    if runtime is not None:
        registry.register(LifecycleCollector(runtime, poller))
        if runtime.residency.active:
            registry.register(MemoryCollector(runtime))
    if remote is not None and remote.sources:
        registry.register(SourceCollector(remote))
    if cache is not None:
        registry.register(CacheCollector(cache, versions))
    if cpu_metrics and os.path.exists("/proc/stat"):
        registry.register(CpuCollector())
    if gpu is not None:
        registry.register(GpuCollector(gpu))
    return registry
