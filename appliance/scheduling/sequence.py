"""The sequence batcher for stateful models (`sequence_batching`).

Requests carry `sequence_id` (an integer or a string), `sequence_start` and `sequence_end`.
Each sequence's requests run one at a time and in order; requests of different sequences
share executions (up to max_batch_size), each batch row told by the control inputs whether
it starts or ends its sequence (START, END, READY, CORRID, with the values the config gives).
Implicit state (`state` entries) is kept here, per sequence: a row's state output becomes
its state input on the sequence's next request, starting from zeros or `initial_state`.

Triton's `direct` strategy pins a sequence to one batch slot for models that keep state in the
instance; ONNX models here hold no state of their own (implicit state lives in this scheduler),
so `direct` and `oldest` both schedule the oldest ready sequences first.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.errors import InvalidInput, QueueFull, ServerUnavailable
from appliance.scheduling.base import SchedulerBase
from appliance.scheduling.instances import BatchResult, InstanceWorker, Job
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.stats import ModelStats
from appliance.types import Array

log = logging.getLogger(__name__)

SequenceId = int | str


class SequenceError(InvalidInput):
    """A request that does not fit its sequence (unknown, timed out, no START)."""


@dataclass
class Control:
    name: str
    kind: str  # START | END | READY | CORRID
    dtype: np.dtype[Any]
    false_true: tuple[Any, Any] = (0, 1)


@dataclass
class StateSpec:
    input_name: str
    output_name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    initial: Array | None = None


@dataclass
class Sequence:
    id: SequenceId
    waiting: deque[Job] = field(default_factory=deque)
    state: dict[str, Array] = field(default_factory=dict)  # state input name -> row
    running: bool = False
    last_used_ns: int = 0
    ended: bool = False


@dataclass(frozen=True)
class SequenceSpec:
    """A sequence-batched model's scheduling rules, read from its config once."""

    max_batch_size: int  # 0: the model does not batch
    idle_ns: int  # a sequence with no request for this long is released
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = ()
    max_sequences: int = 4096  # active at once; more are refused
    max_waiting: int = 4096  # requests waiting across all sequences; more are refused


