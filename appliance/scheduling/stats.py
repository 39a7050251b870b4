"""Per model-version statistics, shaped as Triton's statistics extension reports them."""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from appliance.common.settings import SUMMARY_QUANTILES


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchSizeStats:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


# Upper bounds (ms) of the request latency histogram (--metrics-config histogram_latencies=true).
LATENCY_BUCKETS_MS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000)


@dataclass(slots=True)
class LatencyHistogram:
    """Cumulative-ready bucket counts; observing is a bisect and an increment."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_MS) + 1))
    sum_ms: float = 0.0

    def observe(self, ns: int) -> None:
        ms = ns / 1e6
        self.counts[bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
        self.sum_ms += ms


# --metrics-config summary_latencies=true: the summaries' sliding window (prometheus-cpp's
# Summary, which Triton uses, keeps 60 s) and the observations kept at most per summary within
# it (the newest), so a busy model's summary costs a fixed amount of memory. Quantiles are
# exact over what is kept (Triton's are within each quantile's allowed error).
SUMMARY_WINDOW_NS = 60 * 10**9
SUMMARY_SAMPLES = 4096
# Triton's summaries, by the ModelStats duration each observes per request.
SUMMARY_NAMES = ("request", "queue", "compute_input", "compute_infer", "compute_output")


class LatencySummary:
    """One summary: count and sum (us) since start, and the quantiles of the observations
    of the last SUMMARY_WINDOW_NS (at most SUMMARY_SAMPLES of them), computed when read."""

    __slots__ = ("count", "samples", "sum_us")

    def __init__(self) -> None:
        self.count = 0
        self.sum_us = 0.0
        self.samples: deque[tuple[int, float, int]] = deque(maxlen=SUMMARY_SAMPLES)

    def observe(self, ns: int, weight: int, now_ns: int) -> None:
        """`weight` requests of `ns` each (the requests of one execution)."""
        us = ns / 1000
        self.count += weight
        self.sum_us += us * weight
        self.samples.append((now_ns, us, weight))

    def quantiles(self, wanted: Sequence[float], now_ns: int) -> list[float]:
        """Each wanted quantile of the window's observations (NaN when it has none)."""
        cutoff = now_ns - SUMMARY_WINDOW_NS
        while self.samples and self.samples[0][0] < cutoff:
            self.samples.popleft()
        ordered = sorted((us, weight) for _, us, weight in self.samples)
        total = sum(weight for _, weight in ordered)
        answers = []
        for q in wanted:
            if not total:
                answers.append(float("nan"))
                continue
            rank, seen, value = q * total, 0, ordered[-1][0]
            for us, weight in ordered:
                seen += weight
                if seen >= rank:
                    value = us
                    break
            answers.append(value)
        return answers


@dataclass(slots=True)
class LatencySummaries:
    """Triton's latency summaries of one model version (see SUMMARY_NAMES)."""

    quantiles: tuple[tuple[float, float], ...] = SUMMARY_QUANTILES
    by_name: dict[str, LatencySummary] = field(
        default_factory=lambda: {name: LatencySummary() for name in SUMMARY_NAMES}
    )

    def observe(self, name: str, ns: int, weight: int = 1) -> None:
        self.by_name[name].observe(ns, weight, time.monotonic_ns())


# The latencies of the last RECENT_LATENCIES successful requests, kept for the status page's
# percentiles (services/status_samples.py reads them every 2 s): one list store per request.
RECENT_LATENCIES = 512  # a power of two
_RECENT_MASK = RECENT_LATENCIES - 1


