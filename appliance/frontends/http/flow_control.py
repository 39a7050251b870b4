"""Flow control of one fast-path connection, as an object of its own (uvicorn's idea).

Reading is held for named reasons, each until it is released: `pipeline` (more than
PIPELINE_MAX_BYTES wait behind the request being answered), `relay` (aiohttp's payload buffer
is full), `fatal` (a request that cannot be parsed: nothing more is read), `closing`. The
transport reads again once no reason is left. Writing is paused by the transport when the
client does not read; when it paused is what the send-stall timer looks at.
"""

from __future__ import annotations

import asyncio


class FlowControl:
    __slots__ = ("_holds", "transport", "write_paused_at")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None  # set while connected
        self._holds: set[str] = set()
        self.write_paused_at: float | None = None  # loop time the transport paused writing

    def hold(self, reason: str) -> None:
        """Stop reading for `reason` (until `release(reason)`)."""
        if not self._holds and self.transport is not None:
            self.transport.pause_reading()
        self._holds.add(reason)

    def release(self, reason: str) -> None:
        if reason in self._holds:
            self._holds.discard(reason)
            if not self._holds and self.transport is not None:
                self.transport.resume_reading()

    def held_for(self, reason: str) -> bool:
        return reason in self._holds

    def pause_writing(self, now: float) -> None:
        self.write_paused_at = now

    def resume_writing(self) -> None:
        self.write_paused_at = None

    @property
    def writing(self) -> bool:
        return self.write_paused_at is None
