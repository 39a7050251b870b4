"""What one model version's executions cost, learned as they finish: pure, tested with numbers.

Two scheduler decisions read it (scheduling/batcher.py):

- **Inline execution**: handing a batch to a worker thread and back costs two thread wake-ups,
  about 60 us of CPU on a small core, more than a tiny model takes to run. After a warm-up of
  WARMUP_EXECUTIONS on the worker thread, a batch whose predicted cost (CPU time per input
  byte, times the batch's input bytes) is within the inline budget runs on the event loop.
  CPU time, not wall time: a thread waiting for the GIL or a preempted VM would otherwise
  look slow.
- **Admission**: the time per request and per execution, from the hand-over to the instance
  to the result back on the loop (when the next batch can go). That is the execution plus the
  loop's own delays, which grow with the loop's load: measured at 4x the sustainable rate, the
  execution alone predicted queue waits 25% short, and 3% of the requests admitted within a
  1 s bound waited past 1.25 s (with this: 1.03x at the median, and 0.1-1% past 1.25 s, as
  other work on the machine comes and goes). At most twice the execution, so that one stall
  of the loop (a busy machine) does not make the average refuse work the model has time for.

Each is a moving average (weight 0.1 for the newest), started at the first execution.
"""

from __future__ import annotations

# Executions measured on worker threads before a version may run inline.
WARMUP_EXECUTIONS = 16
_WEIGHT = 0.1


class ExecutionCosts:
    __slots__ = ("execution_ns", "inline_budget_ns", "measured", "per_byte_ns", "request_ns")

    def __init__(self, inline_budget_ns: int = 0) -> None:
        self.inline_budget_ns = inline_budget_ns  # 0: never inline
        self.per_byte_ns = 0.0  # CPU time per input byte
        self.request_ns = 0.0  # wall time per request of an execution (admission)
        self.execution_ns = 0.0  # wall time of one execution's cycle, a whole batch
        self.measured = 0

    def inline_within_budget(self, nbytes: int) -> bool:
        """Whether a batch of `nbytes` input bytes is predicted to run within the budget."""
        if self.measured < WARMUP_EXECUTIONS or not self.inline_budget_ns:
            return False
        return self.per_byte_ns * nbytes <= self.inline_budget_ns

    def learn(self, requests: int, nbytes: int, cpu_ns: int, wall_ns: int, cycle_ns: int) -> None:
        """One execution of `requests` requests and `nbytes` input bytes: its CPU time (-1:
        not sampled), the execution's wall time, and the cycle from the hand-over to the result
        back on the loop."""
        timed = cpu_ns >= 0
        per_byte = cpu_ns / max(1, nbytes) if timed else 0.0
        per_request = min(max(cycle_ns, wall_ns), 2 * wall_ns) / requests
        per_execution = per_request * requests
        self.measured += 1
        if self.measured == 1:
            self.per_byte_ns = per_byte
            self.request_ns = per_request
            self.execution_ns = per_execution
            return
        if timed:
            self.per_byte_ns += (per_byte - self.per_byte_ns) * _WEIGHT
        self.request_ns += (per_request - self.request_ns) * _WEIGHT
        self.execution_ns += (per_execution - self.execution_ns) * _WEIGHT
