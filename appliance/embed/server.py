"""`Server`: the whole server (`Appliance`) on an event loop of its own, in a background thread."""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import logging
import sys
import threading
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from appliance.common.settings import ServerSettings
from appliance.embed.errors import (
    InvalidArgumentError,
    UnavailableError,
    UnsupportedError,
    triton_error,
)
from appliance.embed.options import LogCallback, LogLevel, Options, parse_settings
from appliance.frontends.http import convert
from appliance.ops.logs import OWN_LOGGERS, LogSettings, LogState, formatter
from appliance.ops.notify import Notifier
from appliance.server.app import Appliance
from appliance.server.shutdown import Deadline

if TYPE_CHECKING:
    from appliance.embed.model import Model

T = TypeVar("T")


class Server:
    """This server in-process (Triton's `tritonserver.Server`).

    >>> server = Server(Options(model_repository="models")).start(wait_until_ready=True)
    >>> for response in server.model("simple").infer(inputs={"INPUT0": a, "INPUT1": b}):
    ...     print(numpy.from_dlpack(response.outputs["OUTPUT0"]))
    >>> server.stop()
    """

    def __init__(self, options: Options | None = None, **kwargs: Any) -> None:
        self.options = options if options is not None else Options(**kwargs)
        self._running: _Running | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    def start(
        self,
        wait_until_ready: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> Server:
        """Load the models (as the control mode says) and return once the server runs."""
        if self._running is not None:
            raise InvalidArgumentError("Server already started")
        argv = self.options.command_line()
        settings = parse_settings(argv)
        self._running = _Running(settings, argv, self.options)
        try:
            self._running.start()
        except BaseException:
            self._running = None
            raise
        started = time.monotonic()
        while wait_until_ready and not self.ready():
            if timeout is not None and time.monotonic() - started >= timeout:
                raise UnavailableError("Timeout before ready")
            time.sleep(polling_interval)
        return self

    def stop(self) -> None:
        """Shut down under the exit timeout: refuse new requests, drain, unload, stop."""
        running = self._require()
        self._running = None
        running.stop()

    def __enter__(self) -> Server:
        return self if self._running is not None else self.start(wait_until_ready=True)

    def __exit__(self, *exc: object) -> None:
        if self._running is not None:
            self.stop()

    # ---- health and metadata -----------------------------------------------------------------

    def live(self) -> bool:
        return self._require().appliance.control.server_live()

    def ready(self) -> bool:
        return self._require().appliance.control.server_ready()

    def metadata(self) -> dict[str, Any]:
        result = convert.server_metadata(self._require().appliance.control.server_metadata())
        return {key: result[key] for key in ("name", "version", "extensions")}

    # ---- models ------------------------------------------------------------------------------

    def model(self, model_name: str, model_version: int = -1) -> Model:
        from appliance.embed.model import Model

        return Model(self, model_name, model_version)

    def models(self, exclude_not_ready: bool = False) -> ModelDictionary:
        """Every model of the repositories: {(name, version): Model}, version -1 for a model
        with no version loaded."""
        from appliance.embed.model import Model

        rows = self._require().appliance.control.repository_index(exclude_not_ready)
        found = [
            Model(self, row.name, -1 if row.version is None else row.version,
                  row.state or None, row.reason or None)
            for row in rows
        ]  # fmt: skip
        return ModelDictionary(self, found)

    def load(self, model_name: str, parameters: dict[str, Any] | None = None) -> Model:
        """Load (or reload) a model and wait for it (explicit mode, as Triton's)."""
        running = self._require()
        running.call(running.appliance.control.load_model(model_name, dict(parameters or {})))
        return self.model(model_name)

    def unload(
        self,
        model: str | Model,
        unload_dependents: bool = False,
        wait_until_unloaded: bool = False,
        polling_interval: float = 0.1,
        timeout: float | None = None,
    ) -> None:
        """Unload a model (its in-flight requests drain first); it is gone on return here,
        whatever `wait_until_unloaded` says."""
        running = self._require()
        name = model if isinstance(model, str) else model.name
        running.call(running.appliance.control.unload_model(name, unload_dependents))

    def poll_model_repository(self) -> None:
        raise UnsupportedError(
            "poll_model_repository: this server polls on its own in POLL mode "
            "(--repository-poll-secs through Options.server_args)"
        )

    def metrics(self, metric_format: Any = None) -> str:
        raise UnsupportedError("metrics(): start tritonfrontend.Metrics and read GET /metrics")

    # ---- inside ------------------------------------------------------------------------------

    def _require(self) -> _Running:
        if self._running is None:
            raise InvalidArgumentError("Server not started")
        return self._running


class ModelDictionary(dict[tuple[str, int], "Model"]):
    """`Server.models()`: {(name, version): Model}; a name alone gives the model at version -1."""

    def __init__(self, server: Server, models: list[Model]) -> None:
        super().__init__(((m.name, m.version), m) for m in models)
        self._server = server
        self._names = {name for name, _ in self}

    def __getitem__(self, key: Any) -> Model:
        if isinstance(key, tuple):
            try:
                return dict.__getitem__(self, key)
            except KeyError:
                raise KeyError(f"Unknown Model: {key}") from None
        if key in self._names:
            return self._server.model(key)
        raise KeyError(f"Unknown Model: {key}")


class _Running:
    """A started server: the loop thread, the `Appliance` on it and the way to stop it."""

    def __init__(self, settings: ServerSettings, argv: list[str], options: Options) -> None:
        self.settings = settings
        self.argv = argv  # the front ends parse their flags after these
        state = LogState.from_settings(settings)
        self.logs = LogSettings(state)
        self._handler = _LogHandler(self.logs, options.log_callback)
        self.appliance = Appliance(settings, Notifier(None), self.logs)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stopped: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="tritonserver", daemon=True)

    def start(self) -> None:
        self._attach_logs()
        self._thread.start()
        try:
            self._started.result()
        except BaseException as exc:
            self._thread.join()
            self._detach_logs()
            raise triton_error(exc) from exc
        _RUNNING.add(self)

    def stop(self) -> None:
        _RUNNING.discard(self)
        loop, stop = self.loop, self._stop
        if loop is not None and stop is not None:
            loop.call_soon_threadsafe(stop.set)
        try:
            self._stopped.result()
        finally:
            self._thread.join()
            self._detach_logs()

    def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the server's loop and wait for it (from any other thread)."""
        assert self.loop is not None
        future = asyncio.run_coroutine_threadsafe(work, self.loop)
        try:
            return future.result()
        except Exception as exc:
            raise triton_error(exc) from exc

    def _run(self) -> None:
        loop = _new_loop()
        try:
            loop.run_until_complete(self._main())
        except BaseException as exc:
            for done in (self._started, self._stopped):
                if not done.done():
                    done.set_exception(exc)
        finally:
            loop.close()

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.appliance.running():
            self._started.set_result(None)
            await self._stop.wait()
            deadline = Deadline.starting(self.settings.exit_timeout_secs)
            self.appliance.begin_shutdown(deadline)
        self._stopped.set_result(None)

    def _attach_logs(self) -> None:
        _ROUTE.push(self._handler, self.logs.state.root_level())

    def _detach_logs(self) -> None:
        _ROUTE.pop(self._handler)
        self._handler.close()


