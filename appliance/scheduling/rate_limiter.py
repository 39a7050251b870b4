"""Triton's rate limiter: instances run only when the resources they name are free.

With `--rate-limit=execution_count`, an instance group's `rate_limiter { resources [...] }`
must be available in the server's pool (`--rate-limit-resource=NAME:COUNT`; a resource the
server does not declare gets the largest count any instance asks for) before a batch runs on
it; the resources are held until the batch finishes. Schedulers that could not start a batch
wait in `rate_limiter.priority` order (lower first) and are woken when resources come back.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping

Resources = Mapping[str, int]


class RateLimiter:
    def __init__(self, enabled: bool, declared: Mapping[str, int] | None = None) -> None:
        self.enabled = enabled
        self._available: dict[str, int] = dict(declared or {})
        self._declared = set(self._available)
        self._waiting: list[tuple[int, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def register(self, resources: Resources) -> None:
        """Make undeclared resources as large as the largest single request for them."""
        for name, count in resources.items():
            if name not in self._declared:
                self._available[name] = max(self._available.get(name, 0), count)

    def try_acquire(self, resources: Resources) -> bool:
        if not self.enabled or not resources:
            return True
        if any(self._available.get(name, 0) < count for name, count in resources.items()):
            return False
        for name, count in resources.items():
            self._available[name] -= count
        return True

    def release(self, resources: Resources) -> None:
        if not self.enabled or not resources:
            return
        for name, count in resources.items():
            self._available[name] += count
        waiting, self._waiting = self._waiting, []
        for _, _, wake in sorted(waiting):
            wake()

    def wait(self, wake: Callable[[], None], priority: int) -> None:
        """Call `wake` (once) when resources are released."""
        heapq.heappush(self._waiting, (priority, next(self._order), wake))

    def available(self, name: str) -> int:
        return self._available.get(name, 0)
