"""Restores from the changelog on a thread of their own.

A partition a serving node is given may need its projection restored from the changelog
(:mod:`projections.restore`): a read of the whole changelog partition, seconds for a few
hundred thousand keys. Done on the projector thread, inside the group's assignment callback,
it would stop every other partition of the node from being applied (so no verdict is given
for them) and hold up the group's next rebalance until it ends. Kafka Streams moved its
restores to a thread of their own for the same reason; so does this: the projector hands a
partition over here, keeps applying its other partitions, and takes the restored writer back
between two batches (:meth:`BackgroundRestores.finished`). A partition taken away meanwhile
stops its restore (:meth:`BackgroundRestores.cancel`).

Restores run one at a time, oldest first. An unreachable changelog is retried with a pause
that grows to 2 s, for at most ``give_up_s``; what a restore fails with then is raised on
the projector thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from effectlog.errors import BackendUnavailable, WrongLog
from effectlog.log.changelog import ReadStopped
from projections.store import PartitionWriter

logger = logging.getLogger(__name__)

#: Restores ``partition`` (the first argument) until the event (second argument) is set,
#: then raises :class:`~effectlog.log.changelog.ReadStopped`.
RestoreFunction = Callable[[int, threading.Event], PartitionWriter]


@dataclass(slots=True, eq=False)
class RestoreJob:
    """One partition's restore: where its reading resumes, and how it ended."""

    partition: int
    start: int  # the offset the changelog's last checkpoint was published at
    stop: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    writer: PartitionWriter | None = None
    error: BaseException | None = None
    started: bool = False  # taken up by the restore thread (under its lock)


class BackgroundRestores:
    """A queue of partitions to restore and the thread that restores them."""

    def __init__(self, restore: RestoreFunction, give_up_s: float = 300.0) -> None:
        self.restore = restore
        self.give_up_s = give_up_s
        self._jobs: dict[int, RestoreJob] = {}  # the projector thread's: not yet taken back
        self._queue: queue.Queue[RestoreJob | None] = queue.Queue()
        self._lock = threading.Lock()  # a job is either started or stopped before it starts
        self._thread: threading.Thread | None = None

    def submit(self, partition: int, start: int) -> None:
        """Restore ``partition``, whose reading resumes at ``start`` once restored."""
        job = RestoreJob(partition, start)
        self._jobs[partition] = job
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="restore", daemon=True)
            self._thread.start()
        self._queue.put(job)

    def pending(self) -> dict[int, int]:
        """The partitions being restored (or restored and not taken back yet), with the
        offset each resumes at."""
        return {p: job.start for p, job in self._jobs.items()}

    def finished(self) -> list[RestoreJob]:
        """The restores that ended since the last call (each is no longer pending)."""
        done = [job for job in self._jobs.values() if job.done.is_set()]
        for job in done:
            del self._jobs[job.partition]
        return done

    def cancel(self, partitions: Iterable[int]) -> None:
        """Stop the restores of ``partitions`` and wait until none of them writes (only a
        running one can: one still queued never starts, and is not waited for)."""
        jobs = [self._jobs.pop(p) for p in partitions if p in self._jobs]
        with self._lock:
            for job in jobs:
                job.stop.set()
            running = [job for job in jobs if job.started]
        for job in running:
            while not job.done.wait(5.0):
                logger.warning("partition %d: waiting for its restore to stop", job.partition)

    def close(self) -> None:
        """Stop every restore and the thread."""
        self.cancel(list(self._jobs))
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (job := self._queue.get()) is not None:
            with self._lock:
                job.started = not job.stop.is_set()
            try:
                if job.started:
                    job.writer = self._restore(job)
            except ReadStopped:  # its partition went away (revoked, lost, swapped)
                pass
            except BaseException as exc:  # raised again on the projector thread
                job.error = exc
            finally:
                job.done.set()

    def _restore(self, job: RestoreJob) -> PartitionWriter:
        deadline = time.monotonic() + self.give_up_s
        pause = 0.25
        while True:
            try:
                return self.restore(job.partition, job.stop)
            except BackendUnavailable as exc:
                if isinstance(exc, WrongLog) or time.monotonic() + pause > deadline:
                    raise  # a wrong log does not come right by waiting
                logger.warning("partition %d: restore failed (%s); trying again in %.2gs",
                               job.partition, exc, pause)
                if job.stop.wait(pause):
                    raise ReadStopped from exc
                pause = min(2 * pause, 2.0)
