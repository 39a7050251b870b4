"""The Python backend: each instance of a `model.py` model runs in a process of its own.

A CPU-bound model then stalls neither the event loop nor other models. If the process dies
while executing, or does not answer within the config parameter `execute_timeout_s` (off by
default), the batch fails with that reason and a fresh process (initialize() again) serves the
next request. Requests that share a batch reach `execute()` as a list of requests, each with
its own rows, id, sequence id, flags, parameters and timeout, and their responses are joined
back into the batch's outputs. A decoupled request hands the instance back as soon as the
model's `execute()` returns (Triton's rule): its responses, final flag or failure arrive
tagged with the request and go straight to it, so concurrent requests interleave.

The request path is a link of its own (channel.py's `Link`, pipes). An execution the event
loop starts (`start_requests`: the scheduler dispatching on the loop) is written there by the
loop, and the model process answers on a pipe of the loop's own, whose reader stays
registered: no instance thread, no hand-off; the model's metric calls are answered on the
loop, its BLS `infer` calls on the instance's call threads (they block on the server), and a
timer every CANCEL_POLL_S looks at cancellation and `execute_timeout_s`. A thread that runs
the request itself (`execute_requests`: a gRPC thread in the scheduler's lane, the
instance's thread for decoupled requests) writes the execute message and reads the answer
itself, answering on the way, inline, the BLS `infer` and metric calls the model's execute()
makes from its main thread; while it answers such a call it watches nothing else: the
model's process dying, or `execute_timeout_s`, is seen once the call returns (a BLS call is
bounded by the callee's own timeouts). Request infos travel as plain tuples.
Everything else comes over the pipe, where one reader thread per process takes every
message (channel.py lists them): a decoupled request's responses go straight to it; metric
calls are answered at once, in order, so a response is never seen before the metric updates
its model made ahead of it; other BLS and model-loading calls run on a small thread pool of
the instance, several at once (a model's `asyncio.gather` of `async_exec` calls), each
answered by its call id through the server's `InferenceHost`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edge_backends.api import (
    Arrays,
    BackendBase,
    BackendError,
    CancelCheck,
    CustomMetricFamily,
    Done,
    Emit,
    ExecuteRaised,
    ExecutionError,
    HostRequest,
    InstanceBase,
    InstanceSpec,
    ModelLoadError,
    ModelSignature,
    Outputs,
    Pending,
    RequestInfo,
    ResponseError,
)
from edge_backends.python.channel import Link
from edge_backends.python.custom_metrics import MetricError, MetricStore, answer
from edge_backends.python.launch import CONTEXT
from edge_backends.python.shm import Arena, Reader, pack, unpack

log = logging.getLogger(__name__)
# The models' own lines, forwarded from their processes (pb_logging.py).
_model_log = logging.getLogger("python_model")

START_TIMEOUT_S = 120.0
CANCEL_POLL_S = 0.05  # how often a long execution checks whether its callers went away
HOST_CALL_THREADS = 16  # BLS / model-loading calls of one instance served at once
# How long the model's is_ready() may take before the check counts as not ready (Triton's
# python_backend: 5 s); the config parameter `is_ready_timeout_s` changes it.
IS_READY_TIMEOUT_S = 5.0
_CONTEXT = CONTEXT  # spawn (no fork of a threaded server), lean: launch.py
_EOF = ("eof",)


class StreamCancelled(Exception):
    """The model cancelled its BLS call to a decoupled model (ResponseIterator.cancel)."""


class StreamNotRead(Exception):
    """A model left its BLS call's responses unread (STREAM_READ_WAIT_S): the call fails."""


# As the server's streams (services/inference.py DECOUPLED_READER_WAIT_S): a reader that takes
# nothing for this long while responses wait has stopped reading.
STREAM_READ_WAIT_S = 10.0
# Responses of a BLS call to a decoupled model sent to the model process and not yet taken
# from its ResponseIterator: the model process grants more as it takes them (channel.py's
# Stream), so a model that iterates slowly, or stops, holds no more than this many there.
STREAM_WINDOW = 32


