"""Reading config `parameters` (string values) for a backend, with errors that name the key.

Triton's backends spell booleans differently (openvino_backend: YES / NO, pytorch_backend:
true / false); both spellings are accepted everywhere. Unknown keys are the caller's concern.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from edge_backends.api import ModelLoadError

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def usable_cpu_count() -> int:
    """CPUs this process may run on (cgroup / taskset aware where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def threads_per_instance(instance_count: int) -> int:
    """The default thread budget of one instance: the usable CPUs split between the instances
    (one worker thread each), so they do not fight over the same cores (see edge_backends/ort)."""
    return max(1, usable_cpu_count() // max(1, instance_count))


class Parameters:
    """A model's `parameters` for one backend; every read checks the value."""

    def __init__(self, model: str, backend: str, values: Mapping[str, str]) -> None:
        self._model = model
        self._backend = backend
        self._values = values

    def _error(self, key: str, raw: str, wanted: str) -> ModelLoadError:
        return ModelLoadError(
            f"model '{self._model}': {self._backend} parameter '{key}' must be {wanted}, "
            f"got '{raw}'"
        )

    def raw(self, key: str) -> str | None:
        value = self._values.get(key)
        return None if value is None or value.strip() == "" else value.strip()

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        raw = self.raw(key)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise self._error(key, raw, f"an integer >= {minimum}") from None
        if value < minimum:
            raise self._error(key, raw, f"an integer >= {minimum}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        raw = self.raw(key)
        if raw is None:
            return default
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise self._error(key, raw, "YES / NO (or true / false)")

    def choice(self, key: str, choices: Sequence[str], default: str | None) -> str | None:
        """One of `choices` (case-insensitive, returned as spelled in `choices`)."""
        raw = self.raw(key)
        if raw is None:
            return default
        for choice in choices:
            if raw.upper() == choice.upper():
                return choice
        raise self._error(key, raw, "one of " + ", ".join(choices))

    def unknown(self, known: Sequence[str]) -> list[str]:
        """Keys that this backend does not read (typos, or another backend's names)."""
        return sorted(k for k in self._values if k not in known)
