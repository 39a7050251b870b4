"""Automatic rollback: a newly switched-in version on probation over its first requests.

With --model-rollback-error-rate or --model-rollback-latency-ratio on, the version that takes
the traffic after a load is watched; the versions it replaced stay loaded (not drained) so that
a rollback is instant. When its model errors exceed the rate over the first `window` requests,
or at the end of the window its median latency exceeds the ratio times the median of the
versions that served before the switch (read then, off their rings of recent latencies), the
held versions serve again and the bad one is retired. A fleet rollout's document may set the
thresholds for its target (`rule`; on even when the flags are off). The runtime records the
verdict in the ledger (repository/ledger.py): a rolled-back version is not loaded again until
its content changes, after a restart too, and one that passes becomes the model's last good
version.

Latency costs nothing per request: every version already keeps the latencies of its last 512
successes for the status page (scheduling/stats.py); probation reads that ring twice, at the
switch and at the end of the window.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from appliance.repository.rollout import ProbationRule
from appliance.runtime.registry import ModelRegistry, ServedVersion

log = logging.getLogger(__name__)

# The median of fewer latencies than this from the versions served before a switch is no
# baseline: latency is then not judged (logged).
MIN_BASELINE_LATENCIES = 5
# Latencies below this count as this in the comparison: a sub-millisecond model's jitter (a
# thread hand-off, a busy loop, a collection) can double its median with nothing wrong.
LATENCY_FLOOR_MS = 1.0


def median_ms(latencies_ns: Iterable[int]) -> float | None:
    """The median of latencies given in ns, in ms; None for none."""
    ordered = sorted(latencies_ns)
    if not ordered:
        return None
    middle = len(ordered) // 2
    ns = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return float(ns) / 1e6


def too_slow(median: float, baseline: float, ratio: float) -> bool:
    """Whether a median latency (ms) fails probation against the baseline median (ms)."""
    return max(median, LATENCY_FLOOR_MS) > ratio * max(baseline, LATENCY_FLOOR_MS)


@dataclass
class Probation:
    """A version watched over its first requests, and the versions it replaced, held."""

    served: ServedVersion
    held: list[ServedVersion]
    requests: int = 0
    failures: int = 0
    error_rate: float = 0.0
    window: int = 0
    source: str = "--model-rollback-error-rate"  # where the thresholds come from
    latency_ratio: float = 0.0  # 0: latency is not judged
    latency_source: str = "--model-rollback-latency-ratio"
    # The median latency (ms) of the versions served before the switch; None: too few.
    baseline_ms: float | None = None
    baseline_versions: tuple[int, ...] = ()
    successes_before: int = 0  # the version's successes when its probation began


class RollbackGuard:
    """The probation and rollback state machine for every model (on the event loop)."""

    def __init__(
        self,
        registry: ModelRegistry,
        error_rate: float,
        window: int,
        retire: Callable[[list[ServedVersion]], None],
        count: Callable[[str, str], None],
        verdict: Callable[[str, int, str], None] = lambda name, version, why: None,
        rule: Callable[[str, int], ProbationRule | None] = lambda name, version: None,
        latency_ratio: float = 0.0,
    ) -> None:
        self._registry = registry
        self._error_rate = error_rate  # 0: off
        self._window = window
        self._latency_ratio = latency_ratio  # 0: off
        self._retire = retire  # drains and unloads versions in the background
        self._count = count  # (model, "rollback") -> the load-result counter
        # (model, version, why): why is '' for a version that passed, else why it was rolled
        # back (the runtime records it durably).
        self._verdict = verdict
        # (model, version) -> the thresholds for that version instead of the flags' (all of
        # them: a rule without a latency ratio does not judge latency).
        self._rule = rule
        self._probation: dict[str, Probation] = {}

    def on_probation(self, name: str) -> int | None:
        """The version of a model now on probation, if any."""
        probe = self._probation.get(name)
        return probe.served.version if probe is not None else None

    def watch(
        self,
        name: str,
        old: dict[int, ServedVersion],
        new: dict[int, ServedVersion],
        now: dict[int, ServedVersion],
    ) -> list[ServedVersion]:
        """The replaced versions to retire now. With rollback on, the version now taking the
        traffic goes on probation, and the ones it replaced stay loaded until it passes."""
        displaced = [s for v, s in old.items() if now.get(v) is not s]
        replaced = displaced + [s for s in self.drop(name) if now.get(s.version) is not s]
        if not (old and now and max(now) in new and max(now) >= max(old)):
            return replaced  # nothing replaced, or an older version came back
        rule = self._rule(name, max(now))
        if rule is not None:
            rate, window = rule.max_error_rate, rule.window_requests
            ratio = rule.max_latency_ratio or 0.0
        else:
            rate, window, ratio = self._error_rate, self._window, self._latency_ratio
            if rate <= 0 and ratio <= 0:
                return replaced  # rollback is off
            if rate <= 0:
                rate = 1.0  # latency alone: errors are not judged
        # Only what the new version directly replaced is held; older holds retire now.
        held = displaced
        served = now[max(now)]
        probe = Probation(
            served,
            held,
            error_rate=rate,
            window=window,
            latency_ratio=ratio,
            successes_before=served.stats.success.count,
        )
        if rule is not None:
            probe.source = "the rollout's probation.max_error_rate"
            probe.latency_source = "the rollout's probation.max_latency_ratio"
        if ratio > 0:
            self._baseline(probe, list(old.values()))
        probe.served.stats.watcher = functools.partial(self._observe, name, probe)
        self._probation[name] = probe
        return [s for s in replaced if s not in held]

    @staticmethod
    def _baseline(probe: Probation, before: list[ServedVersion]) -> None:
        """The latency the new version is held to: the median of the recent latencies of the
        versions served before the switch, read now (the replaced ones get no traffic while
        it serves, so their rings keep the numbers from before)."""
        latencies = [ns for s in before for ns in s.stats.recent_latencies_ns()]
        probe.baseline_versions = tuple(sorted(s.version for s in before))
        if len(latencies) >= MIN_BASELINE_LATENCIES:
            probe.baseline_ms = median_ms(latencies)
            return
        log.info(
            "%s: latency not judged on probation: the version(s) it replaced (%s) have %d "
            "recent successful requests, %d needed",
            probe.served.label,
            ", ".join(map(str, probe.baseline_versions)),
            len(latencies),
            MIN_BASELINE_LATENCIES,
        )

    def drop(self, name: str) -> list[ServedVersion]:
        """End a model's probation; the versions it held loaded, to retire."""
        probe = self._probation.pop(name, None)
        if probe is None:
            return []
        probe.served.stats.watcher = None
        return probe.held

    def _observe(self, name: str, probe: Probation, failed: bool) -> None:
        """One request's outcome on a version on probation."""
        probe.requests += 1
        probe.failures += failed
        if probe.failures > probe.error_rate * probe.window:
            self._end(name, probe)
            self._roll_back(
                name,
                probe,
                f"rolled back: {probe.failures} of its first {probe.requests} requests failed "
                f"({probe.source} {probe.error_rate:g})",
            )
        elif probe.requests >= probe.window:
            self._end(name, probe)
            slow = self._latency_failure(probe)
            if slow:
                self._roll_back(name, probe, slow)
                return
            log.info(
                "model '%s' version %d passed its first %d requests (%d failed%s); unloading "
                "the version it replaced",
                name,
                probe.served.version,
                probe.requests,
                probe.failures,
                self._latency_note(probe),
            )
            self._verdict(name, probe.served.version, "")
            self._retire(probe.held)

    @staticmethod
    def _window_ms(probe: Probation) -> float | None:
        """The median latency of the version's successes since its probation began."""
        stats = probe.served.stats
        return median_ms(stats.recent_latencies_ns(stats.success.count - probe.successes_before))

    def _latency_failure(self, probe: Probation) -> str:
        """Why the version fails on latency at the end of its window ('' : it does not)."""
        if probe.latency_ratio <= 0 or probe.baseline_ms is None:
            return ""
        median = self._window_ms(probe)
        if median is None or not too_slow(median, probe.baseline_ms, probe.latency_ratio):
            return ""
        return (
            f"rolled back: its median latency over its first {probe.requests} requests was "
            f"{median:.3g} ms, {median / max(probe.baseline_ms, 1e-9):.3g} times the "
            f"{probe.baseline_ms:.3g} ms of version "
            f"{', '.join(map(str, probe.baseline_versions))} before the switch "
            f"({probe.latency_source} {probe.latency_ratio:g})"
        )

    def _latency_note(self, probe: Probation) -> str:
        if probe.latency_ratio <= 0 or probe.baseline_ms is None:
            return ""
        median = self._window_ms(probe)
        if median is None:
            return ""
        return f"; median latency {median:.3g} ms against {probe.baseline_ms:.3g} ms before"

    def _end(self, name: str, probe: Probation) -> None:
        probe.served.stats.watcher = None
        if self._probation.get(name) is probe:
            del self._probation[name]

    def _roll_back(self, name: str, probe: Probation, why: str) -> None:
        """Put the held versions back in place of the failing one, at once."""
        record = self._registry.record(name)
        bad = probe.served
        record.versions = {
            **{v: s for v, s in record.versions.items() if s is not bad},
            **{s.version: s for s in probe.held},
        }
        record.failed[bad.version] = why
        self._verdict(name, bad.version, why)  # skipped by loads until its content changes
        self._count(name, "rollback")
        log.error(
            "model '%s' version %d %s; version %s serves again",
            name,
            bad.version,
            why,
            ", ".join(str(s.version) for s in probe.held) or "(none)",
        )
        self._retire([bad])