class _Credits:
    """How many more responses of one BLS stream the model process may be sent unread."""

    def __init__(self, window: int) -> None:
        self._left = window
        self._closed = False
        self._changed = threading.Condition()

    def take(self, wait_s: float) -> bool:
        """Wait for room for one response; False once closed (cancelled, process gone).
        StreamNotRead when the model took none for `wait_s`."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._left > 0 or self._closed, wait_s):
                raise StreamNotRead(
                    f"the model read none of this BLS call's responses for {wait_s:g} s while "
                    f"{STREAM_WINDOW} waited; the call is cancelled"
                )
            if self._closed:
                return False
            self._left -= 1
            return True

    def give(self, count: int) -> None:
        with self._changed:
            self._left += count
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


class PythonInstance(InstanceBase):
    """One worker process running TritonPythonModel."""

    runs_inline = False  # the work happens in another process: never block the event loop on it
    starts_on_loop = True  # but the loop may start it and read the answer (`start_requests`)
    wants_requests = True  # execute() gets each request with its id, flags, parameters

    def __init__(self, spec: InstanceSpec, metrics: MetricStore | None = None) -> None:
        self._spec = spec
        self._metrics = metrics or MetricStore()
        self._held: dict[str, int] = {}  # metric families this instance's model holds
        self._held_lock = threading.Lock()  # the reader thread changes it, a scrape reads it
        self._send_lock = threading.Lock()
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._calls = ThreadPoolExecutor(HOST_CALL_THREADS, f"bls-{spec.instance_name}")
        self._cancelled_streams: set[int] = set()
        self._credits: dict[int, _Credits] = {}  # BLS streams going on, by call id
        self._credits_lock = threading.Lock()
        # Decoupled requests the model goes on answering after execute() returned, by tag.
        self._pending: dict[int, tuple[Emit, Future[None]]] = {}
        self._pending_lock = threading.Lock()
        self._tags = itertools.count(1)
        try:
            self._timeout_s = float(spec.parameters.get("execute_timeout_s", "") or 0)
        except ValueError:
            raise ModelLoadError(
                f"model '{spec.model_name}': parameter execute_timeout_s must be a number of "
                "seconds"
            ) from None
        try:
            self._ready_timeout_s = float(
                spec.parameters.get("is_ready_timeout_s", "") or IS_READY_TIMEOUT_S
            )
        except ValueError:
            raise ModelLoadError(
                f"model '{spec.model_name}': parameter is_ready_timeout_s must be a number of "
                "seconds"
            ) from None
        self.asks_readiness = False  # the model defines is_ready(): told once it started
        self._ready_lock = threading.Lock()  # one is_ready() asked at a time
        self._ready_answers: dict[int, queue.SimpleQueue[tuple[bool, str | None]]] = {}
        # Given by the server: did every caller of the execution in hand go away?
        self._cancel_check: CancelCheck | None = None
        # interrupt() was called: the process is gone for good, no restart.
        self._interrupted = False
        self._process_lock = threading.Lock()  # interrupt() comes from another thread
        self._cancelled = _CONTEXT.Value("b", 0, lock=False)  # what request.is_cancelled() reads
        self._arena = Arena("in")
        self._reader = Reader()
        self._process: Any = None
        self._connection: Any = None
        self._link: Link | None = None
        # The answers of executions the event loop started, read by the loop (`_on_loop`).
        self._loop_link: Link | None = None
        self._loop: Any = None  # that loop, once it started one
        self._registered: Link | None = None  # the loop link the loop's reader watches
        self._call: _LoopCall | None = None  # the execution the loop started, until answered
        self._ticker: Any = None  # the loop's CANCEL_POLL_S timer while `_call` runs
        self._start()

    def _args(self) -> dict[str, str]:
        spec = self._spec
        return {
            "model_config": json.dumps(spec.model_config or {}),
            "model_instance_kind": "CPU" if spec.kind != "KIND_GPU" else "GPU",
            "model_instance_name": spec.instance_name,
            "model_instance_device_id": str(spec.device_id),
            "model_repository": str(spec.model_path.parent.parent),
            "model_version": str(spec.model_version),
            "model_name": spec.model_name,
        }

    def _start(self) -> None:
        from edge_backends.python import worker

        parent, child = _CONTEXT.Pipe()
        # The request link's pipes: requests in, answers out to the waiting thread, answers
        # out to the event loop (its reader stays registered: `start_requests`).
        requests_in, requests = _CONTEXT.Pipe(duplex=False)
        answers, answers_out = _CONTEXT.Pipe(duplex=False)
        loop_answers, loop_answers_out = _CONTEXT.Pipe(duplex=False)
        ends = (requests_in, answers_out, loop_answers_out)
        process = _CONTEXT.Process(
            target=worker.main,
            args=(
                child,
                ends,
                str(self._spec.model_path),
                self._args(),
                self._spec.model_name,
                self._cancelled,
            ),
            name=f"python-model-{self._spec.instance_name}",
            daemon=True,
        )
        with self._process_lock:
            if self._interrupted:
                for end in (parent, child, requests, answers, loop_answers, *ends):
                    end.close()
                raise ModelLoadError(f"Python model '{self._spec.model_name}' was stopped")
            self._process = process
            process.start()
        child.close()
        for end in ends:
            end.close()
        self._connection = parent
        self._link = Link(answers, requests)
        self._loop_link = Link(loop_answers)
        inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._inbox = inbox
        threading.Thread(
            target=self._pump,
            args=(parent, inbox),
            name=f"python-model-reader-{self._spec.instance_name}",
            daemon=True,
        ).start()
        try:
            kind, *detail = inbox.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            self._kill()
            raise ModelLoadError(
                f"Python model '{self._spec.model_name}' did not start in time"
            ) from None
        if kind == "eof":
            process.join(2)  # the pipe closes a moment before the exit is reaped
            code = process.exitcode
            self._kill()
            raise ModelLoadError(
                f"Python model '{self._spec.model_name}' worker exited during initialize "
                f"(exit code {code})"
            )
        if kind != "ready":
            self._kill()
            raise ModelLoadError(f"Python model '{self._spec.model_name}' failed: {detail[0]}")
        self.asks_readiness = bool(detail[0])

    def _send(self, *message: Any) -> None:
        with self._send_lock:
            self._connection.send(message)

    def _pump(self, connection: Any, inbox: queue.SimpleQueue[tuple[Any, ...]]) -> None:
        """The process's messages: calls answered, everything else to `inbox`; ends at EOF."""
        try:
            while True:
                message = connection.recv()
                if message[0].startswith("stream_"):
                    self._stream_message(*message)
                    continue
                if message[0] == "readiness":  # the model's is_ready() answered
                    answers = self._ready_answers.get(message[1])
                    if answers is not None:  # else: the check had timed out
                        answers.put((message[2], message[3]))
                    continue
                if message[0] == "log":  # a line of the model's (pb_logging.ChannelHandler)
                    _, level, text = message
                    _model_log.log(level, "python model '%s': %s", self._spec.model_name, text)
                    continue
                if message[0] != "call":
                    inbox.put(message)
                    continue
                _, call_id, operation, *arguments = message
                if operation.startswith("metric_"):
                    self._answer_metric(connection, call_id, operation, arguments)
                elif operation == "cancel":
                    self._cancelled_streams.add(arguments[0])
                    self._stream_credits(arguments[0], close=True)
                elif operation == "credit":  # the model took responses of a BLS stream
                    self._stream_credits(arguments[0], give=arguments[1])
                else:
                    self._calls.submit(self._answer_call, connection, call_id, operation, arguments)
        except (EOFError, OSError):
            pass
        finally:
            self._fail_pending("the Python model's process exited before its last response")
            with self._credits_lock:
                streams = list(self._credits.values())
            for credits in streams:  # a BLS stream's thread waiting to send stops
                credits.close()
            inbox.put(_EOF)

    def _stream_credits(self, call_id: int, give: int = 0, close: bool = False) -> None:
        with self._credits_lock:
            credits = self._credits.get(call_id)
        if credits is not None:
            if close:
                credits.close()
            else:
                credits.give(give)

    def _stream_message(self, kind: str, tag: int, *payload: Any) -> None:
        """A decoupled request's response, final flag or failure (from the reader thread)."""
        with self._pending_lock:
            entry = self._pending.get(tag)
            if entry is not None and kind != "stream_response":
                del self._pending[tag]
        if entry is None:  # cancelled, or failed with its process
            return
        emit, pending = entry
        with contextlib.suppress(InvalidStateError):  # cancelled meanwhile
            if kind == "stream_response":
                emit(unpack(payload[0]))
            elif kind == "stream_done":
                pending.set_result(None)
            else:
                pending.set_exception(_failure(list(payload)))

    def _fail_pending(self, reason: str) -> None:
        with self._pending_lock:
            entries, self._pending = list(self._pending.values()), {}
        for _, pending in entries:
            with contextlib.suppress(InvalidStateError):
                pending.set_exception(ExecutionError(reason))

    def _cancel_stream(self, tag: int, pending: Future[None]) -> None:
        """The client went away: the model's request.is_cancelled() says so from now on."""
        if not pending.cancelled():
            return
        with self._pending_lock:
            self._pending.pop(tag, None)
        self._reply(self._connection, "cancel", tag)

    def _reply(self, connection: Any, *message: Any) -> None:
        with self._send_lock:
            # Not to a process since replaced; a process that is gone: its execution says so.
            if connection is self._connection:
                with contextlib.suppress(OSError, ValueError):
                    connection.send(message)

    def _answer_metric(self, connection: Any, call_id: int, operation: str, arguments: Any) -> None:
        try:
            with self._held_lock:
                result = answer(self._metrics, self._held, operation, arguments)
        except MetricError as exc:
            self._reply(connection, "reply", call_id, False, str(exc))
            return
        self._reply(connection, "reply", call_id, True, result)

    def _answer_call(self, connection: Any, call_id: int, operation: str, arguments: Any) -> None:
        """A BLS or model-loading call, on the instance's call pool."""
        host = self._spec.host
        try:
            if host is None:
                raise ExecutionError("this server offers models no BLS or model loading")
            if operation == "infer":
                result: Any = pack(dict(host.infer(_host_request(arguments))))
            elif operation == "infer_stream":
                credits = _Credits(STREAM_WINDOW)
                with self._credits_lock:
                    self._credits[call_id] = credits

                def emit(outputs: Outputs) -> None:
                    # Held while the model process has STREAM_WINDOW responses unread.
                    if not credits.take(STREAM_READ_WAIT_S) or call_id in self._cancelled_streams:
                        raise StreamCancelled("the model cancelled the request")
                    self._reply(connection, "item", call_id, outputs)

                try:
                    host.infer_stream(_host_request(arguments), emit)
                finally:
                    self._cancelled_streams.discard(call_id)
                    with self._credits_lock:
                        self._credits.pop(call_id, None)
                result = None
            elif operation == "load_model":
                name, config, files = arguments
                host.load_model(name, config, files)
                result = None
            elif operation == "unload_model":
                host.unload_model(*arguments)
                result = None
            elif operation == "is_model_ready":
                result = host.is_model_ready(*arguments)
            else:
                raise ExecutionError(f"unknown call '{operation}'")
        except StreamCancelled:
            result = None
        except Exception as exc:  # any failure is the model's to handle, as in Triton
            self._reply(connection, "reply", call_id, False, str(exc) or type(exc).__name__)
            return
        self._reply(connection, "reply", call_id, True, result)

    def ready(self) -> bool:
        """The model's is_ready(), sync or async, when it defines one: True only when it
        returned True within is_ready_timeout_s; False (with a log line) when it returned
        False, raised, returned something else or took longer. One is asked at a time: a
        caller that comes meanwhile waits for its turn within the same timeout. Without
        is_ready(), ready while the process lives (nothing is sent)."""
        process = self._process
        if process is None or not process.is_alive():
            return False
        if not self.asks_readiness:
            return True
        name = self._spec.model_name
        deadline = time.monotonic() + self._ready_timeout_s
        if not self._ready_lock.acquire(timeout=self._ready_timeout_s):
            log.warning(
                "Python model '%s' instance %s: not ready: is_ready() still running after "
                "%g s (is_ready_timeout_s)",
                name,
                self._spec.instance_name,
                self._ready_timeout_s,
            )
            return False
        call_id = next(self._tags)
        answers: queue.SimpleQueue[tuple[bool, str | None]] = queue.SimpleQueue()
        self._ready_answers[call_id] = answers
        try:
            self._send("is_ready", call_id)
            ready, error = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            late = f"is_ready() did not return within {self._ready_timeout_s:g} s"
            ready, error = False, f"{late} (is_ready_timeout_s)"
        except (OSError, ValueError):
            ready, error = False, "its process is gone"
        finally:
            self._ready_answers.pop(call_id, None)
            self._ready_lock.release()
        if error is not None:
            log.warning(
                "Python model '%s' instance %s: not ready: %s",
                name,
                self._spec.instance_name,
                error,
            )
        elif not ready:
            log.info(
                "Python model '%s' instance %s: is_ready() returned False",
                name,
                self._spec.instance_name,
            )
        return ready

    def custom_metrics(self) -> Sequence[CustomMetricFamily]:
        with self._held_lock:
            names = list(self._held)
        return self._metrics.snapshot(names)

    def _release_metrics(self) -> None:
        with self._held_lock:
            held, self._held = self._held, {}
        for name, holds in held.items():
            for _ in range(holds):
                self._metrics.release_family(name)

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Outputs:
        (answer,) = self.execute_requests(inputs, output_names, ())
        if isinstance(answer, BackendError):
            raise answer
        return answer

    def execute_requests(
        self, inputs: Arrays, output_names: Sequence[str], requests: Sequence[RequestInfo]
    ) -> list[Outputs | BackendError]:
        """The batch's requests reach execute() as a list, each with its own rows; each
        response comes back on its own (its outputs' names are prefixed with its index)."""
        kind, payload = self._exchange(inputs, output_names, list(requests), None)
        return self._answers(kind, payload, len(requests))

    def _answers(self, kind: str, payload: list[Any], count: int) -> list[Outputs | BackendError]:
        """Each request's outputs or error from an execution's answer; raises its failure."""
        if kind == "failed":
            raise _failure(payload)
        arena, out_metas, errors = payload
        answers: list[Outputs | BackendError] = [{} for _ in range(max(1, count))]
        for key, array in self._reader.read(arena, out_metas, copy=True).items():
            index, name = key.split(":", 1)
            answer = answers[int(index)]
            assert isinstance(answer, dict)
            answer[name] = array
        for index, message, code in errors:
            answers[index] = ResponseError(message, code=code)
        return answers

    def start_requests(
        self,
        loop: Any,
        inputs: Arrays,
        output_names: Sequence[str],
        requests: Sequence[RequestInfo],
        done: Done,
    ) -> bool:
        """`execute_requests` from the event loop: the execute message goes out on the link
        and the model process answers on the loop's own pipe, whose reader stays registered
        (`_on_loop`): no instance thread, no hand-off."""
        link, loop_link = self._link, self._loop_link
        if link is None or loop_link is None or loop_link.closed:
            return False  # the process is gone: the instance's thread restarts it
        if self._registered is not loop_link:
            self._loop = loop
            loop.add_reader(loop_link.fileno(), self._on_loop, loop_link)
            self._registered = loop_link
        metas = self._arena.write(dict(inputs))
        self._cancelled.value = 0
        try:
            link.send(
                "execute", self._arena.name, metas, list(output_names), None,
                _fields(requests), True,
            )  # fmt: skip
        except OSError:  # the process is gone: the instance's thread restarts it
            return False
        self._call = _LoopCall(self, len(requests), done)
        if self._ticker is None:
            self._ticker = loop.call_later(CANCEL_POLL_S, self._tick)
        return True

    def _on_loop(self, loop_link: Link) -> None:
        """The loop's pipe is readable: the answer of `_call`, or a call of its model."""
        call = self._call
        try:
            loop_link.feed()
        except (EOFError, OSError):
            self._unregister(loop_link)
            if call is not None and call.link is loop_link:
                self._call = None
                call.gone()
            return
        while (message := loop_link.take()) is not None:
            if call is None or call.link is not loop_link:
                continue  # (none: every message answers the execution in hand)
            kind, *payload = message
            if kind == "call":  # from the model's execute(), on its main thread
                link = self._link
                assert link is not None
                if payload[1].startswith("metric_"):
                    self._answer_inline(link, *payload)
                else:  # BLS blocks on the server: a call thread answers it
                    self._calls.submit(self._answer_off_loop, link, *payload)
                continue
            self._call = None
            try:
                result: Any = self._answers(kind, payload, call.count)
            except Exception as exc:  # the model's failure
                result = exc
            call.done(result)
            call = None

    def _unregister(self, loop_link: Link) -> None:
        """On the loop: stop watching a loop link, and close it (only the loop closes one it
        watched: a descriptor is never closed under its reader)."""
        if self._registered is loop_link:
            self._registered = None
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                self._loop.remove_reader(loop_link.fileno())
        loop_link.close()

    def _retire(self, loop_link: Link | None) -> None:
        """A replaced or closed process's loop link: closed on the loop if it watches it."""
        if loop_link is None:
            return
        loop = self._loop
        if loop is None:
            loop_link.close()
            return
        try:
            loop.call_soon_threadsafe(self._unregister, loop_link)
        except RuntimeError:  # the loop is closed: nothing watches it any more
            loop_link.close()

    def _tick(self) -> None:
        """Every CANCEL_POLL_S while the loop's execution runs: its callers still there, its
        execute_timeout_s."""
        call = self._call
        if call is None:
            self._ticker = None
            return
        check = self._cancel_check
        if check is not None and check():
            self._cancelled.value = 1  # the model sees request.is_cancelled()
        if self._timeout_s and time.monotonic() - call.started > self._timeout_s:
            self._call = None
            call.off_loop(self._timed_out)
        self._ticker = self._loop.call_later(CANCEL_POLL_S, self._tick)

    def execute_decoupled(
        self,
        inputs: Arrays,
        output_names: Sequence[str],
        emit: Emit,
        request: RequestInfo | None = None,
    ) -> Pending | None:
        """Run one request of a decoupled model; `emit` gets each response as it arrives (on
        the reader thread). Returns once the model's execute() returned: a Pending while the
        model still answers (from a thread or a coroutine), as Triton frees the instance then."""
        tag = next(self._tags)
        pending: Future[None] = Future()  # left PENDING: a client that goes away cancels it
        with self._pending_lock:
            self._pending[tag] = (emit, pending)
        try:
            kind, payload = self._exchange(inputs, output_names, [request or RequestInfo()], tag)
        except BaseException:
            with self._pending_lock:
                self._pending.pop(tag, None)
            raise
        if kind == "failed":  # execute() raised
            with self._pending_lock:
                self._pending.pop(tag, None)
            raise _failure(payload)
        if not pending.done():
            pending.add_done_callback(lambda done: self._cancel_stream(tag, done))
            return pending
        error = None if pending.cancelled() else pending.exception()
        if error is not None:
            raise error
        return None

    def _exchange(
        self,
        inputs: Arrays,
        output_names: Sequence[str],
        requests: list[RequestInfo],
        tag: int | None,
    ) -> tuple[str, list[Any]]:
        """Send one execute message (`tag`: a decoupled request's); serve BLS calls until
        execute() returned (decoupled) or its result came back."""
        metas = self._arena.write(dict(inputs))
        self._cancelled.value = 0
        started = time.monotonic()
        link = self._link
        told = False
        try:
            if link is None:
                raise EOFError
            link.send(
                "execute", self._arena.name, metas, list(output_names), tag, _fields(requests),
                False,
            )  # fmt: skip
            while True:
                if not link.poll(CANCEL_POLL_S):
                    if self._cancel_check is not None and self._cancel_check():
                        if tag is None:
                            self._cancelled.value = 1  # the model sees request.is_cancelled()
                        elif not told:
                            told = True
                            self._send("cancel", tag)
                    if self._timeout_s and time.monotonic() - started > self._timeout_s:
                        raise self._timed_out()
                    continue
                kind, *payload = link.recv()
                if kind == "call":  # from the model's execute(), on its main thread
                    self._answer_inline(link, *payload)
                    continue
                return kind, payload
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            raise self._gone() from None

    def _gone(self) -> ExecutionError:
        """The process ended under an execution: restart it (blocking) unless stopped; the
        execution's error."""
        if self._interrupted:
            return ExecutionError(
                "the Python model's process was stopped while executing (the server was "
                "unloading it)"
            )
        code = None
        if self._process is not None:
            self._process.join(2)  # the pipe closes a moment before the exit is reaped
            code = self._process.exitcode
        self._restart()
        return ExecutionError(
            f"the Python model's process exited while executing (exit code {code}); "
            "it was restarted"
        )

    def _timed_out(self) -> ExecutionError:
        self._restart()
        return ExecutionError(
            f"the Python model did not answer within execute_timeout_s "
            f"({self._timeout_s:g} s); its process was restarted"
        )

    def _answer_inline(self, link: Link, call_id: int, operation: str, *arguments: Any) -> None:
        """A BLS `infer` or metric call of the execution in hand, on the instance thread."""
        try:
            if operation.startswith("metric_"):
                with self._held_lock:
                    result = answer(self._metrics, self._held, operation, arguments)
            elif operation == "infer":
                if self._spec.host is None:
                    raise ExecutionError("this server offers models no BLS or model loading")
                result = pack(dict(self._spec.host.infer(_host_request(arguments))))
            else:
                raise ExecutionError(f"unknown call '{operation}'")
        except Exception as exc:  # any failure is the model's to handle, as in Triton
            link.send("reply", call_id, False, str(exc) or type(exc).__name__)
            return
        link.send("reply", call_id, True, result)

    def _answer_off_loop(self, link: Link, *payload: Any) -> None:
        """`_answer_inline` on a call thread: a process gone meanwhile is the loop's to see."""
        with contextlib.suppress(OSError):
            self._answer_inline(link, *payload)

    def _restart(self) -> None:
        self._kill()
        self._reader.close()
        self._arena.close()  # the old process unlinked its name: the new one gets a fresh arena
        self._release_metrics()  # the fresh process's initialize() makes its own again
        if self._interrupted:
            return
        try:
            self._start()
            log.warning(
                "Python model '%s' instance %s restarted",
                self._spec.model_name,
                self._spec.instance_name,
            )
        except ModelLoadError as exc:
            log.error("Python model '%s' could not be restarted: %s", self._spec.model_name, exc)

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        if self._process is not None:
            self._process.join(5)
        if self._connection is not None:
            self._connection.close()
        if self._link is not None:
            self._link.close()
        self._retire(self._loop_link)
        self._loop_link = None

    def set_cancel_check(self, check: CancelCheck) -> None:
        self._cancel_check = check

    def interrupt(self) -> bool:
        """End the worker process: the execution waiting on it fails at once, and no fresh
        process replaces it. Safe from any thread."""
        with self._process_lock:
            self._interrupted = True
            process = self._process
        if process is not None and process.is_alive():
            process.kill()
        return True

    def close(self) -> None:
        try:
            if self._process is not None and self._process.is_alive() and self._link:
                self._link.send("finalize")
                self._process.join(10)
        except (OSError, EOFError):
            pass
        self._kill()
        self._reader.close()
        self._arena.close()
        self._calls.shutdown(wait=False, cancel_futures=True)
        self._release_metrics()
        self._fail_pending("the model was unloaded before its last response")


