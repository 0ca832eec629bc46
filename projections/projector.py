"""The projector: applies the events partitions assigned to it to a projection store.

It is told which partitions it owns (:meth:`Projector.assigned` / :meth:`Projector.revoked`,
the :class:`~effectlog.log.source.AssignmentListener` protocol): a fixed set (every
partition by default) read with positioned reads, or whatever a Kafka consumer group hands
this process. Each partition resumes at the offset stored in its projection, never at a
consumer-group offset, and one poll batch per partition is applied at a time (see
:class:`projections.store.PartitionWriter`).

Reading, decoding and applying form a short pipeline: while one batch is judged and
written, the next is already read and, when catching up, decoded in a helper process
(:mod:`projections.decoding`). Only applied batches move the stored offsets, so whatever
is in flight when the process dies is simply read again.

When ``follow_swaps`` is on, it notices a rebuild swapping a new projection in and
continues on that one.

On a log with a changelog (Kafka: the events topic is compacted, see
:mod:`effectlog.log.changelog`) a partition whose stored offset is not the changelog's last
checkpoint is restored from the changelog first (:mod:`projections.restore`), and no record
past a stretch compaction may have thinned is applied (:mod:`projections.compaction_guard`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence

from effectlog.errors import BackendUnavailable
from effectlog.log.base import EVENTS, EventLog, Record
from effectlog.log.source import LogSource, RecordSource
from projections.compaction_guard import CompactionGuard, HaltCallback
from projections.decoding import Decoders, InFlight, by_partition
from projections.restore import PartitionOpener
from projections.settings import (
    AppliedCallback,
    DecoderChoice,
    Progress,
    ProgressCallback,
    ProjectorSettings,
)
from projections.store import PartitionWriter, ProjectionStore

__all__ = ["AppliedCallback", "DecoderChoice", "Progress", "ProgressCallback", "Projector",
           "ProjectorSettings", "project"]

logger = logging.getLogger(__name__)

SWAP_CHECK_S = 0.2  # how often a running projector looks for a projection a rebuild swapped in


class Projector:
    """Applies the log's events topic, partition by assigned partition, to ``store``.

    ``store`` is a :class:`ProjectionStore` or a state directory (the RocksDB store);
    ``partitions`` is the fixed assignment used without a consumer group (default: all).
    ``from_changelog`` False replays the events topic alone (a baseline for tests and
    benchmarks: on a compacted topic it is not what a full replay was). ``on_halt`` hears of
    a partition halted before a gap compaction may have made; without it, such a gap raises
    :class:`~projections.compaction_guard.CompactionGap`.
    """

    def __init__(self, log: EventLog, store: ProjectionStore | str | os.PathLike[str],
                 settings: ProjectorSettings | None = None, *, follow_swaps: bool = True,
                 partitions: Iterable[int] | None = None,
                 on_applied: AppliedCallback | None = None, from_changelog: bool = True,
                 on_halt: HaltCallback | None = None, background_restores: bool = False,
                 on_opened: AppliedCallback | None = None) -> None:
        self.log = log
        self.changelog = log.changelog() if from_changelog else None
        self.settings = settings or ProjectorSettings()
        if not isinstance(store, ProjectionStore):
            from projections.rocksdb.store import RocksProjectionStore

            store = RocksProjectionStore(store, self.settings.cache_size)
        self.store = store
        self.follow_swaps = follow_swaps
        self._next_swap_check = 0.0
        self.partitions = None if partitions is None else sorted(set(partitions))
        self.on_applied = on_applied
        self.guard = CompactionGuard(log, on_halt=on_halt,
                                     accept=self.settings.accept_compaction_gaps)
        self._writers: dict[int, PartitionWriter] = {}
        self._cursors: dict[int, int] = {}  # next offset to read, per partition
        self._reached: dict[int, int] = {}  # the source passed these offsets: no records below
        self._source: RecordSource | None = None
        self._inflight: deque[InFlight] = deque()
        self._decoders = Decoders(self.settings.decoder, self.settings.process_decode_min)
        self.on_opened = on_opened
        self.opener = PartitionOpener(store, log, self.changelog, background=background_restores,
                                      gaps_accepted=self.settings.accept_compaction_gaps)

    # -- assignment (effectlog.log.source.AssignmentListener) ----------------------------

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        """Open the projection of ``partitions``; the offset each resumes at. With
        ``background_restores`` a partition restored from the changelog is opened later,
        between two batches (:meth:`restoring` until then; ``on_opened`` hears of it)."""
        pending = self.restoring()
        for partition in partitions:
            if partition not in self._writers and partition not in pending:
                writer = self.opener.open(partition)
                if writer is not None:
                    self._open(partition, writer)
        pending = self.restoring()
        return {p: pending[p] if p in pending else self._writers[p].next_offset
                for p in partitions}

    def restoring(self) -> dict[int, int]:
        """The partitions being restored in the background, with the offset each resumes at."""
        return self.opener.pending()

    def settle(self) -> None:
        """Apply the batches in flight now."""
        self._settle(discard=set())

    def revoked(self, partitions: Sequence[int], *, lost: bool = False) -> None:
        """Let go of ``partitions``: batches in flight are applied first, unless ``lost``
        (another process may own them already), when theirs are dropped."""
        self._settle(discard=set(partitions) if lost else set())
        self.opener.release(partitions)
        for partition in partitions:
            if self._writers.pop(partition, None) is not None:
                logger.info("partition %d %s", partition, "lost" if lost else "revoked")
            for table in (self._cursors, self._reached):
                table.pop(partition, None)
            self.guard.forget(partition)

    def open(self) -> None:
        """Open the fixed assignment (every partition unless ``partitions`` was given)."""
        self.assigned(self._static())
        logger.info("projecting %s", self.log.url)

    def close(self) -> None:
        self.revoked(self.assignment)
        self.opener.close()
        self.store.close()
        self._decoders.drop_helper(failed=False)

    def __enter__(self) -> Projector:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------

    def writers(self) -> dict[int, PartitionWriter]:
        """The partitions whose assignment is complete (opened, and restored when needed),
        by number: what a changelog publisher may publish (any thread)."""
        return self._writers.copy()  # one C call: safe against the projector thread

    @property
    def assignment(self) -> list[int]:
        """The partitions open here now (restoring ones included)."""
        return sorted(self._writers.keys() | self.restoring().keys())

    def next_offsets(self) -> dict[int, int]:
        """The stored next offset of every assigned partition."""
        self._ensure_open()
        return {p: w.next_offset for p, w in sorted(self._writers.items())}

    def lag(self, ends: Mapping[int, int] | None = None) -> dict[int, int]:
        """Records not yet applied, per partition (log end offset minus stored offset)."""
        ends = self.log.end_offsets(EVENTS) if ends is None else ends
        nexts = self.next_offsets()
        return {p: max(0, end - nexts[p]) for p, end in sorted(ends.items()) if p in nexts}

    # -- work ----------------------------------------------------------------------------

    def source(self, until: Mapping[int, int] | None = None) -> LogSource:
        """A started positioned-read source over the fixed assignment (bounded by ``until``)."""
        self._ensure_open()
        source = LogSource(self.log, self.assignment, until=until,
                           empty_reads_before_giving_up=self.settings.empty_reads_before_giving_up)
        source.start(self)
        self._source = source
        return source

    def step(self, source: RecordSource, progress: Progress | None = None) -> int:
        """Keep the pipeline full from ``source`` and apply the oldest batch; records handled."""
        self._source = source
        self._follow_swap()
        self._take_restored()
        self._fill(source)
        if not self._inflight:
            return 0
        batch = self._inflight.popleft()
        try:
            decoded = batch.decoder.receive()
        except BackendUnavailable as exc:
            if batch.decoder is self._decoders.inline:
                raise
            logger.warning("%s; decoding in this process from now on", exc)
            self._decoders.drop_helper(failed=True)
            self._reset_pipeline()
            return 0
        writer = self._writers.get(batch.partition)
        if writer is None:  # revoked meanwhile
            return 0
        if batch.start != writer.next_offset:  # read for a state that is gone: read again
            self._reset_pipeline()
            return 0
        applied = writer.apply(batch.records, decoded)
        self._advance(batch.partition, applied.next_offset)
        if progress is not None:
            progress.records += applied.records
            progress.accepted += applied.accepted
            progress.rejected += applied.rejected
            progress.next_offsets = self.next_offsets()
        return applied.records

    def run(self, *, source: RecordSource | None = None, once: bool = False,
            stop: threading.Event | None = None,
            on_progress: ProgressCallback | None = None) -> Progress:
        """Project until ``stop`` is set; with ``once`` (and no ``source``) until the end
        offsets seen at the start are reached. A stop request takes effect between batches.

        ``source`` (e.g. a consumer group) decides the assignment; the caller has started
        it with a listener that hands assignments on to :meth:`assigned` / :meth:`revoked`.
        By default the fixed assignment is read with positioned reads.
        """
        stop = stop or threading.Event()
        self._next_swap_check = 0.0  # a run starts by looking for a swapped-in projection
        if source is None:
            self._ensure_open()
            ends = self.log.end_offsets(EVENTS)
            source = self.source(until=ends if once else None)
        else:
            ends = {}
        progress = Progress(ends={p: n for p, n in ends.items() if p in self._writers},
                            next_offsets=self.next_offsets() if self._writers else {})
        if progress.total_lag:
            logger.info("projection is %d events behind the log (%s)", progress.total_lag,
                        progress.lag_text)
        if on_progress is not None:
            on_progress(progress)
        reported = time.monotonic()
        while not stop.is_set():
            handled = self.step(source, progress)
            if handled and on_progress is not None:
                on_progress(progress)
            if handled and time.monotonic() - reported >= self.settings.log_every_s:
                reported = time.monotonic()
                logger.info("applied %d events so far; %d behind the log (%s)", progress.records,
                            progress.total_lag, progress.lag_text,
                            extra={"applied": progress.records, "lag": progress.total_lag})
            if once and source.exhausted and not self._inflight:
                break
        self._settle(discard=set())
        progress.next_offsets = {p: w.next_offset for p, w in sorted(self._writers.items())}
        logger.info("projected %d events (%d accepted, %d rejected); lag now %s",
                    progress.records, progress.accepted, progress.rejected,
                    progress.lag_text)
        return progress

    # -- internals -----------------------------------------------------------------------

    def _open(self, partition: int, writer: PartitionWriter) -> None:
        self._writers[partition] = writer
        self._cursors[partition] = writer.next_offset
        self.guard.start(partition, writer.next_offset)
        logger.info("partition %d assigned: resuming at offset %d", partition,
                    writer.next_offset)

    def _take_restored(self) -> None:
        """Open the partitions restored in the background since the last batch."""
        for job in self.opener.finished():
            if job.error is not None:
                raise job.error
            assert job.writer is not None
            self._open(job.partition, job.writer)
            if self._source is not None:
                self._source.seek(job.partition, job.writer.next_offset)
            if self.on_opened is not None:
                self.on_opened(job.partition, job.writer.next_offset)

    def _fill(self, source: RecordSource) -> None:
        """Poll and hand to a decoder until ``pipeline_depth`` batches are in flight."""
        while len(self._inflight) < max(1, self.settings.pipeline_depth):
            wait = 0.0 if self._inflight else self.settings.idle_sleep_s
            fetched = source.poll(self.settings.batch_size, wait)
            self._admit(fetched.records)
            # after the records of the same poll: an end reached first would take them as
            # checked already (the guard's mark moves to the end)
            for partition, offset in fetched.reached.items():
                if partition in self._writers and self.guard.reached(partition, offset):
                    self._reached[partition] = offset
            if not fetched.records:
                self._note_reached()
                return

    def _admit(self, fetched: list[Record]) -> None:
        """Hand what the guard admits of ``fetched`` to a decoder, per partition."""
        for partition, found in by_partition(fetched).items():
            records = self.guard.admit(partition, found)
            start = self._cursors.get(partition)
            if start is None or not records or records[-1].offset < start:
                continue  # not ours (any more), read before, or halted
            decoder = self._decoders.for_batch(len(records))
            decoder.send([r.value for r in records])
            self._inflight.append(InFlight(partition, start, records, decoder))
            self._cursors[partition] = records[-1].offset + 1

    def _advance(self, partition: int, offset: int) -> None:
        self._note_reached(partition)
        if self.on_applied is not None:
            self.on_applied(partition, self._writers[partition].next_offset)

    def _note_reached(self, only: int | None = None) -> None:
        """Move the stored offset over offsets the source passed without records, once
        nothing of their partition is in flight."""
        busy = {b.partition for b in self._inflight}
        for partition, offset in list(self._reached.items()):
            if (only is not None and partition != only) or partition in busy:
                continue
            del self._reached[partition]
            writer = self._writers.get(partition)
            if writer is None or self._cursors.get(partition, offset) > offset \
                    or offset <= writer.next_offset:
                continue
            writer.skip_to(offset)
            self._cursors[partition] = offset
            if only is None and self.on_applied is not None:
                self.on_applied(partition, offset)

    def _settle(self, discard: set[int]) -> None:
        """Empty the pipeline: apply the batches in flight, except those of ``discard``."""
        while self._inflight:
            batch = self._inflight.popleft()
            try:
                decoded = batch.decoder.receive()
            except BackendUnavailable:  # the helper died: start afresh if it is needed again
                self._decoders.drop_helper(failed=False)
                self._reset_pipeline()
                return
            writer = self._writers.get(batch.partition)
            if batch.partition in discard or writer is None or batch.start != writer.next_offset:
                continue
            self._advance(batch.partition, writer.apply(batch.records, decoded).next_offset)
        self._decoders.inline.close()

    def _reset_pipeline(self) -> None:
        """Forget everything in flight; reading starts again at the stored offsets."""
        try:
            while self._inflight:
                self._inflight.popleft().decoder.receive()
        except BackendUnavailable:
            self._decoders.drop_helper(failed=False)
        self._inflight.clear()
        self._decoders.inline.close()
        self._reached.clear()
        for partition, writer in self._writers.items():
            self._cursors[partition] = writer.next_offset
            if self._source is not None:
                self._source.seek(partition, writer.next_offset)

    def _static(self) -> list[int]:
        if self.partitions is not None:
            return self.partitions
        return list(range(self.log.partitions(EVENTS)))

    def _ensure_open(self) -> None:
        if not self._writers:
            self.open()

    def _follow_swap(self) -> None:
        """Move to a projection a rebuild swapped in (looked for at most every
        ``SWAP_CHECK_S``: a swap is rare, and the look is a few filesystem calls)."""
        if not self.follow_swaps:
            return
        now = time.monotonic()
        if now < self._next_swap_check:
            return
        self._next_swap_check = now + SWAP_CHECK_S
        if not self.store.outdated():
            return
        partitions = self.assignment
        logger.info("a rebuild swapped a new projection in: continuing there")
        self._settle(discard=set(partitions))
        self.revoked(partitions)
        starts = self.assigned(partitions)
        if self._source is not None:
            for partition, offset in starts.items():
                self._source.seek(partition, offset)


def project(log: EventLog, state_dir: str | os.PathLike[str],
            settings: ProjectorSettings | None = None) -> Progress:
    """Apply everything up to the log's current end, then close (a one-shot projector)."""
    with Projector(log, state_dir, settings) as projector:
        return projector.run(once=True)