# Servers the application started and did not stop: stopped at interpreter exit, so that their
# model processes (Python models) and Unix sockets do not outlive it.
_RUNNING: set[_Running] = set()


@atexit.register
def _stop_all() -> None:
    for running in list(_RUNNING):
        with contextlib.suppress(Exception):
            running.stop()


class _LogRoute:
    """Where the server's loggers write while embedded servers run: through the handler of the
    one started last (loggers are per process, not per server), and not on to the
    application's own handlers; as before once the last one stops."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handlers: list[tuple[logging.Handler, int]] = []
        self._saved: list[tuple[logging.Logger, int, bool]] = []

    def push(self, handler: logging.Handler, level: int) -> None:
        with self._lock:
            if not self._handlers:
                loggers = [logging.getLogger(name) for name in OWN_LOGGERS]
                self._saved = [(lg, lg.level, lg.propagate) for lg in loggers]
            self._handlers.append((handler, level))
            self._apply()

    def pop(self, handler: logging.Handler) -> None:
        with self._lock:
            self._handlers = [(h, lv) for h, lv in self._handlers if h is not handler]
            for logger, _, _ in self._saved:
                logger.removeHandler(handler)
            if self._handlers:
                self._apply()
                return
            for logger, level, propagate in self._saved:
                logger.setLevel(level)
                logger.propagate = propagate
            self._saved = []

    def _apply(self) -> None:
        handler, level = self._handlers[-1]
        for logger, _, _ in self._saved:
            for other, _ in self._handlers[:-1]:
                logger.removeHandler(other)
            logger.addHandler(handler)
            logger.setLevel(level)
            logger.propagate = False


_ROUTE = _LogRoute()


class _LogHandler(logging.Handler):
    """The server's log lines, filtered by its log settings: to `log_callback` when given,
    else to the log file or stderr, formatted as the command line's."""

    def __init__(self, logs: LogSettings, callback: LogCallback | None) -> None:
        super().__init__()
        self._logs = logs
        self._callback = callback
        self._stream: Any = None
        if callback is None:
            path = logs.state.log_file
            self._stream = open(path, "a", encoding="utf-8") if path else sys.stderr  # noqa: SIM115  # closed in close()
        self.setFormatter(formatter(logs.state.log_format))

    def emit(self, record: logging.LogRecord) -> None:
        if not self._logs.state.passes(record):
            return
        try:
            line = self.format(record)
            if self._callback is not None:
                self._callback(_level(record.levelno), line)
            else:
                self._stream.write(line + "\n")
                self._stream.flush()
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self._stream is not None and self._stream is not sys.stderr:
            self._stream.close()
        super().close()


def _level(levelno: int) -> LogLevel:
    if levelno >= logging.ERROR:
        return LogLevel.ERROR
    if levelno >= logging.WARNING:
        return LogLevel.WARN
    if levelno >= logging.INFO:
        return LogLevel.INFO
    return LogLevel.VERBOSE


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop's where installed (as the command line's), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