class PythonBackend(BackendBase):
    """`backend: "python"` with `model.py` in the version folder."""

    name = "python"
    # Each instance is a process of its own: they start at once (tritonserver's Python backend
    # loads a model's instances in parallel).
    parallel_instances = True

    def __init__(self) -> None:
        self.metrics = MetricStore()  # every Python model's custom metrics, as in Triton

    def inspect(self, model_path: Path) -> ModelSignature:
        if not model_path.is_file():
            raise ModelLoadError(f"model file '{model_path}' does not exist")
        return ModelSignature(inputs=(), outputs=())  # the config says what the model takes

    def create_instance(self, spec: InstanceSpec) -> PythonInstance:
        return PythonInstance(spec, self.metrics)

    def auto_complete(
        self, model_path: Path, config: dict[str, Any], default_max_batch_size: int
    ) -> dict[str, Any] | None:
        """Run the model's static auto_complete_config (in a short-lived process); the model
        sets its own max_batch_size there (a Python model gets no server default, as in Triton).

        Skipped when model.py never names it and the config already lists tensors; a config
        without any runs it anyway, as the hook may come from a module model.py imports."""
        text = model_path.read_text(encoding="utf-8", errors="replace")
        lists_tensors = bool(config.get("input") or config.get("output"))
        if "auto_complete_config" not in text and lists_tensors:
            return None
        from edge_backends.python import worker

        parent, child = _CONTEXT.Pipe()
        process = _CONTEXT.Process(
            target=worker.auto_complete, args=(child, str(model_path), config)
        )
        process.start()
        child.close()
        try:
            if not parent.poll(START_TIMEOUT_S):
                raise ModelLoadError(f"auto_complete_config of '{model_path}' did not finish")
            kind, result = parent.recv()
        except EOFError:
            raise ModelLoadError(
                f"auto_complete_config of '{model_path}' crashed its process"
            ) from None
        finally:
            process.join(5)
            if process.is_alive():
                process.kill()
        if kind != "ok":
            raise ModelLoadError(f"auto_complete_config of '{model_path}' failed: {result}")
        return dict(result)

    def gpu_problem(self) -> str:
        return "Python models run on CPU here"


