"""Shadow probation: a rollout's target proven on live requests before a client sees it.

With the rollout's `shadow` rule, a device that switches to the target loads it beside the
version that serves and leaves the clients where they are. The inference service mirrors a
share of the served version's successful requests to it (the clients' answers still come from
the served version) and hands each mirrored outcome here: its error, its latency against the
served version's for the same request, and, with the rule's thresholds, how far its outputs are
from the served version's (max abs difference, top-1 agreement along the last axis). After
`requests` mirrored requests, or as soon as the errors exceed the rule, the trial ends: a pass
switches the clients (today's probation then watches the target as before), a failure retires
the target with its reason and the clients never saw it. A trial not judged within its
`timeout_s` fails (too little traffic to prove it).

Memory: both versions are loaded at once. When the target's files would not fit in the memory
available (MemAvailable, /proc/meminfo), or the rule cannot apply (an ensemble, a sequence or
decoupled model), the device uses today's probation and says so in the log and its report.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from appliance.repository.rollout_policy import ShadowRule
from appliance.runtime.probation import median_ms, too_slow
from appliance.runtime.registry import ServedVersion

log = logging.getLogger(__name__)

PASS, FAIL = "passed", "failed"
# Mirrored requests in flight at once, at most: a share of a busy device's requests must not
# queue up on the target (and its copied inputs in memory); past it, requests are not mirrored.
# Measured (bench/shadow_cost.py, squeezenet at 100%): unbounded, the target's queue refused
# about a third of the mirrored requests as overloaded.
MAX_IN_FLIGHT = 2


@dataclass
class ShadowTrial:
    """One target on shadow probation beside the versions that serve."""

    name: str
    shadow: ServedVersion
    rule: ShadowRule
    serving: list[ServedVersion]
    done: Callable[[ShadowTrial, str], None]  # (trial, '' passed or why it failed)
    started_s: float = field(default_factory=time.time)
    seen: int = 0  # served requests offered for mirroring
    mirrored: int = 0  # mirrored requests judged
    errors: int = 0
    shadow_ns: list[int] = field(default_factory=list)
    served_ns: list[int] = field(default_factory=list)
    max_abs_diff: float = 0.0
    top1_rows: int = 0
    top1_agreed: int = 0
    first_error: str = ""
    verdict: str = ""  # '', PASS or FAIL
    why: str = ""
    ended_s: float | None = None
    in_flight: int = 0
    skipped: int = 0  # requests of the share not mirrored (too many in flight, refused for load)

    def take(self) -> bool:
        """Whether to mirror the next served request: an even `share` of them (no randomness:
        a share of 0.1 mirrors every tenth), never more at once than one window."""
        if self.verdict:
            return False
        before = math.floor(self.seen * self.rule.share)
        self.seen += 1
        if math.floor(self.seen * self.rule.share) == before:
            return False
        if self.in_flight >= MAX_IN_FLIGHT or self.in_flight + self.mirrored >= self.rule.requests:
            self.skipped += 1
            return False
        self.in_flight += 1
        return True

    def skip(self) -> None:
        """A mirrored request refused for load (the target's queue full): not judged."""
        self.in_flight -= 1
        self.skipped += 1

    def observe(
        self,
        served_ns: int,
        served_outputs: dict[str, Any],
        shadow_ns: int,
        shadow_outputs: dict[str, Any] | None,
        error: str = "",
    ) -> None:
        """One mirrored request's outcome (`shadow_outputs` None: it failed with `error`)."""
        self.in_flight -= 1
        if self.verdict:
            return
        self.mirrored += 1
        if shadow_outputs is None:
            self.errors += 1
            self.first_error = self.first_error or error
        else:
            self.shadow_ns.append(shadow_ns)
            self.served_ns.append(served_ns)
            self._compare(served_outputs, shadow_outputs)
        allowed = self.rule.max_error_rate * self.rule.requests
        if self.errors > allowed:
            self._end(
                FAIL,
                f"shadow probation: {self.errors} of {self.mirrored} mirrored requests failed "
                f"(the rollout's shadow.max_error_rate {self.rule.max_error_rate:g}): "
                f"{self.first_error}",
            )
        elif self.mirrored >= self.rule.requests:
            self._end(*self._judge())

    def _compare(self, served: dict[str, Any], shadow: dict[str, Any]) -> None:
        if self.rule.max_abs_diff is None and self.rule.min_top1_agreement is None:
            return
        for name, a in served.items():
            b = shadow.get(name)
            a_arr, b_arr = np.asarray(a), np.asarray(b) if b is not None else None
            if b_arr is None or a_arr.shape != b_arr.shape:
                self.max_abs_diff = math.inf
                continue
            if a_arr.dtype.kind not in "iufb" or b_arr.dtype.kind not in "iufb":
                self.max_abs_diff = max(
                    self.max_abs_diff, 0.0 if np.array_equal(a_arr, b_arr) else math.inf
                )
                continue
            if a_arr.size:
                diff = float(np.max(np.abs(a_arr.astype(np.float64) - b_arr.astype(np.float64))))
                self.max_abs_diff = max(self.max_abs_diff, diff)
            if self.rule.min_top1_agreement is not None and a_arr.ndim >= 1 and a_arr.shape[-1] > 1:
                rows_a = a_arr.reshape(-1, a_arr.shape[-1]).argmax(axis=-1)
                rows_b = b_arr.reshape(-1, b_arr.shape[-1]).argmax(axis=-1)
                self.top1_rows += int(rows_a.size)
                self.top1_agreed += int(np.sum(rows_a == rows_b))

    def _judge(self) -> tuple[str, str]:
        rule = self.rule
        numbers = self.numbers()
        if rule.max_abs_diff is not None and self.max_abs_diff > rule.max_abs_diff:
            return FAIL, (
                f"shadow probation: outputs differ from the served version's by up to "
                f"{self.max_abs_diff:.3g} over {self.mirrored} mirrored requests (the rollout's "
                f"shadow.max_abs_diff {rule.max_abs_diff:g})"
            )
        agreement = numbers["top1_agreement"]
        if (
            rule.min_top1_agreement is not None
            and agreement is not None
            and agreement < rule.min_top1_agreement
        ):
            return FAIL, (
                f"shadow probation: top-1 agreed with the served version on {agreement:.1%} of "
                f"{self.top1_rows} rows (the rollout's shadow.min_top1_agreement "
                f"{rule.min_top1_agreement:g})"
            )
        shadow_ms, served_ms = numbers["p50_ms"], numbers["served_p50_ms"]
        if (
            rule.max_latency_ratio is not None
            and shadow_ms is not None
            and served_ms is not None
            and too_slow(shadow_ms, served_ms, rule.max_latency_ratio)
        ):
            return FAIL, (
                f"shadow probation: median latency {shadow_ms:.3g} ms against the served "
                f"version's {served_ms:.3g} ms on the same {self.mirrored} requests (the "
                f"rollout's shadow.max_latency_ratio {rule.max_latency_ratio:g})"
            )
        return PASS, ""

    def timed_out(self) -> None:
        if not self.verdict:
            self._end(
                FAIL,
                f"shadow probation: only {self.mirrored} of {self.rule.requests} mirrored "
                f"requests in {self.rule.timeout_s:g} s (the rollout's shadow.timeout_s)",
            )

    def _end(self, verdict: str, why: str) -> None:
        self.verdict, self.why, self.ended_s = verdict, why, time.time()
        for served in self.serving:
            if served.mirror is self:
                served.mirror = None
        self.done(self, why)

    def numbers(self) -> dict[str, Any]:
        """What the report and the status say of it."""
        agreement = self.top1_agreed / self.top1_rows if self.top1_rows else None
        shadow_ms = median_ms(self.shadow_ns)
        served_ms = median_ms(self.served_ns)
        return {
            "version": self.shadow.version,
            "state": self.verdict or "running",
            "share": self.rule.share,
            "mirrored": self.mirrored,
            "of": self.rule.requests,
            "errors": self.errors,
            "skipped": self.skipped,
            "p50_ms": None if shadow_ms is None else round(shadow_ms, 3),
            "served_p50_ms": None if served_ms is None else round(served_ms, 3),
            "max_abs_diff": None if not self.shadow_ns else _finite(self.max_abs_diff),
            "top1_agreement": None if agreement is None else round(agreement, 4),
            "reason": self.why,
        }


def _finite(value: float) -> float | str:
    return round(value, 6) if math.isfinite(value) else "inf"


def folder_bytes(folder: Path) -> int:
    """The bytes of a version folder's files (blocking)."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def mem_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemAvailable (None where there is no /proc/meminfo)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fits_beside(folder: Path, available: int | None) -> str:
    """'' when a version's files fit in the memory available beside what serves, else why
    not: today's probation then (the files' size is what loading them costs at least; twice
    that is asked for, for the runtime's own copies and the arena)."""
    size = folder_bytes(folder)
    if available is None or 2 * size <= available:
        return ""
    return (
        f"its files ({size / 2**20:.0f} MiB, twice that needed) do not fit beside the served "
        f"version in the {available / 2**20:.0f} MiB available"
    )


class ShadowTrials:
    """Every model's shadow trial (on the event loop), and why a rollout's shadow rule fell
    back to today's probation on a version."""

    def __init__(self, done: Callable[[ShadowTrial, str], None]) -> None:
        self._done = done
        self.trials: dict[str, ShadowTrial] = {}
        self.finished: dict[tuple[str, int], dict[str, Any]] = {}  # (model, version) -> numbers
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def start(
        self, name: str, shadow: ServedVersion, serving: list[ServedVersion], rule: ShadowRule
    ) -> ShadowTrial:
        self.drop(name)
        trial = ShadowTrial(name, shadow, rule, serving, self._ended)
        self.trials[name] = trial
        for served in serving:
            served.mirror = trial
        self._timers[name] = asyncio.get_running_loop().call_later(rule.timeout_s, trial.timed_out)
        log.info(
            "%s: on shadow probation beside version %s: %g of the requests mirrored to it until "
            "%d are judged; clients stay on version %s",
            shadow.label,
            ", ".join(str(s.version) for s in serving),
            rule.share,
            rule.requests,
            ", ".join(str(s.version) for s in serving),
        )
        return trial

    def drop(self, name: str) -> ShadowTrial | None:
        """End a model's trial without a verdict (a reload replaced it); the trial, to retire."""
        trial = self.trials.pop(name, None)
        timer = self._timers.pop(name, None)
        if timer is not None:
            timer.cancel()
        if trial is not None:
            trial.verdict = trial.verdict or "dropped"
            for served in trial.serving:
                if served.mirror is trial:
                    served.mirror = None
        return trial

    def fell_back(self, name: str, version: int, why: str) -> None:
        self.finished[(name, version)] = {"version": version, "state": "skipped", "reason": why}

    def numbers(self, name: str, version: int) -> dict[str, Any] | None:
        trial = self.trials.get(name)
        if trial is not None and trial.shadow.version == version:
            return trial.numbers()
        return self.finished.get((name, version))

    def _ended(self, trial: ShadowTrial, why: str) -> None:
        if self.trials.get(trial.name) is trial:
            del self.trials[trial.name]
            timer = self._timers.pop(trial.name, None)
            if timer is not None:
                timer.cancel()
        self.finished[(trial.name, trial.shadow.version)] = trial.numbers()
        self._done(trial, why)

    def stop(self) -> None:
        for name in list(self.trials):
            self.drop(name)