# The Durations the nv_* counters read, by ModelStats attribute (services/metrics.py).
METRIC_DURATIONS = ("success", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(slots=True)
class MetricTotals:
    """What the nv_* counters read of a version's statistics. A reload carries them on
    (`ModelStats.carry`): tritonserver's metric reporter of a model version is shared by the
    version that replaces it (metric_model_reporter.cc reuses a live reporter of the same
    labels), so its counters go on across a reload while the statistics extension's counts
    start again. After an unload a later load starts from 0, as there."""

    success: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    inference_count: int = 0
    execution_count: int = 0
    ns: dict[str, int] = field(default_factory=dict)  # by METRIC_DURATIONS name
    cache_hits: int = 0
    cache_misses: int = 0
    latency_counts: list[int] = field(default_factory=list)  # the histogram's, if kept
    latency_sum_ms: float = 0.0

    def add(self, other: MetricTotals) -> None:
        self.success += other.success
        for reason, count in other.failures.items():
            self.failures[reason] = self.failures.get(reason, 0) + count
        self.inference_count += other.inference_count
        self.execution_count += other.execution_count
        for name, ns in other.ns.items():
            self.ns[name] = self.ns.get(name, 0) + ns
        self.cache_hits += other.cache_hits
        self.cache_misses += other.cache_misses
        if other.latency_counts:
            if not self.latency_counts:
                self.latency_counts = [0] * len(other.latency_counts)
            for i, count in enumerate(other.latency_counts):
                self.latency_counts[i] += count
        self.latency_sum_ms += other.latency_sum_ms


@dataclass(slots=True)
class ModelStats:
    """Counters updated on the event loop, and by the dynamic scheduler's thread lane
    (scheduling/batcher.py, `DynamicScheduler.run_here`) on a front end's thread: the counters both
    write (successes, failures, executions, queue time) are written under `lock`, so they stay
    exact. Fields only the loop writes (cancelled, cache hits) are written without it.
    """

    success: Duration = field(default_factory=Duration)
    latency: LatencyHistogram | None = None  # only with histogram_latencies=true
    summaries: LatencySummaries | None = None  # only with summary_latencies=true
    fail: Duration = field(default_factory=Duration)
    queue: Duration = field(default_factory=Duration)
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # Failed requests by Triton's metric reasons: REJECTED, CANCELED, BACKEND, OTHER.
    failures: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0  # requests dropped from the queue because their caller went away
    inference_count: int = 0
    execution_count: int = 0
    last_inference_ms: int = 0
    by_batch_size: dict[int, BatchSizeStats] = field(default_factory=dict)
    # success.count & _RECENT_MASK -> that success's latency (ns): a ring.
    recent_ns: list[int] = field(default_factory=lambda: [0] * RECENT_LATENCIES)
    # Told of each request's outcome (True: failed in the model) while a new version is on
    # probation for automatic rollback; None otherwise.
    watcher: Callable[[bool], None] | None = None
    ensemble: bool = False  # an ensemble's: failures are counted as tritonserver counts them
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    # The metric counters of the version a reload replaced (`carry`): while it drains, its
    # statistics themselves; once it is gone, their totals (`fold`).
    previous: ModelStats | None = field(default=None, repr=False, compare=False)
    carried: MetricTotals | None = field(default=None, repr=False, compare=False)

    def carry(self, previous: ModelStats) -> None:
        """This version replaces one of the same number (a reload): the nv_* counters go on
        from its, as tritonserver's do (see MetricTotals)."""
        self.previous = previous

    def fold(self) -> None:
        """The replaced version is gone: keep its totals, not its statistics."""
        previous, self.previous = self.previous, None
        if previous is not None:
            self.carried = previous.metric_totals()

    def metric_totals(self) -> MetricTotals:
        """What the nv_* counters show: this version's counts and those carried to it."""
        with self.lock:
            totals = MetricTotals(
                success=self.success.count,
                failures=dict(self.failures),
                inference_count=self.inference_count,
                execution_count=self.execution_count,
                ns={name: getattr(self, name).ns for name in METRIC_DURATIONS},
                cache_hits=self.cache_hit.count,
                cache_misses=self.cache_miss.count,
                latency_counts=list(self.latency.counts) if self.latency is not None else [],
                latency_sum_ms=self.latency.sum_ms if self.latency is not None else 0.0,
            )
        if self.carried is not None:
            totals.add(self.carried)
        if self.previous is not None:
            totals.add(self.previous.metric_totals())
        return totals

    def record_success(self, ns: int, model_failed: bool = False) -> None:
        """A request's success; `model_failed`: the model's own error response (a success
        in tritonserver's statistics), which the rollback watcher still hears as a failure."""
        with self.lock:
            self.success.add(ns)
            self.recent_ns[self.success.count & _RECENT_MASK] = ns
            if self.latency is not None:
                self.latency.observe(ns)
            if self.summaries is not None:
                self.summaries.observe("request", ns)
        if self.watcher is not None:
            self.watcher(model_failed)

    def recent_latencies_ns(self, last: int = RECENT_LATENCIES) -> list[int]:
        """The latencies (ns) of the last `last` successful requests, newest first: as many
        as succeeded, at most RECENT_LATENCIES (read off the ring; nothing else is kept)."""
        count, ring = self.success.count, self.recent_ns
        taken = max(0, min(last, count, RECENT_LATENCIES))
        return [ring[(count - back) & _RECENT_MASK] for back in range(taken)]

    def record_failure(self, reason: str, ns: int) -> None:
        # As tritonserver: an ensemble's failed request is OTHER whatever failed its step (the
        # step's model counts its own reason); a cancelled one stays CANCELED.
        counted = "OTHER" if self.ensemble and reason != "CANCELED" else reason
        with self.lock:
            self.fail.add(ns)
            self.failures[counted] = self.failures.get(counted, 0) + 1
        if self.watcher is not None and reason in ("BACKEND", "OTHER"):
            self.watcher(reason == "BACKEND")

    def record_ensemble_run_failure(self, ns: int) -> None:
        """An ensemble's run that failed, counted OTHER beside the request's own failure
        (`record_failure`): tritonserver counts a failed ensemble request twice, the end of
        its run (ensemble_scheduler.cc DecrementCounter) and its error response
        (RespondIfError), and Triton's L0_model_queue expects both. The rollback watcher
        hears of the request once, from `record_failure`."""
        with self.lock:
            self.fail.add(ns)
            self.failures["OTHER"] = self.failures.get("OTHER", 0) + 1

    def record_one(
        self,
        batch_size: int,
        inferences: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        queue_ns: int,
    ) -> None:
        """`record_execution` of an execution of one request that succeeded (`inferences`:
        its batch size; `queue_ns`: its time in the queue), without a list: the thread
        lane's hot path."""
        with self.lock:
            self._executed(batch_size, inferences, 1, queue_ns, input_ns, infer_ns, output_ns)
            summaries = self.summaries
            if summaries is not None:
                summaries.observe("queue", queue_ns)
                summaries.observe("compute_input", input_ns)
                summaries.observe("compute_infer", infer_ns)
                summaries.observe("compute_output", output_ns)

    def record_execution(
        self,
        batch_size: int,
        inferences: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        queues_ns: Sequence[int] = (),
    ) -> None:
        """One backend execution totalling `batch_size` items, counted as tritonserver counts
        it: the execution and its batch_stats whatever its requests' outcomes, and per request
        that succeeded (one time in the queue each in `queues_ns`) its queue time and compute
        durations; `inferences`: those requests' batch sizes, summed (inference_count). A
        failed request counts only its failure (`record_failure`): no queue, no compute."""
        requests = len(queues_ns)
        with self.lock:
            self._executed(
                batch_size, inferences, requests, sum(queues_ns), input_ns, infer_ns, output_ns
            )
            summaries = self.summaries
            if summaries is not None:
                for queue_ns in queues_ns:
                    summaries.observe("queue", queue_ns)
                summaries.observe("compute_input", input_ns, requests)
                summaries.observe("compute_infer", infer_ns, requests)
                summaries.observe("compute_output", output_ns, requests)

    def _executed(
        self,
        batch_size: int,
        inferences: int,
        requests: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """Under `lock`: an execution of `requests` requests that succeeded (their queue
        times summed in `queue_ns`). Every execution passes here: the Durations are updated
        in place, not through `add`."""
        if requests:
            d = self.queue
            d.count += requests
            d.ns += queue_ns
        self.execution_count += 1
        self.inference_count += inferences
        # Triton counts compute durations once per request in the model totals ...
        d = self.compute_input
        d.count += requests
        d.ns += input_ns * requests
        d = self.compute_infer
        d.count += requests
        d.ns += infer_ns * requests
        d = self.compute_output
        d.count += requests
        d.ns += output_ns * requests
        # ... and once per execution in batch_stats.
        per_size = self.by_batch_size.get(batch_size)
        if per_size is None:
            per_size = self.by_batch_size[batch_size] = BatchSizeStats()
        d = per_size.compute_input
        d.count += 1
        d.ns += input_ns
        d = per_size.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = per_size.compute_output
        d.count += 1
        d.ns += output_ns
