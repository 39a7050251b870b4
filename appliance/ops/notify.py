"""systemd's notify protocol: READY, STATUS, WATCHDOG and STOPPING over `$NOTIFY_SOCKET`.

With `Type=notify` systemd counts the service as started on `READY=1`, sent once the initial
models are loaded and the listeners are up. `STATUS=` carries a one-line summary
(`systemctl status` shows it), refreshed every few seconds. `STOPPING=1` goes out as soon as
SIGTERM arrives, before draining. Without `$NOTIFY_SOCKET` nothing here runs.

With `WatchdogSec=` (`$WATCHDOG_USEC`, and `$WATCHDOG_PID` absent or ours) `WATCHDOG=1` is
sent every half interval, not by a bare timer but by a check that the server can still serve:

- the check is a coroutine on the event loop, so a blocked loop sends nothing;
- it measures how late its own wake-up came (loop lag) and skips the ping when the lag exceeds
  the watchdog interval (a loop that busy would answer nobody in time);
- it asks every served version's scheduler whether its instances can make progress: a version
  whose instance thread has exited (its batches would never finish), or whose instances are
  ALL inside one execution for longer than the watchdog interval, fails the check. One stuck
  instance among several does not: the others still serve, and a slow model is not a dead
  server. A decoupled model counts each response it sends as progress. Versions being drained
  are not checked. So: choose WatchdogSec above the longest single model execution.

A failed check stops the pings, logs the reason (once) and puts it in STATUS; systemd then
kills and restarts the service (`Restart=`). Pings also run while models load, so a slow start
is not mistaken for a hang; only READY waits for the load.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

log = logging.getLogger(__name__)

STATUS_EVERY_S = 5.0  # how often STATUS= is refreshed (when it changed)


class Notifier:
    """Datagrams to `$NOTIFY_SOCKET` (a path, or an abstract name starting with '@')."""

    def __init__(self, address: str | None) -> None:
        self.address = address or None
        self.stopping = False
        self._sock: socket.socket | None = None
        self._warned = False

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier:
        return cls((os.environ if env is None else env).get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *fields: str, wait_s: float = 0.0) -> bool:
        """Send `KEY=value` fields in one datagram; never raises. `wait_s`: how long a full
        socket buffer may block (0 for periodic messages: dropping one is fine)."""
        if self.address is None:
            return False
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.settimeout(wait_s)
            self._sock.sendto("\n".join(fields).encode(), target)
        except OSError as exc:
            if not self._warned:  # systemd gone or socket full: say so once, keep serving
                log.warning("cannot notify systemd at %s: %s", self.address, exc)
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> None:
        if not self.stopping:
            self.send("READY=1", f"STATUS={status}", wait_s=1.0)

    def stopping_now(self, status: str = "stopping: draining in-flight requests") -> None:
        """SIGTERM arrived: from now on READY is never sent."""
        if not self.stopping:
            self.stopping = True
            self.send("STOPPING=1", f"STATUS={status}", wait_s=1.0)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def watchdog_interval_s(env: Mapping[str, str], pid: int, stand_in: int | None = None) -> float:
    """systemd's watchdog interval for this process in seconds (0: no watchdog).

    `stand_in`: a pid whose watchdog this process feeds as well. A one-file PyInstaller build
    runs Python in a child of its bootloader, and systemd's main pid is the bootloader.
    """
    try:
        usec = int(env.get("WATCHDOG_USEC", "0"))
    except ValueError:
        return 0.0
    owner = env.get("WATCHDOG_PID", "")
    if usec <= 0 or (owner and owner not in (str(pid), str(stand_in))):
        return 0.0
    return usec / 1e6


def bootloader_pid() -> int | None:
    """The parent pid when running as a one-file PyInstaller build, else None."""
    import sys

    bundle = getattr(sys, "_MEIPASS", None)
    if not getattr(sys, "frozen", False) or bundle is None:
        return None
    # One-file builds unpack into a temporary folder; one-folder builds run beside it.
    from pathlib import Path

    if Path(bundle).resolve().is_relative_to(Path(sys.executable).resolve().parent):
        return None
    return os.getppid()


def watchdog_verdict(lag_s: float, interval_s: float, problems: Sequence[str]) -> str:
    """Why the watchdog must not be pinged now ('' : ping). Pure: see the module docstring."""
    if lag_s > interval_s:
        return f"event loop lagging {lag_s:.2f} s (watchdog interval {interval_s:.2f} s)"
    return "; ".join(problems)


def status_text(
    models: int, ready: int, requests: int, listeners: Sequence[tuple[str, int | None]]
) -> str:
    """STATUS=: `serving 7 models (7 ready), 120 requests served; HTTP :8000 gRPC :8001`."""
    ports = " ".join(f"{name} :{port}" for name, port in listeners if port is not None)
    noun = "model" if models == 1 else "models"
    text = f"serving {models} {noun} ({ready} ready), {requests} requests served"
    return f"{text}; {ports}" if ports else text


class Supervisor:
    """Owns the task that pings the watchdog and refreshes STATUS (see the module docstring).

    `problems(stuck_ns)` lists why versions cannot make progress; `status()` is the summary.
    """

    def __init__(
        self,
        notifier: Notifier,
        interval_s: float,
        problems: Callable[[int], list[str]],
        status: Callable[[], str],
        status_every_s: float = STATUS_EVERY_S,
    ) -> None:
        self.notifier = notifier
        self.interval_s = interval_s
        self._problems = problems
        self._status = status
        self._status_every_s = status_every_s
        self.serving = False  # STATUS is the summary only once READY went out
        self.failing = ""  # the last verdict, for logging changes once

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Supervisor]:
        if not self.notifier.enabled:
            yield self
            return
        if self.interval_s:
            log.info("systemd watchdog: interval %.2f s, pinging every half", self.interval_s)
        self.notifier.send("STATUS=loading models")
        task = asyncio.ensure_future(self._run())
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def ready(self) -> None:
        self.serving = True
        self.notifier.ready(self._status())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        period = self.interval_s / 2 if self.interval_s else self._status_every_s
        last_status, last_status_at = "", loop.time()
        while True:
            started = loop.time()
            await asyncio.sleep(period)
            now = loop.time()
            fields = []
            if self.interval_s:
                verdict = self.check(now - started - period)
                if not verdict:
                    fields.append("WATCHDOG=1")
            status = self._current_status()
            if status != last_status and (
                now - last_status_at >= self._status_every_s or self.failing
            ):
                fields.append(f"STATUS={status}")
                last_status, last_status_at = status, now
            if fields:
                self.notifier.send(*fields)

    def check(self, lag_s: float) -> str:
        """One liveness check; logs when its verdict changes. '' : healthy."""
        stuck_ns = int(self.interval_s * 1e9)
        verdict = watchdog_verdict(lag_s, self.interval_s, self._problems(stuck_ns))
        if verdict and verdict != self.failing:
            log.error("watchdog: not telling systemd we are alive: %s", verdict)
        elif not verdict and self.failing:
            log.warning("watchdog: healthy again")
        self.failing = verdict
        return verdict

    def _current_status(self) -> str:
        if self.notifier.stopping:
            return "stopping: draining in-flight requests"
        if self.failing:
            return f"unhealthy: {self.failing}"
        return self._status() if self.serving else "loading models"