class SequenceScheduler(SchedulerBase):
    """Sequences in order, batched across sequences, with implicit state."""

    def __init__(
        self,
        label: str,
        workers: list[InstanceWorker],
        spec: SequenceSpec,
        stats: ModelStats,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(label, workers, stats, rate_limiter)
        self._max_batch = max(1, spec.max_batch_size)
        self._batching = spec.max_batch_size > 0
        self._idle_ns = spec.idle_ns
        self._controls = spec.controls
        self._states = spec.states
        self._max_sequences = spec.max_sequences
        self._max_waiting = spec.max_waiting
        self._sequences: dict[SequenceId, Sequence] = {}
        self._expired: dict[SequenceId, None] = {}  # recently timed out, for a precise error

    @property
    def pending(self) -> int:
        return sum(len(s.waiting) for s in self._sequences.values())

    def _take_queued(self) -> list[Job]:
        jobs = [job for s in self._sequences.values() for job in s.waiting]
        for sequence in self._sequences.values():
            sequence.waiting.clear()
        return jobs

    async def submit(self, job: Job) -> dict[str, Array]:
        self._refuse_if_closing()
        now = time.monotonic_ns()
        self._expire(now)
        sid = job.sequence_id
        sequence = self._sequences.get(sid)
        if job.sequence_start:
            if sequence is None:
                if len(self._sequences) >= self._max_sequences:
                    raise ServerUnavailable(
                        f"{self._label}: {self._max_sequences} sequences are active; retry later"
                    )
                sequence = self._sequences[sid] = Sequence(sid)
                self._expired.pop(sid, None)
        elif sequence is None:
            why = (
                "timed out (max_sequence_idle_microseconds)"
                if sid in self._expired
                else ("is not active")
            )
            raise SequenceError(
                f"{self._label}: sequence {sid!r} {why}; its first request must set sequence_start"
            )
        if self.pending >= self._max_waiting:
            raise QueueFull(
                f"{self._label}: {self._max_waiting} requests are waiting (max_queue_size); "
                "retry later"
            )
        job.enqueue_ns = now
        sequence.waiting.append(job)
        sequence.last_used_ns = now
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            if job in sequence.waiting:
                sequence.waiting.remove(job)
                self._stats.cancelled += 1
            raise

    def _expire(self, now: int) -> None:
        for sid, sequence in list(self._sequences.items()):
            if (
                not sequence.running
                and not sequence.waiting
                and (now - sequence.last_used_ns > self._idle_ns)
            ):
                del self._sequences[sid]
                self._expired[sid] = None
                log.info(
                    "%s: sequence %r released after %d us idle",
                    self._label,
                    sid,
                    self._idle_ns // 1000,
                )
        while len(self._expired) > 10_000:
            self._expired.pop(next(iter(self._expired)))

    def _dispatch(self) -> None:
        while self._idle and not self._awaiting_resources:
            ready = sorted(
                (s for s in self._sequences.values() if s.waiting and not s.running),
                key=lambda s: s.waiting[0].enqueue_ns,
            )
            if not ready:
                break
            worker = self._free_worker()
            if worker is None:  # the rate limiter holds every idle instance back
                break
            head_key = ready[0].waiting[0].shape_key
            chosen = [s for s in ready if s.waiting[0].shape_key == head_key][: self._max_batch]
            jobs = []
            now = time.monotonic_ns()
            for sequence in chosen:
                job = sequence.waiting.popleft()
                sequence.running = True
                job.dispatch_ns = now
                self._stats.queue.add(now - job.enqueue_ns)
                self._add_controls_and_state(job, sequence)
                jobs.append(job)
            self._run(worker, jobs)
        self._arm_idle_timer()

    def _row(self, value: Any, dtype: np.dtype[Any]) -> Array:
        return np.full((1, 1) if self._batching else (1,), value, dtype=dtype)

    def _add_controls_and_state(self, job: Job, sequence: Sequence) -> None:
        flags = {"START": job.sequence_start, "END": job.sequence_end, "READY": True}
        for control in self._controls:
            if control.kind == "CORRID":
                value: Any = job.sequence_id
                if control.dtype.kind == "O":
                    value = str(value).encode()
                job.inputs[control.name] = self._row(value, control.dtype)
            else:
                job.inputs[control.name] = self._row(
                    control.false_true[1 if flags[control.kind] else 0], control.dtype
                )
        for state in self._states:
            current = None if job.sequence_start else sequence.state.get(state.input_name)
            if current is None:
                base = (
                    state.initial
                    if state.initial is not None
                    else np.zeros(state.dims, dtype=state.dtype)
                )
                current = base[np.newaxis, ...] if self._batching else base
            job.inputs[state.input_name] = current
        job.output_names = tuple(
            dict.fromkeys([*job.output_names, *(s.output_name for s in self._states)])
        )

    def _on_batch_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        self._instance_done(worker, result)
        if result.batch_size:
            result.stamp()
            self._stats.record_execution(
                result.batch_size,
                len(result.jobs),
                result.input_ns,
                result.infer_ns,
                result.output_ns,
            )
            self._stats.last_inference_ms = time.time_ns() // 1_000_000
        now = time.monotonic_ns()
        for job, outcome in zip(result.jobs, result.outcomes, strict=True):
            sequence = self._sequences.get(job.sequence_id)
            if sequence is not None:
                sequence.running = False
                sequence.last_used_ns = now
                if isinstance(outcome, dict):
                    for state in self._states:
                        if state.output_name in outcome:
                            sequence.state[state.input_name] = np.array(outcome[state.output_name])
                if job.sequence_end:
                    del self._sequences[job.sequence_id]
            self._settle(job, outcome)
        self._dispatch()
        self._notify_if_drained()

    def _arm_idle_timer(self) -> None:
        if self._timer is None and self._sequences and self._loop is not None:
            self._timer = self._loop.call_later(self._idle_ns / 1e9, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._timer = None
        self._expire(time.monotonic_ns())
        self._arm_idle_timer()
