"""Helpers for tests that send on a gRPC stream without reading its responses."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Counted(Generic[T]):
    """The messages of `source`, counting how many the channel has taken (`pulled`)."""

    def __init__(self, source: Iterable[T]) -> None:
        self._source = source
        self.pulled = 0

    def __iter__(self) -> Iterator[T]:
        for message in self._source:
            self.pulled += 1
            yield message

    def wait_until_stalled(self, total: int, quiet_s: float = 3.0) -> int:
        """How many were taken once taking stalls (none more for `quiet_s`) or all are."""
        last, since = -1, time.monotonic()
        while self.pulled < total and time.monotonic() - since < quiet_s:
            time.sleep(0.2)
            if self.pulled != last:
                last, since = self.pulled, time.monotonic()
        return self.pulled
