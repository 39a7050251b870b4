"""A server-wide bound on the gRPC calls in flight (`--grpc-max-concurrent-rpcs`).

The HTTP side caps its connections; gRPC multiplexes calls over few connections, so the cap is
on calls: past it a call is answered UNAVAILABLE at once, with the limit and the flag in the
message. Health calls (ServerLive, ServerReady, ModelReady) are never refused, so that a
monitor does not take a busy server for a dead one. A ModelStreamInfer stream is one call for
as long as it is open; the requests in flight on it are bounded by the stream itself
(frontends/grpc/server.py, STREAM_MAX_IN_FLIGHT).

The servicer's one wrapper per method (frontends/grpc/server.py) takes and gives back the slot.
Issue 20 moved it there from a grpc.aio ServerInterceptor, which had to turn every unary
handler into its request-streaming form to count a call before its message arrived: that form
costs grpc.aio a second receive operation and an async generator per call, measured 30 us of
CPU per `simple` ModelInfer on this machine's core (556 -> 524 us, 6%, medians of 4 interleaved
runs). A unary call now counts from the moment its message is in, so a refused call's message
has been received; a call cancelled before its message arrived never takes a slot. The memory
that costs, bench/grpc_memory.py (256 clients, 588 KiB, 15 s, one run each): peak 696 MiB
against 674 with the interceptor, back to idle within 5 s either way. Since the synchronous
server (issue 20) the slot is taken and given back on the call's handler thread, under a lock;
`StreamSlots` bounds ModelStreamInfer streams apart: each holds a handler thread for its life.

Measured with bench/grpc_memory.py (588 KiB requests, 15 s; RSS peak from 146-154 MiB idle),
when the bound was counted before the message: 256 clients, no bound: 1,073 MiB before the
heap trimmer (appliance/ops/memory.py), 928 with it; with the bound of 64: 764. gRPC's own
`maximum_concurrent_rpcs` would count health calls too and answers RESOURCE_EXHAUSTED
"Concurrent RPC limit exceeded!" without naming the flag.
"""

from __future__ import annotations

import threading

from appliance.common.errors import ApplianceError, ErrorCode, ServerUnavailable

NEVER_REFUSED = frozenset({"ServerLive", "ServerReady", "ModelReady"})


class _Slots:
    """`limit` slots taken and given back from the calls' handler threads (under a lock);
    `_refusal` is the error for one past the limit."""

    __slots__ = ("_lock", "in_flight", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._lock = threading.Lock()

    def take(self) -> None:
        """A slot, or the refusal at once; give it back with `give_back` when done."""
        with self._lock:
            if self.in_flight < self.limit:
                self.in_flight += 1
                return
        raise self._refusal()

    def give_back(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def _refusal(self) -> ApplianceError:
        raise NotImplementedError


class CallBound(_Slots):
    """Refuse calls past `limit` in flight (0: no limit) with UNAVAILABLE, at once."""

    __slots__ = ("_flag",)

    def __init__(self, limit: int, flag: str = "--grpc-max-concurrent-rpcs") -> None:
        super().__init__(limit)
        self._flag = flag

    def counts(self, method: str) -> bool:
        """Whether calls of `method` (its bare name) take a slot."""
        return self.limit > 0 and method not in NEVER_REFUSED

    def _refusal(self) -> ApplianceError:
        return ServerUnavailable(
            f"server busy: {self.limit} gRPC calls in flight, the most "
            f"{self._flag} allows ({self.limit}); retry later"
        )


class TooManyStreams(ApplianceError):
    """A ModelStreamInfer stream past StreamSlots' limit."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class StreamSlots(_Slots):
    """Refuse ModelStreamInfer streams past `limit` open, with RESOURCE_EXHAUSTED at once: on
    the synchronous gRPC server a stream holds a handler thread for its whole life, and the
    calls behind streams that took every thread would hang (frontends/grpc/server.py)."""

    __slots__ = ()

    def _refusal(self) -> ApplianceError:
        return TooManyStreams(
            f"too many ModelStreamInfer streams open: {self.limit}, the most the server's "
            "handler threads allow beside unary calls (--grpc-max-concurrent-rpcs sets the "
            "threads); retry later"
        )
