"""A server-wide bound on the gRPC calls in flight (`--grpc-max-concurrent-rpcs`).

The HTTP side caps its connections; gRPC multiplexes calls over few connections, so the cap is
on calls: past it a call is answered UNAVAILABLE at once, before its request message is read,
with the limit and the flag in the message. Health calls (ServerLive, ServerReady, ModelReady)
are never refused, so that a monitor does not take a busy server for a dead one. A
ModelStreamInfer stream is one call for as long as it is open; the requests in flight on it are
bounded by the stream itself (frontends/grpc/server.py, STREAM_MAX_IN_FLIGHT).

Measured with bench/grpc_memory.py (588 KiB requests, 15 s; RSS peak from 146-154 MiB idle):
256 clients, no bound: 1,073 MiB before this change, 928 with the heap trimmer
(appliance/memory.py); with the bound of 64: 764. 512 clients: 1,306 before, 861 with the bound.
The rest of the peak is the refused clients' messages in flight and the connections' buffers.

grpc.aio's own `maximum_concurrent_rpcs` would count health calls too and answers
RESOURCE_EXHAUSTED "Concurrent RPC limit exceeded!" without naming the flag; this interceptor
(grpc.aio's public ServerInterceptor) does the same counting with our rules. To count a call
from its start, whether or not its request ever arrives, every counted handler is turned into
its request-streaming form: grpc.aio calls such a handler as soon as the call starts, and the
handler reads the request itself, after admission (a unary handler would first wait for the
message, and a call cancelled before it arrived would never reach the handler).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from appliance.errors import ServerUnavailable
from appliance.frontends.status import GRPC_STATUS

NEVER_REFUSED = frozenset({"ServerLive", "ServerReady", "ModelReady"})


class AdmissionInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc is untyped
    """Refuse calls past `limit` in flight (0: no limit) with UNAVAILABLE, at once."""

    def __init__(self, limit: int, flag: str = "--grpc-max-concurrent-rpcs") -> None:
        self.limit = limit
        self.in_flight = 0
        self._flag = flag

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or self.limit <= 0:
            return handler
        if details.method.rpartition("/")[2] in NEVER_REFUSED:
            return handler
        if not handler.request_streaming and not handler.response_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.unary_unary),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler  # Triton's service has no unary-stream or stream-unary method

    async def _admit(self, context: grpc.aio.ServicerContext) -> None:
        if self.in_flight >= self.limit:
            await context.abort(
                GRPC_STATUS[ServerUnavailable.code],
                f"server busy: {self.in_flight} gRPC calls in flight, the most "
                f"{self._flag} allows ({self.limit}); retry later",
            )
        self.in_flight += 1

    def _unary(
        self, behavior: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
    ) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], Awaitable[Any]]:
        async def admitted(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> Any:
            await self._admit(context)
            try:
                # Read through the context, not `requests`: that iterator is an async generator
                # in a reference cycle, and left suspended it would hold the request message
                # until the cyclic garbage collector ran (measured: 914 MiB held after a load).
                request = await context.read()
                if request is grpc.aio.EOF:  # the client went away before sending it
                    await context.abort(grpc.StatusCode.CANCELLED, "no request message")
                return await behavior(request, context)
            finally:
                self.in_flight -= 1

        return admitted

    def _stream(
        self,
        behavior: Callable[
            [AsyncIterator[Any], grpc.aio.ServicerContext], AsyncGenerator[Any, None]
        ],
    ) -> Callable[[AsyncIterator[Any], grpc.aio.ServicerContext], AsyncGenerator[Any, None]]:
        async def admitted(
            requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
        ) -> AsyncGenerator[Any, None]:
            await self._admit(context)
            try:
                async with contextlib.aclosing(behavior(requests, context)) as responses:
                    async for response in responses:
                        yield response
            finally:
                self.in_flight -= 1

        return admitted
