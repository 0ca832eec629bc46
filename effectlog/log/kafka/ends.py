"""End offsets shared by the threads that ask at the same time (a group commit for
ListOffsets).

A caller needs the end of the log as it was when it asked, so it needs a request sent after
it arrived. Threads arriving while one is in flight share the next: it asks for every
partition at once, and each caller takes the ends it wanted. A lone caller waits exactly as
long as for its own request; 32 threads pay for a few requests instead of 32 in a row.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable


class EndOffsetRounds:
    """``ends()``: every partition's end offset, from a request sent after the call."""

    def __init__(self, fetch: Callable[[], dict[int, int]]) -> None:
        self._fetch = fetch
        self._cond = threading.Condition()
        self._started = 0  # rounds begun
        self._finished = 0  # the last round that ended
        self._running = False
        self._last: dict[int, int] | BaseException = {}

    def ends(self) -> dict[int, int]:
        with self._cond:
            wanted = self._started + 1  # the first round to begin after this call
            while self._finished < wanted:
                if self._running:
                    self._cond.wait()
                    continue
                self._run_round()
            last = self._last
        if isinstance(last, BaseException):
            raise _own_copy(last)
        return last

    def _run_round(self) -> None:
        """Lead one round (called and returning with the condition held)."""
        self._running = True
        self._started += 1
        number = self._started
        self._cond.release()
        try:
            result: dict[int, int] | BaseException = self._fetch()
        except BaseException as exc:  # handed to every caller of this round, as a copy
            result = exc.with_traceback(None)
        finally:
            self._cond.acquire()
        self._last, self._finished, self._running = result, number, False
        self._cond.notify_all()


def _own_copy(error: BaseException) -> BaseException:
    """A copy of a round's failure for one caller. Raising the stored object itself would
    chain every caller's frames onto its traceback and keep them alive as long as the round
    is the last one: frames holding a RocksDB column family keep that database open and
    locked (a partition taken back after a failed bind to a paused broker stayed locked by
    serve itself)."""
    copied = copy.copy(error)
    copied.__traceback__ = None
    copied.__context__ = copied.__cause__ = None
    return copied
