"""Fresh reads share their end-offsets requests (a group commit for ListOffsets).

A ``?fresh=1`` read must wait for the log end as it was when the read arrived, so it needs
a ListOffsets sent after its arrival. Many reads arriving together need only one: a read
joins the next round, a round starts as soon as the one in flight ends, and each round is
one request for every partition. Under load this turns one ListOffsets per read into one per
round trip to the broker; a lone read waits exactly as long as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class SharedEndOffsets:
    """``await ends()``: every partition's end offset, asked after the call began."""

    def __init__(self, fetch: Callable[[], dict[int, int]]) -> None:
        self._fetch = fetch  # blocking; run in a thread
        self._next: asyncio.Future[dict[int, int]] | None = None
        self._running = False
        self._task: asyncio.Task[None] | None = None  # held: the loop keeps only weak refs

    async def __call__(self) -> dict[int, int]:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._next.add_done_callback(_retrieve)
            if not self._running:
                self._running = True
                self._task = asyncio.ensure_future(self._rounds())
        # shielded: a caller that gives up must not cancel the answer for the others
        return await asyncio.shield(self._next)

    async def _rounds(self) -> None:
        try:
            while self._next is not None:
                round_, self._next = self._next, None  # later callers join the next round
                try:
                    ends = await asyncio.to_thread(self._fetch)
                except Exception as exc:
                    if not round_.done():
                        round_.set_exception(exc)
                else:
                    if not round_.done():
                        round_.set_result(ends)
        finally:
            self._running = False


def _retrieve(future: asyncio.Future[dict[int, int]]) -> None:
    """Mark a round's error as seen when every caller gave up before it came."""
    if not future.cancelled():
        future.exception()
