"""Triton's trace extension: per-request timestamps, sampled, written as JSON lines.

Settings are global, with per-model overrides (`/v2[/models/{m}]/trace/setting`, gRPC
`TraceSetting`): `trace_level` (OFF, TIMESTAMPS, TENSORS or both), `trace_rate` (trace one
request in N),
`trace_count` (stop after N traces; -1 unlimited), `log_frequency` (0: every trace to
`trace_file`; N: the traces to `<trace_file>.0` N at a time, then `.1`, ..., as tritonserver's
--trace-log-frequency, each line written as it comes rather than N at once). `trace_file`
is read-only: only `--trace-file` sets it, at start. As in tritonserver, a network client may
not name a file for the server to append to (the server's user could be made to write anywhere
it may), so a request that names `trace_file` is refused and changes nothing.
Each traced request becomes one line: id, model, version, request id and Triton's timestamp
names (REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START,
COMPUTE_END, REQUEST_END) in monotonic nanoseconds (left out when the level is TENSORS alone).
At level TENSORS the trace's line is followed by one line per tensor, Triton's entry
`{"id", "activity", "tensor": {"name", "data", "shape", "dtype"}}`: TENSOR_QUEUE_INPUT for each
input, TENSOR_BACKEND_OUTPUT for each output, `data` the elements comma-joined as tritonserver
writes them (`tensor_entry`). A tensor adds at most `MAX_TENSOR_ELEMENTS` elements and about
`MAX_TENSOR_CHARS` characters to the file: a larger one is cut, its `data` ending in
`...(truncated: N elements in all)` and its `tensor` holding `"truncated": true`.
Lines are written by a thread of their own.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from appliance.common.errors import InvalidInput, Unsupported

log = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
# What one traced tensor may add to the trace file: its first MAX_TENSOR_ELEMENTS elements, and
# its `data` cut at MAX_TENSOR_CHARS characters (a BYTES element is cut there too).
MAX_TENSOR_ELEMENTS = 1024
MAX_TENSOR_CHARS = 64 * 1024
# One tensor to trace: (activity, name, datatype, shape, array).
TracedTensor = tuple[str, str, str, tuple[int, ...], Any]
KEYS = ("trace_file", "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_mode")


class Tracer:
    """Trace settings, sampling decisions and the trace file writer."""

    def __init__(
        self,
        trace_file: str = "",
        level: str = "OFF",
        rate: int = 1000,
        count: int = -1,
        log_frequency: int = 0,
    ) -> None:
        self._global: dict[str, Any] = {
            "trace_file": trace_file,
            "trace_level": level.split(","),  # "TIMESTAMPS,TENSORS": both levels
            "trace_rate": str(rate),
            "trace_count": str(count),
            "log_frequency": str(log_frequency),
            "trace_mode": "triton",
        }
        # A global setting cleared (null or []) goes back to its value at start, as in
        # tritonserver (its TraceManager keeps the start-up settings as the global default).
        self._startup = dict(self._global)
        self._models: dict[str, dict[str, Any]] = {}
        self._seen: dict[str, int] = {}  # requests seen per model, for trace_rate
        self._remaining: dict[str, int] = {}  # traces left per model, for trace_count
        self._ids = itertools.count(1)
        self._written: dict[str, int] = {}  # traces sent to each trace file, for log_frequency
        self._lines: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._active = self._any_active()

    @property
    def active(self) -> bool:
        """Whether any request may be traced now (`sample` can return an id)."""
        return self._active

    def _any_active(self) -> bool:
        """Whether any setting traces at all: the per-request check is then one attribute."""
        return any(
            _traces(self.settings(model)["trace_level"]) and self.settings(model)["trace_file"]
            for model in ("", *self._models)
        )

    def tensors(self, model: str) -> bool:
        """Whether a sampled request of `model` traces its tensors (level TENSORS)."""
        return "TENSORS" in self.settings(model)["trace_level"]

    # ---- settings ----------------------------------------------------------------------------

    def settings(self, model: str = "") -> dict[str, Any]:
        return {**self._global, **self._models.get(model, {})} if model else dict(self._global)

    def update(self, model: str, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply settings (None or [] clears a model's override, or puts a global setting back
        to its value at start); returns the result. Every
        change is checked before any is applied: a refused request changes nothing."""
        if "trace_file" in changes:
            # tritonserver's words, so clients that match on them keep working.
            raise Unsupported(
                "trace file location can not be updated through network protocol; "
                "start the server with --trace-file"
            )
        checked: dict[str, Any] = {}
        for key, value in changes.items():
            if key not in KEYS:
                raise InvalidInput(f"unknown trace setting '{key}'; known: {', '.join(KEYS)}")
            values = [] if value is None else value if isinstance(value, list) else [value]
            checked[key] = self._checked(key, [str(v) for v in values]) if values else None
        merged = {**self.settings(model), **{k: v for k, v in checked.items() if v is not None}}
        levels = [level for level in merged["trace_level"] if level != "OFF"]
        if levels and merged["trace_mode"] == "triton" and not merged["trace_file"]:
            # tritonserver refuses a setting that would trace with nowhere to write (its words)
            raise InvalidInput(
                "Attempting to set invalid trace setting :trace file name is not given"
            )
        target = self._models.setdefault(model, {}) if model else self._global
        for key, setting in checked.items():
            if setting is None and not model:
                target[key] = self._startup[key]
            elif setting is None:
                target.pop(key, None)
            else:
                target[key] = setting
            if key == "trace_count":
                self._remaining.pop(model, None)
        self._active = self._any_active()
        return self.settings(model)

    @staticmethod
    def _checked(key: str, values: list[str]) -> Any:
        if key == "trace_level":
            bad = [v for v in values if v not in LEVELS]
            if bad:
                raise InvalidInput(f"trace_level {bad}: this server supports {list(LEVELS)}")
            return values
        value = values[0]
        if key in ("trace_rate", "trace_count", "log_frequency"):
            try:
                number = int(value)
            except ValueError:
                raise InvalidInput(f"Unable to parse '{key}', got: {value}") from None
            if (
                (key == "trace_rate" and number < 1)
                or (key == "trace_count" and number < -1)
                or (key == "log_frequency" and number < 0)
            ):
                raise InvalidInput(f"{key} is out of range: {number}")
        return value

    # ---- tracing -----------------------------------------------------------------------------

    def sample(self, model: str) -> int:
        """A trace id when this request of `model` is to be traced, else 0."""
        if not self._active:
            return 0
        effective = self.settings(model)
        if not _traces(effective["trace_level"]) or not effective["trace_file"]:
            return 0
        seen = self._seen.get(model, 0) + 1
        self._seen[model] = seen
        if seen % int(effective["trace_rate"]):
            return 0
        remaining = self._remaining.get(model, int(effective["trace_count"]))
        if remaining == 0:
            return 0
        if remaining > 0:
            self._remaining[model] = remaining - 1
        return next(self._ids)

    def record(
        self,
        trace_id: int,
        model: str,
        version: str,
        request_id: str,
        timestamps: list[tuple[str, int]],
        tensors: Sequence[TracedTensor] = (),
    ) -> None:
        """One sampled request: its line, then (level TENSORS) its tensors' lines."""
        effective = self.settings(model)
        levels = effective["trace_level"]
        head: dict[str, Any] = {
            "id": trace_id,
            "model_name": model,
            "model_version": version,
            "request_id": request_id,
        }
        if "TIMESTAMPS" in levels:
            head["timestamps"] = [{"name": name, "ns": ns} for name, ns in timestamps if ns]
        lines = [json.dumps(head)]
        if "TENSORS" in levels:
            lines.extend(json.dumps(tensor_entry(trace_id, *tensor)) for tensor in tensors)
        line = "\n".join(lines)
        self._ensure_writer()
        path = effective["trace_file"]
        frequency = int(effective["log_frequency"])
        written = self._written.get(path, 0)
        self._written[path] = written + 1
        if frequency > 0:
            path = f"{path}.{written // frequency}"
        self._lines.put((path, line))

    def _ensure_writer(self) -> None:
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="trace-writer", daemon=True)
            self._writer.start()

    def _write(self) -> None:
        files: dict[str, Any] = {}
        try:
            while (item := self._lines.get()) is not None:
                path, line = item
                try:
                    handle = files.get(path)
                    if handle is None:
                        handle = files[path] = open(path, "a", encoding="utf-8")  # noqa: SIM115
                    handle.write(line + "\n")
                    handle.flush()
                except OSError as exc:
                    log.error("cannot write trace file '%s': %s", path, exc.strerror)
        finally:
            for handle in files.values():
                handle.close()

    def close(self) -> None:
        """Write what is queued, then stop the writer (blocking: call from a thread)."""
        if self._writer is not None:
            self._lines.put(None)
            self._writer.join()
            self._writer = None


