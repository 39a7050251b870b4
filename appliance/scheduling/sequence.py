"""The sequence batcher for stateful models (`sequence_batching`).

Requests carry `sequence_id` (an integer or a string), `sequence_start` and `sequence_end`.
As in Triton, each sequence holds a slot on one model instance from its START to its END (or
until it idles out), so a model that keeps state in its instance (a Python model's attributes)
sees every request of the sequence: an instance has max(1, max_batch_size) slots with the
`direct` strategy, `oldest.max_candidate_sequences` (when set) with `oldest`. A new sequence
takes the lowest-numbered free slot over all instances, so sequences spread over the instances;
when every slot is held it waits in a backlog and takes the first slot that frees.

Each sequence's requests run one at a time and in order; requests of different sequences on the
same instance share executions (up to max_batch_size, oldest first), each batch row told by the
control inputs whether it starts or ends its sequence (START, END, READY, CORRID, with the
values the config gives). Implicit state (`state` entries) is kept here, per sequence: a row's
state output becomes its state input on the sequence's next request, starting from zeros or
`initial_state`.

With the `direct` strategy a batch runs as soon as its instance is free. With `oldest`, each
instance's sequences feed a dynamic batcher, as in Triton (core's `OldestSequenceBatch` hands
each slot's next request to a `DynamicBatchScheduler`): the batch of the sequences' next
requests is decided by `policy.next_batch` with the strategy's `preferred_batch_size` and
`max_queue_delay_microseconds`, so it may wait for more sequences' requests.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from appliance.common.errors import (
    ApplianceError,
    ErrorCode,
    InvalidInput,
    QueueFull,
    ServerUnavailable,
)
from appliance.common.types import Array
from appliance.scheduling.base import SchedulerBase
from appliance.scheduling.batcher import QueueTimeout
from appliance.scheduling.instances import BatchResult, InstanceWorker, Job, counted
from appliance.scheduling.policy import BatchPolicy, next_batch
from appliance.scheduling.rate_limiter import RateLimiter
from appliance.scheduling.stats import ModelStats

log = logging.getLogger(__name__)

SequenceId = int | str


class SequenceRefusal(InvalidInput):
    """A sequence request refused before it is queued: not in the statistics, as
    tritonserver's sequence batcher returns these from Enqueue (counted nowhere)."""

    uncounted = True


class SequenceError(SequenceRefusal):
    """A request that does not fit its sequence (unknown, timed out, no START)."""


class SequenceTimeout(QueueTimeout):
    """A backlogged sequence (no slot yet) whose requests' timeout ran out: tritonserver's
    reaper rejects every request it queued (UNAVAILABLE, counted REJECTED)."""


class SequenceCancelled(ApplianceError):
    """A queued request of a sequence one of whose earlier requests was cancelled: as in
    Triton, the sequence ends there and its requests still queued are cancelled."""

    code = ErrorCode.CANCELLED


@dataclass
class Control:
    name: str
    kind: str  # START | END | READY | CORRID
    dtype: np.dtype[Any]
    false_true: tuple[Any, Any] = (0, 1)
    datatype: str = ""  # CORRID: the config's type in the protocol's words (UINT64, BYTES)


@dataclass
class StateSpec:
    input_name: str
    output_name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]
    initial: Array | None = None


@dataclass(order=True, frozen=True)
class Slot:
    """A sequence slot: its number on the instance, then the instance's position."""

    index: int
    worker: int


@dataclass
class Sequence:
    id: SequenceId
    waiting: deque[Job] = field(default_factory=deque)
    state: dict[str, Array] = field(default_factory=dict)  # state input name -> row
    running: bool = False
    last_used_ns: int = 0
    ended: bool = False  # its END request has been accepted, or it was cancelled
    cancelled: bool = False  # a queued request of it was cancelled: it ends when idle
    slot: Slot | None = None  # None: in the backlog, waiting for a slot
    # In the backlog: when the first of its requests' `timeout`s runs out (monotonic ns; 0:
    # none given). A slot ends it: Triton times out only a sequence still waiting for one.
    expires_ns: int = 0


@dataclass(frozen=True)
class SequenceSpec:
    """A sequence-batched model's scheduling rules, read from its config once."""

    max_batch_size: int  # 0: the model does not batch
    idle_ns: int  # a sequence with no request for this long is released
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = ()
    max_sequences: int = 4096  # active at once, with a slot or in the backlog; more are refused
    max_waiting: int = 4096  # requests waiting across all sequences; more are refused
    model_name: str = ""  # for Triton's error texts
    slots_per_instance: int = 0  # 0: max(1, max_batch_size) (the direct strategy)
    # The oldest strategy's batching (preferred sizes, delay); None: the direct strategy, where
    # a batch runs as soon as its instance is free.
    oldest: BatchPolicy | None = None