class _LoopCall:
    """One execution the event loop started (`PythonInstance.start_requests`), until its
    answer: `done` is called on the loop, once. A process that dies or runs out of time is
    restarted on a thread of its own (it blocks), and the execution fails after."""

    __slots__ = ("count", "done", "instance", "link", "started")

    def __init__(self, instance: PythonInstance, count: int, done: Done) -> None:
        self.instance = instance
        self.link = instance._loop_link
        self.count = count
        self.done = done
        self.started = time.monotonic()

    def gone(self) -> None:
        """The process's end of the loop's pipe closed: the execution fails (after the
        restart, unless the process was stopped)."""
        if self.instance._interrupted:
            self.done(self.instance._gone())
            return
        self.off_loop(self.instance._gone)

    def off_loop(self, failure: Callable[[], ExecutionError]) -> None:
        loop, done = self.instance._loop, self.done

        def restart() -> None:
            error: BaseException
            try:
                error = failure()
            except Exception as exc:
                error = exc
            with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
                loop.call_soon_threadsafe(done, error)

        threading.Thread(target=restart, name="python-model-restart", daemon=True).start()


def _fields(requests: Sequence[RequestInfo]) -> list[tuple[Any, ...]]:
    """Request infos as the model process rebuilds them (RequestInfo(*fields))."""
    return [
        (r.request_id, r.correlation_id, r.flags, r.parameters, r.timeout_us,
         r.output_names, r.batch_size, r.ragged_shapes)
        for r in requests
    ]  # fmt: skip


def _host_request(arguments: Sequence[Any]) -> HostRequest:
    model, version, inputs, outputs, request_id, parameters = arguments
    return HostRequest(
        model_name=model,
        inputs=unpack(inputs),
        output_names=outputs,
        model_version=version,
        request_id=request_id,
        parameters=parameters,
    )


def _failure(payload: list[Any]) -> ExecuteRaised:
    """The model's failure: its message, and its TritonError code when it gave one."""
    code = str(payload[1]) if len(payload) > 1 else None
    return ExecuteRaised(str(payload[0]), code=code)