def _traces(levels: list[str]) -> bool:
    return any(level != "OFF" for level in levels)


def tensor_entry(
    trace_id: int, activity: str, name: str, datatype: str, shape: tuple[int, ...], array: Any
) -> dict[str, Any]:
    """Triton's trace entry for one tensor (its tracer.cc TraceTensorActivity): `data` the
    elements comma-joined, floats as C++ streams write them (6 significant digits), BOOL as
    1 or 0, BYTES each in double quotes, FP16 and BF16 left empty (tritonserver writes none of
    them); INT8 and UINT8 as numbers (tritonserver streams them as characters, which is not
    JSON). Bounded: see MAX_TENSOR_ELEMENTS and MAX_TENSOR_CHARS."""
    total = int(array.size)
    half = datatype in ("FP16", "BF16")
    # `flat[:n]` copies those n elements only, whatever the array's layout
    words = _words(datatype, [] if half else array.flat[:MAX_TENSOR_ELEMENTS].tolist())
    parts: list[str] = []
    size = 0
    for word in words:  # stops once past the bound: a huge tensor is never formatted whole
        parts.append(word)
        size += len(word) + 1
        if size > MAX_TENSOR_CHARS:
            break
    data = ",".join(parts)
    tensor: dict[str, Any] = {
        "name": name,
        "data": data,
        "shape": ",".join(str(dim) for dim in shape),
        "dtype": datatype,
    }
    if not half and (total > len(parts) or len(data) > MAX_TENSOR_CHARS):
        tensor["data"] = f"{data[:MAX_TENSOR_CHARS]}...(truncated: {total} elements in all)"
        tensor["truncated"] = True
    return {"id": trace_id, "activity": activity, "tensor": tensor}


def _words(datatype: str, values: list[Any]) -> Iterator[str]:
    if datatype in ("FP32", "FP64"):
        return (f"{value:g}" for value in values)
    if datatype == "BOOL":
        return ("1" if value else "0" for value in values)
    if datatype == "BYTES":
        return (f'"{_text(value)}"' for value in values)
    return (str(int(value)) for value in values)


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value[:MAX_TENSOR_CHARS]).decode("utf-8", "backslashreplace")
    return str(value)[:MAX_TENSOR_CHARS]
