"""Where an assigned partition's projection starts: as stored here, or restored from the
changelog.

On a compacted log the events topic alone cannot rebuild a projection: a key's early records
may be gone. A copy whose applied offset is exactly the changelog's last checkpoint is used as
it is; any other copy (behind it: the events since may be compacted; ahead of it: it applied
what nobody published) is replaced by the changelog's keys, and projection continues from the
checkpoint, whose events are younger than the topic's compaction lag: what it ends with is
what a full replay ends with.

Deciding is quick (one look at the changelog's last checkpoint, :func:`restore_needed`);
restoring reads the whole changelog partition (:func:`restore_partition`), which a serving
node does off its projector thread (:mod:`projections.background`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from effectlog.log.base import EVENTS, EventLog
from effectlog.log.changelog import Changelog
from projections.background import BackgroundRestores, RestoreJob
from projections.checkpoint import Checkpoint, check_partition_count
from projections.progress import logged
from projections.store import PartitionWriter, ProjectionStore

logger = logging.getLogger(__name__)


def restore_needed(writer: PartitionWriter, log: EventLog, changelog: Changelog | None, *,
                   gaps_accepted: bool = False) -> int | None:
    """None when ``writer`` can be used as it is; otherwise the offset the changelog's last
    checkpoint was published at (where reading resumes once it is restored).

    Projecting a compacted events topic without a checkpoint, a key's first record read is
    its first record ever: the compaction guard halts before any stretch compaction may have
    thinned. Only past a gap the operator accepted (``gaps_accepted``,
    ``--accept-compaction-gaps``) may a key's first surviving record follow removed ones;
    then it is taken as the key's baseline (checked for its binding, not by the rules)."""
    if changelog is None:
        # no changelog to restore from (a log that keeps every record; or, compacted, a
        # backend without one)
        writer.trust_first = gaps_accepted and log.compacted
        return None
    raw = changelog.last_checkpoint(writer.partition)
    if raw is None:
        # nothing published yet: projecting from the events topic alone (its first
        # publication carries every key)
        writer.trust_first = gaps_accepted and log.compacted and writer.next_offset == 0
        writer.publish_all()
        return None
    checkpoint = Checkpoint.decode(raw)
    check_partition_count(checkpoint.partitions, log.partitions(EVENTS),
                          f"partition {writer.partition}'s changelog")
    published = checkpoint.applied
    if published == writer.next_offset:
        return None  # this copy is exactly what was last published
    logger.info("partition %d restoring from the changelog: stored up to offset %d, "
                "published up to %d", writer.partition, writer.next_offset, published)
    return published


def restore_partition(store: ProjectionStore, log: EventLog, changelog: Changelog,
                      partition: int, count: int,
                      stop: threading.Event | None = None) -> PartitionWriter:
    """``partition`` emptied and filled from ``changelog`` (``count``: the log's partitions);
    setting ``stop`` ends the read with :class:`~effectlog.log.changelog.ReadStopped`."""
    started = time.monotonic()
    writer = store.reset_writer(partition, partitions=count)
    changes = logged(changelog.read(partition, stop),
                     f"partition {partition} restoring from the changelog", logger)
    writer.restore(changes, log.identity())
    writer.bind_log(log)
    logger.info("partition %d restored from the changelog up to offset %d in %.2fs",
                partition, writer.next_offset, time.monotonic() - started)
    return writer


class PartitionOpener:
    """Opens the writer of an assigned partition: as stored, or restored from the changelog
    first; in the calling thread, or with ``background`` on a thread of its own
    (:mod:`projections.background`), each taken back with :meth:`finished`."""

    def __init__(self, store: ProjectionStore, log: EventLog, changelog: Changelog | None, *,
                 gaps_accepted: bool, background: bool) -> None:
        self.store = store
        self.log = log
        self.changelog = changelog
        self.gaps_accepted = gaps_accepted
        self._background = BackgroundRestores(self._restore) if background else None

    def open(self, partition: int) -> PartitionWriter | None:
        """``partition``'s writer, ready; None when it is being restored in the background."""
        writer = self.store.open_writer(partition, partitions=self.log.partitions(EVENTS))
        try:
            writer.bind_log(self.log)
            published = restore_needed(writer, self.log, self.changelog,
                                       gaps_accepted=self.gaps_accepted)
            if published is None:
                return writer
            if self._background is None:
                return self._restore(partition)
            self._background.submit(partition, published)
            return None
        except BaseException:
            self.store.release(partition)
            raise

    def pending(self) -> dict[int, int]:
        """The partitions being restored in the background, with the offset each resumes at."""
        return {} if self._background is None else self._background.pending()

    def finished(self) -> list[RestoreJob]:
        """The background restores that ended since the last call."""
        return [] if self._background is None else self._background.finished()

    def release(self, partitions: Iterable[int]) -> None:
        """Close ``partitions`` (background restores among them are stopped first)."""
        if self._background is not None:
            self._background.cancel(partitions)
        for partition in partitions:
            self.store.release(partition)

    def close(self) -> None:
        if self._background is not None:
            self._background.close()

    def _restore(self, partition: int, stop: threading.Event | None = None) -> PartitionWriter:
        assert self.changelog is not None
        return restore_partition(self.store, self.log, self.changelog, partition,
                                 self.log.partitions(EVENTS), stop)