class SequenceScheduler(SchedulerBase):
    """Sequences in order, each on one instance's slot, batched across sequences, with
    implicit state."""

    def __init__(
        self,
        label: str,
        workers: list[InstanceWorker],
        spec: SequenceSpec,
        stats: ModelStats,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        super().__init__(label, workers, stats, rate_limiter)
        self._model = spec.model_name or label
        self._max_batch = max(1, spec.max_batch_size)
        self._batching = spec.max_batch_size > 0
        self._idle_ns = spec.idle_ns
        self._controls = spec.controls
        self._corrid = next((c for c in spec.controls if c.kind == "CORRID"), None)
        self._states = spec.states
        self._max_sequences = spec.max_sequences
        self._max_waiting = spec.max_waiting
        self._oldest = spec.oldest
        self._batch_timer: asyncio.TimerHandle | None = None
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_at = 0  # monotonic ns the expiry timer fires at
        self._sequences: dict[SequenceId, Sequence] = {}
        self._backlog: deque[Sequence] = deque()  # sequences waiting for a slot, in order
        slots = spec.slots_per_instance or self._max_batch
        self._free_slots = [Slot(i, w) for i in range(slots) for w in range(len(workers))]
        heapq.heapify(self._free_slots)

    @property
    def pending(self) -> int:
        return sum(len(s.waiting) for s in self._sequences.values())

    @property
    def open_sequences(self) -> int:
        return len(self._sequences)

    def _take_queued(self) -> list[Job]:
        jobs = [job for s in self._sequences.values() for job in s.waiting]
        for sequence in self._sequences.values():
            sequence.waiting.clear()
        return jobs

    def _check(self, job: Job) -> None:
        """Triton's checks of a sequence request, with its texts."""
        if job.batch_size > 1:
            raise SequenceRefusal(
                f"inference request to model '{self._model}' must specify batch-size 1 due "
                "to requirements of sequence batcher"
            )
        corrid = self._corrid
        if corrid is not None:
            is_string = isinstance(job.sequence_id, str)
            if is_string != (corrid.dtype.kind == "O"):
                raise SequenceRefusal(
                    f"sequence batching control '{corrid.name}' data-type is "
                    f"'{'BYTES' if is_string else 'UINT64'}', but model '{self._model}' "
                    f"expects '{corrid.datatype}'"
                )

    async def submit(self, job: Job) -> dict[str, Array]:
        self._refuse_if_closing()
        self._check(job)
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
                self._assign_slot(sequence)
            elif not sequence.ended:  # Triton goes on in the same slot, as a new sequence
                log.warning(
                    "sequence %s for model '%s' has a conflict. The previous sequence did not "
                    "end before this sequence start. Previous sequence will be terminated early.",
                    sid,
                    self._model,
                )
            sequence.ended = sequence.cancelled = False
        elif sequence is None or sequence.ended:
            raise SequenceError(
                f"inference request for sequence {sid} to model '{self._model}' must specify "
                "the START flag on the first request of the sequence"
            )
        if self.pending >= self._max_waiting:
            raise QueueFull(
                f"{self._label}: {self._max_waiting} requests are waiting (max_queue_size); "
                "retry later"
            )
        job.enqueue_ns = now
        sequence.waiting.append(job)
        sequence.last_used_ns = now
        if sequence.slot is None and job.timeout_us:
            due = now + job.timeout_us * 1000
            if not sequence.expires_ns or due < sequence.expires_ns:
                sequence.expires_ns = due
                self._arm_expiry()
        if job.sequence_end:
            sequence.ended = True
        self._dispatch()
        try:
            return await job.future
        except asyncio.CancelledError:
            if job in sequence.waiting:
                self._cancel_from(sequence, job)
            raise

    def _cancel_from(self, sequence: Sequence, job: Job) -> None:
        """A queued request was cancelled: as in Triton (core's OldestSequenceBatch /
        DirectSequenceBatch force-end a sequence whose next request is cancelled, and
        ReleaseSequenceSlot cancels what is queued behind it), the sequence ends there: its
        requests queued after this one are cancelled and its slot is released once the
        request it is running (if any) is done; a later request needs a START."""
        index = sequence.waiting.index(job)
        dropped = [sequence.waiting.pop() for _ in range(len(sequence.waiting) - index)]
        self._stats.cancelled += len(dropped)
        for other in dropped:
            if other is not job and not other.future.done():
                other.future.set_exception(
                    SequenceCancelled(
                        f"sequence {sequence.id} to model '{self._model}' was cancelled: "
                        "an earlier request of it was cancelled"
                    )
                )
        sequence.ended = sequence.cancelled = True
        if not sequence.running and not sequence.waiting:
            self._end(sequence)
            self._dispatch()

    # ---- slots -------------------------------------------------------------------------------

    def _assign_slot(self, sequence: Sequence) -> None:
        if self._free_slots:
            sequence.slot = heapq.heappop(self._free_slots)
        else:
            self._backlog.append(sequence)

    def _end(self, sequence: Sequence) -> None:
        """The sequence is over: forget it and hand its slot to the oldest backlogged one."""
        if self._sequences.get(sequence.id) is sequence:
            del self._sequences[sequence.id]
        slot, sequence.slot = sequence.slot, None
        if slot is None:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        if self._backlog:
            waited = self._backlog.popleft()
            waited.slot, waited.expires_ns = slot, 0
        else:
            heapq.heappush(self._free_slots, slot)

    def _arm_expiry(self) -> None:
        """One timer for the earliest backlogged sequence's timeout."""
        due = min((s.expires_ns for s in self._backlog if s.expires_ns), default=0)
        if self._expiry_timer is not None:
            if due and self._expiry_at <= due:
                return  # an earlier (or the same) wake-up is set; it re-arms what is left
            self._expiry_timer.cancel()
            self._expiry_timer = None
        if due and self._loop is not None:
            self._expiry_at = due
            wait_s = max(0, due - time.monotonic_ns()) / 1e9
            self._expiry_timer = self._loop.call_later(wait_s, self._reap_backlog)

    def _reap_backlog(self) -> None:
        """Backlogged sequences whose timeout ran out: every request they queued is refused in
        tritonserver's words, and the sequence is forgotten (a later request needs START)."""
        self._expiry_timer = None
        now = time.monotonic_ns()
        for sequence in [s for s in self._backlog if s.expires_ns and s.expires_ns <= now]:
            self._backlog.remove(sequence)
            if self._sequences.get(sequence.id) is sequence:
                del self._sequences[sequence.id]
            waited_us = (now - sequence.waiting[0].enqueue_ns) // 1000 if sequence.waiting else 0
            for job in sequence.waiting:
                if not job.future.done():
                    job.future.set_exception(
                        SequenceTimeout(
                            "timeout of the corresponding sequence has been expired (model "
                            f"'{self._model}' sequence {sequence.id!r} waited {waited_us} us "
                            "for a sequence slot)"
                        )
                    )
            sequence.waiting.clear()
            sequence.ended = True
        self._arm_expiry()

    def _expire(self, now: int) -> None:
        for sid, sequence in list(self._sequences.items()):
            if (
                not sequence.running
                and not sequence.waiting
                and (now - sequence.last_used_ns > self._idle_ns)
            ):
                self._end(sequence)
                log.info(
                    "%s: sequence %r released after %d us idle",
                    self._label,
                    sid,
                    self._idle_ns // 1000,
                )

    # ---- batches -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        wait_ns = 0  # the soonest an instance's held-back batch is due
        while self._idle and not self._awaiting_resources:
            idle = {id(w): w for w in self._idle}
            ready: dict[int, list[Sequence]] = {}
            for s in self._sequences.values():
                if s.waiting and not s.running and s.slot is not None:
                    worker = self._workers[s.slot.worker]
                    if id(worker) in idle:
                        ready.setdefault(s.slot.worker, []).append(s)
            now = time.monotonic_ns()
            batches: dict[int, list[Sequence]] = {}
            for index, sequences in ready.items():
                sequences.sort(key=lambda s: s.waiting[0].enqueue_ns)
                batch, wait = self._batch_of(sequences, now)
                if batch:
                    batches[index] = batch
                elif wait:
                    wait_ns = min(wait_ns, wait) if wait_ns else wait
            if not batches:
                break
            order = sorted(batches, key=lambda w: batches[w][0].waiting[0].enqueue_ns)
            chosen_worker = next(
                (w for w in order if self._limiter.try_acquire(self._workers[w].resources)),
                None,
            )
            if chosen_worker is None:  # the rate limiter holds every idle instance back
                self._wait_for_resources()
                break
            worker = self._workers[chosen_worker]
            self._idle.remove(worker)
            jobs = []
            for sequence in batches[chosen_worker]:
                job = sequence.waiting.popleft()
                sequence.running = True
                job.dispatch_ns = now
                self._add_controls_and_state(job, sequence)
                jobs.append(job)
            self._run(worker, jobs)
        self._arm_batch_timer(wait_ns)
        self._arm_idle_timer()

    def _batch_of(self, candidates: list[Sequence], now: int) -> tuple[list[Sequence], int]:
        """The sequences whose next requests run together on one instance now (oldest first),
        or none and how long to wait for more (the oldest strategy's batching window)."""
        head = candidates[0].waiting[0]
        if self._oldest is None:  # direct: every sequence ready with the head's shapes
            key = self._shapes(candidates[0])
            same = [s for s in candidates if self._shapes(s) == key]
            return same[: self._max_batch], 0
        queued = [(1, self._shapes(s)) for s in candidates]
        decision = next_batch(queued, now - head.enqueue_ns, self._oldest)
        return candidates[: decision.run], decision.wait_ns

    def _shapes(self, sequence: Sequence) -> tuple[Any, ...]:
        """The next request's input shapes and its state's: rows batch only with equals (a
        state with a variable dimension may differ from one sequence to the next)."""
        job = sequence.waiting[0]
        if not self._states:
            return (job.shape_key,)
        kept = {} if job.sequence_start else sequence.state
        shapes = []
        for state in self._states:
            current = kept.get(state.input_name)
            if current is not None:
                shapes.append(current.shape)
            else:
                base = state.initial.shape if state.initial is not None else state.dims
                shapes.append((1, *base) if self._batching else base)
        return (job.shape_key, *shapes)

    def _arm_batch_timer(self, wait_ns: int) -> None:
        if self._batch_timer is not None:
            self._batch_timer.cancel()
            self._batch_timer = None
        if wait_ns and self._loop is not None:
            self._batch_timer = self._loop.call_later(wait_ns / 1e9, self._on_batch_timer)

    def _on_batch_timer(self) -> None:
        self._batch_timer = None
        self._dispatch()

    async def stop(self, timeout_s: float, reason: str) -> int:
        failed = await super().stop(timeout_s, reason)
        self._arm_batch_timer(0)
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        return failed

    def _row(self, value: Any, dtype: np.dtype[Any]) -> Array:
        return np.full((1, 1) if self._batching else (1,), value, dtype=dtype)

    def _add_controls_and_state(self, job: Job, sequence: Sequence) -> None:
        flags = {"START": job.sequence_start, "END": job.sequence_end, "READY": True}
        for control in self._controls:
            if control.kind == "CORRID":
                value: Any = job.sequence_id
                if control.dtype.kind == "O":
                    value = str(value).encode()
                else:  # Triton writes the id's 64 bits in the control's type
                    value = np.array(value % 2**64, dtype=np.uint64).astype(control.dtype)
                job.inputs[control.name] = self._row(value, control.dtype)
            else:
                job.inputs[control.name] = self._row(
                    control.false_true[1 if flags[control.kind] else 0], control.dtype
                )
        kept = {} if job.sequence_start else sequence.state
        for state in self._states:
            job.inputs[state.input_name] = self._state_of(state, kept)
        job.output_names = tuple(
            dict.fromkeys([*job.output_names, *(s.output_name for s in self._states)])
        )

    def _state_of(self, state: StateSpec, kept: dict[str, Array]) -> Array:
        """A state input's row: the sequence's kept value, else its initial value (zeros)."""
        current = kept.get(state.input_name)
        if current is not None:
            return current
        base = state.initial if state.initial is not None else np.zeros(state.dims, state.dtype)
        return base[np.newaxis, ...] if self._batching else base

    def _on_batch_done(self, worker: InstanceWorker, result: BatchResult) -> None:
        self._instance_done(worker, result)
        size = result.executed_size
        if size:
            result.stamp()
            inferences, queues = counted(result)
            self._stats.record_execution(
                size, inferences, result.input_ns, result.infer_ns, result.output_ns, queues
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
                ending = job.sequence_end or sequence.cancelled
                if ending and sequence.ended and not sequence.waiting:
                    self._end(sequence)
            self._settle(job, outcome)
        self._dispatch()
        self._notify_if_drained()

    def _arm_idle_timer(self) -> None:
        if self._timer is None and self._sequences and self._loop is not None:
            self._timer = self._loop.call_later(self._idle_ns / 1e9, self._on_idle_timer)

    def _on_idle_timer(self) -> None:
        self._timer = None
        self._expire(time.monotonic_ns())
        self._dispatch()
