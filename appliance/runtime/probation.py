"""Automatic rollback: a newly switched-in version on probation over its first requests.

With --model-rollback-error-rate on, the version that takes the traffic after a load is
watched; the versions it replaced stay loaded (not drained) so that a rollback is instant. When
its model errors exceed the rate over the first `window` requests, the held versions serve
again and the bad one is retired. A fleet rollout's document may set the thresholds for its
target (`rule`; on even when the flag is off). The runtime records the verdict in the ledger
(repository/ledger.py): a rolled-back version is not loaded again until its content changes,
after a restart too, and one that passes becomes the model's last good version.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

from appliance.runtime.registry import ModelRegistry, ServedVersion

log = logging.getLogger(__name__)


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
        rule: Callable[[str, int], tuple[float, int] | None] = lambda name, version: None,
    ) -> None:
        self._registry = registry
        self._error_rate = error_rate  # 0: off
        self._window = window
        self._retire = retire  # drains and unloads versions in the background
        self._count = count  # (model, "rollback") -> the load-result counter
        # (model, version, why): why is '' for a version that passed, else why it was rolled
        # back (the runtime records it durably).
        self._verdict = verdict
        # (model, version) -> (error rate, window) for that version instead of the flags'.
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
        rate, window = rule if rule is not None else (self._error_rate, self._window)
        if rule is None and rate <= 0:
            return replaced  # rollback is off
        # Only what the new version directly replaced is held; older holds retire now.
        held = displaced
        probe = Probation(now[max(now)], held, error_rate=rate, window=window)
        if rule is not None:
            probe.source = "the rollout's probation.max_error_rate"
        probe.served.stats.watcher = functools.partial(self._observe, name, probe)
        self._probation[name] = probe
        return [s for s in replaced if s not in held]

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
            self._roll_back(name, probe)
        elif probe.requests >= probe.window:
            self._end(name, probe)
            log.info(
                "model '%s' version %d passed its first %d requests (%d failed); unloading "
                "the version it replaced",
                name,
                probe.served.version,
                probe.requests,
                probe.failures,
            )
            self._verdict(name, probe.served.version, "")
            self._retire(probe.held)

    def _end(self, name: str, probe: Probation) -> None:
        probe.served.stats.watcher = None
        if self._probation.get(name) is probe:
            del self._probation[name]

    def _roll_back(self, name: str, probe: Probation) -> None:
        """Put the held versions back in place of the failing one, at once."""
        record = self._registry.record(name)
        bad = probe.served
        why = (
            f"rolled back: {probe.failures} of its first {probe.requests} requests failed "
            f"({probe.source} {probe.error_rate:g})"
        )
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
