"""The partition gate: which events partitions this node serves and how far each is applied.

A partition assigned to the node is *restoring* until its projection has applied the log
end offset seen at assignment, then *serving*; one whose projector met a gap compaction may
have made is *halted* there (:mod:`projections.compaction_guard`) and never serves. Only
serving partitions answer queries, and recovery and reconciliation act only on them
(quix-streams' recovery manager holds the same line). Requests wait here for
read-your-writes: the projector thread reports each applied batch
(:meth:`PartitionGate.applied`), which wakes waiting threads at once and waiting asyncio
tasks through their loop's ``call_soon_threadsafe``, never by polling.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

logger = logging.getLogger(__name__)

Status = Literal["serving", "restoring", "halted"]
#: Called when a partition starts serving: (partition, records restored, seconds taken).
RestoredCallback = Callable[[int, int, float], None]


#: How often a restoring partition's progress is logged (INFO).
PROGRESS_EVERY_S = 5.0


@dataclass(slots=True)
class _Partition:
    start: int      # stored offset at assignment
    target: int     # log end offset seen at assignment
    position: int   # everything below it is applied
    since: float    # monotonic time of the assignment
    serving: bool = False
    reported: float = 0.0  # monotonic time progress was last logged
    halted: str | None = None  # why it never serves here
    pending: bool = False  # being restored from the changelog (in the background)

    @property
    def status(self) -> Status:
        return "halted" if self.halted else "serving" if self.serving else "restoring"


class PartitionGate:
    """Thread-safe partition status and position, with sync and asyncio waits."""

    def __init__(self, on_restored: RestoredCallback | None = None,
                 progress_every_s: float = PROGRESS_EVERY_S) -> None:
        self.on_restored = on_restored
        self.progress_every_s = progress_every_s
        self._parts: dict[int, _Partition] = {}
        self._cond = threading.Condition()
        self._waiters: dict[int, list[tuple[int, asyncio.Future[None]]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the projector's side ------------------------------------------------------------

    def assigned(self, partition: int, position: int, target: int, *,
                 pending: bool = False) -> None:
        """``partition`` is ours, applied up to ``position``; it serves once it reaches
        ``target`` (the log end offset now). A ``pending`` partition is being restored from
        the changelog: it serves only after :meth:`opened`, whatever its position."""
        now = time.monotonic()
        with self._cond:
            self._parts[partition] = _Partition(position, target, position, now, reported=now,
                                                pending=pending)
        if not pending and position >= target:
            self._restored(partition)
        else:
            logger.info("partition %d restoring: %s%d records to apply (offset %d to %d)",
                        partition, "the changelog, then " if pending else "",
                        max(0, target - position), position, target)

    def opened(self, partition: int, position: int) -> None:
        """The pending ``partition``'s restore from the changelog ended: applied up to
        ``position`` (projector thread)."""
        with self._cond:
            part = self._parts.get(partition)
            if part is None:
                return
            part.pending = False
        self.applied(partition, position)

    def applied(self, partition: int, position: int) -> None:
        """Everything of ``partition`` below ``position`` is applied (projector thread)."""
        progress = None
        with self._cond:
            part = self._parts.get(partition)
            if part is None:
                return
            part.position = position
            done = not (part.serving or part.halted or part.pending) and position >= part.target
            if not part.serving and not done:
                now = time.monotonic()
                if now - part.reported >= self.progress_every_s:
                    part.reported = now
                    progress = (part.position - part.start, part.target - part.start,
                                now - part.since)
            self._cond.notify_all()
            wake = bool(self._waiters.get(partition))
        if progress is not None:
            _log_progress(partition, *progress)
        if done:
            self._restored(partition)
        if wake:
            self._notify(partition)

    def halt(self, partition: int, why: str) -> None:
        """``partition`` stops serving for good (until assigned again): ``why``."""
        with self._cond:
            part = self._parts.get(partition)
            if part is None:
                return
            part.halted, part.serving = why, False
            self._cond.notify_all()
            wake = bool(self._waiters.get(partition))
        if wake:
            self._notify(partition)

    def halted(self) -> dict[int, str]:
        """The halted partitions, with why."""
        with self._cond:
            return {p: part.halted for p, part in sorted(self._parts.items()) if part.halted}

    def revoked(self, partition: int) -> None:
        """``partition`` is no longer ours: stop serving it now."""
        with self._cond:
            self._parts.pop(partition, None)
            self._cond.notify_all()
            wake = bool(self._waiters.get(partition))
        if wake:
            self._notify(partition)

    def _notify(self, partition: int) -> None:
        """Wake the partition's waiting coroutines on their loop (from any thread)."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed loop (shutting down): nobody waits
            loop.call_soon_threadsafe(self._wake, partition)

    def _restored(self, partition: int) -> None:
        with self._cond:
            part = self._parts.get(partition)
            if part is None or part.serving or part.halted:
                return
            part.serving = True
            records, took = part.position - part.start, time.monotonic() - part.since
            self._cond.notify_all()
        logger.info("partition %d serving: restored %d records in %.2fs", partition, records,
                    took, extra={"partition": partition, "restored": records})
        if self.on_restored is not None:
            self.on_restored(partition, records, took)

    # -- readers -------------------------------------------------------------------------

    def status(self, partition: int) -> Status | None:
        """``serving``, ``restoring``, ``halted``, or None when the partition is not ours."""
        part = self._parts.get(partition)
        return None if part is None else part.status

    def serving(self) -> list[int]:
        with self._cond:
            return sorted(p for p, part in self._parts.items() if part.serving)

    def held(self) -> dict[int, Status]:
        """Every partition of this node with its status."""
        with self._cond:
            return {p: part.status for p, part in sorted(self._parts.items())}

    def position(self, partition: int) -> int | None:
        part = self._parts.get(partition)
        return None if part is None else part.position

    def positions(self) -> dict[int, int]:
        with self._cond:
            return {p: part.position for p, part in sorted(self._parts.items())}

    def restore_left(self, partition: int) -> int:
        """Records a restoring partition still has to apply (0 when serving or not ours)."""
        part = self._parts.get(partition)
        return 0 if part is None or part.serving else max(0, part.target - part.position)

    # -- waits ---------------------------------------------------------------------------

    def _reached(self, partition: int, offset: int) -> bool:
        """Whether a wait for ``offset`` of ``partition`` is over: reached, or never will be
        here (the partition is not ours, or halted)."""
        part = self._parts.get(partition)
        return part is None or part.halted is not None or (
            part.serving and part.position >= offset)

    def wait(self, partition: int, offset: int, timeout_s: float) -> bool:
        """Block until ``partition`` serves with everything below ``offset`` applied.
        False on timeout or when the partition stops being ours."""
        with self._cond:
            self._cond.wait_for(lambda: self._reached(partition, offset), timeout_s)
            part = self._parts.get(partition)
            return part is not None and part.serving and part.position >= offset

    async def wait_async(self, partition: int, offset: int, timeout_s: float) -> bool:
        """:meth:`wait` for a coroutine on one event loop (the HTTP server's)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        with self._cond:
            if self._reached(partition, offset):
                return self.wait(partition, offset, 0)
            future: asyncio.Future[None] = loop.create_future()
            entry = (offset, future)
            self._waiters.setdefault(partition, []).append(entry)
        try:
            await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            pass
        finally:
            with self._cond:
                waiting = self._waiters.get(partition, [])
                if entry in waiting:
                    waiting.remove(entry)
                if not waiting:
                    self._waiters.pop(partition, None)
        return self.wait(partition, offset, 0)

    def _wake(self, partition: int) -> None:
        with self._cond:
            waiting = list(self._waiters.get(partition, []))
            ready = [f for offset, f in waiting if self._reached(partition, offset)]
        for future in ready:
            if not future.done():
                future.set_result(None)


def _log_progress(partition: int, applied: int, total: int, took_s: float) -> None:
    """``partition 3 restoring: 12000 of 41200 records applied (29%), 2400/s, about 12s left``."""
    rate = applied / took_s if took_s > 0 else 0.0
    left = f"about {(total - applied) / rate:.0f}s left" if rate > 0 else "none applied yet"
    logger.info("partition %d restoring: %d of %d records applied (%d%%), %.0f/s, %s",
                partition, applied, total, 100 * applied // max(total, 1), rate, left,
                extra={"partition": partition, "applied": applied, "total": total})
