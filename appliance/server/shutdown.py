"""One shutdown deadline over the whole server, and the exits that do not wait for it.

The first SIGTERM or SIGINT starts the orderly shutdown (app.py): report not-ready, stop
listening, drain HTTP, gRPC and every model version at once, all under one deadline
(`--exit-timeout-secs`, measured from the signal). At the deadline what is still queued or
running is failed ("server is shutting down"), and CANCEL_GRACE_S later connections that are
still busy are closed; the log names what was cancelled.

Two exits do not wait (uvicorn's `handle_exit` is the model for the first); cli.py, which owns
the signal handlers, takes them:
- a second SIGTERM / SIGINT exits at once, with a log line;
- a backstop: FORCE_AFTER_S past the deadline the process exits whatever is still running
  (a thread stuck in a model, an interpreter exit waiting for one), so that systemd's
  `TimeoutStopSec` (above the deadline plus this) never has to kill it.
Both go through `force_exit`, which kills the model processes first: nothing is left behind.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NoReturn

log = logging.getLogger(__name__)

# After the deadline: requests failed at the deadline get their error answers written; then
# connections (HTTP) and calls (gRPC) still busy are closed.
CANCEL_GRACE_S = 0.5
# After the deadline: the process exits, whatever is left (the backstop).
FORCE_AFTER_S = 1.5
# Between the two sweeps that kill model processes (see kill_model_processes).
REAP_S = 0.2
FORCED_EXIT_CODE = 1


@dataclass(frozen=True)
class Deadline:
    """The one shutdown deadline: `timeout_s` after `start_s` (monotonic seconds)."""

    start_s: float
    timeout_s: float

    @classmethod
    def starting(cls, timeout_s: float, now_s: float | None = None) -> Deadline:
        return cls(time.monotonic() if now_s is None else now_s, max(0.0, timeout_s))

    @property
    def at_s(self) -> float:
        return self.start_s + self.timeout_s

    @property
    def cut_at_s(self) -> float:
        """When busy connections and calls are closed."""
        return self.at_s + CANCEL_GRACE_S

    @property
    def force_at_s(self) -> float:
        """When the backstop ends the process."""
        return self.at_s + FORCE_AFTER_S

    def remaining_s(self, now_s: float) -> float:
        return max(0.0, self.at_s - now_s)

    def until_cut_s(self, now_s: float) -> float:
        return max(0.0, self.cut_at_s - now_s)

    def until_force_s(self, now_s: float) -> float:
        return max(0.0, self.force_at_s - now_s)


def shutdown_summary(
    deadline: Deadline, now_s: float, cancelled: Sequence[str], killed: Sequence[str] = ()
) -> tuple[int, str]:
    """The log line that ends a shutdown, and its level (pure).

    `cancelled`: one line per model version or listener whose work was cut short (the model
    runtime's lines name the model and version); `killed`: model processes still alive after
    the drain, killed.
    """
    took = f"{now_s - deadline.start_s:.1f} s"
    if not cancelled and not killed:
        return logging.INFO, f"shutdown complete in {took}: every in-flight request finished"
    parts = []
    if cancelled:
        parts.append(
            f"cancelled work left at the {deadline.timeout_s:g} s deadline in "
            f"{len(cancelled)} place(s): " + "; ".join(cancelled)
        )
    if killed:
        parts.append(f"killed {len(killed)} model process(es) still running: {', '.join(killed)}")
    return logging.WARNING, f"shutdown complete in {took}; " + "; ".join(parts)


def kill_model_processes(reap_s: float = REAP_S) -> list[str]:
    """Kill this process's multiprocessing children (Python model workers); their names.

    Twice: an instance thread that sees its process die may start a new one meanwhile (the
    runtime stops them for good; this is the last resort). Safe from any thread.
    """
    names = _kill_children()
    if names:
        time.sleep(reap_s)  # they die at once; reaped by the next sweep
        names += _kill_children()
    return list(dict.fromkeys(names))  # one killed twice is named once


def _kill_children() -> list[str]:
    try:
        children = multiprocessing.active_children()  # also reaps the ones that exited
    except (RuntimeError, OSError):  # the children set changed under us: take what we can
        return []
    names = []
    for child in children:
        try:
            child.kill()
        except (OSError, ValueError, AttributeError):  # already gone, or closed
            continue
        names.append(f"{child.name} (pid {child.pid})")
    return names


def _flush_logs() -> None:
    for logger in (logging.getLogger(), logging.getLogger("appliance")):
        for handler in logger.handlers:
            with contextlib.suppress(Exception):  # exiting anyway; nothing to report it to
                handler.flush()


def force_exit(reason: str, code: int = FORCED_EXIT_CODE) -> NoReturn:
    """Log why, kill the model processes, flush the logs and end the process now."""
    log.warning("%s", reason)
    killed = kill_model_processes()
    if killed:
        log.warning("killed %d model process(es): %s", len(killed), ", ".join(killed))
    _flush_logs()
    # Not sys.exit: the interpreter's exit waits for every non-daemon thread (a model stuck in
    # a thread-pool call would hold it forever) and asyncio would cancel tasks half-way.
    os._exit(code)
