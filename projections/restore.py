"""Where an assigned partition's projection starts: as stored here, or restored from the
changelog.

On a compacted log the events topic alone cannot rebuild a projection: a key's early records
may be gone. A copy whose applied offset is exactly the changelog's last checkpoint is used as
it is; any other copy (behind it: the events since may be compacted; ahead of it: it applied
what nobody published) is replaced by the changelog's keys, and projection continues from the
checkpoint, whose events are younger than the topic's compaction lag: what it ends with is
what a full replay ends with.
"""

from __future__ import annotations

import logging
import time

from effectlog.log.base import EventLog
from effectlog.log.changelog import Changelog
from projections.checkpoint import Checkpoint
from projections.progress import logged
from projections.store import PartitionWriter, ProjectionStore

logger = logging.getLogger(__name__)


def starting_writer(writer: PartitionWriter, store: ProjectionStore, log: EventLog,
                    changelog: Changelog | None, count: int, *,
                    gaps_accepted: bool = False) -> PartitionWriter:
    """``writer``, or the partition restored from ``changelog`` unless what is stored here is
    exactly what the changelog's last checkpoint reflects (``count``: the log's partitions).

    Projecting a compacted events topic without a checkpoint, a key's first record read is
    its first record ever: the compaction guard halts before any stretch compaction may have
    thinned. Only past a gap the operator accepted (``gaps_accepted``,
    ``--accept-compaction-gaps``) may a key's first surviving record follow removed ones;
    then it is taken as the key's baseline (checked for its binding, not by the rules)."""
    if changelog is None:
        # no changelog to restore from (a log that keeps every record; or, compacted, a
        # backend without one)
        writer.trust_first = gaps_accepted and log.compacted
        return writer
    partition = writer.partition
    raw = changelog.last_checkpoint(partition)
    if raw is None:
        # nothing published yet: projecting from the events topic alone (its first
        # publication carries every key)
        writer.trust_first = gaps_accepted and log.compacted and writer.next_offset == 0
        writer.publish_all()
        return writer
    checkpoint = Checkpoint.decode(raw)
    if checkpoint.applied == writer.next_offset:
        return writer  # this copy is exactly what was last published
    logger.info("partition %d restoring from the changelog: stored up to offset %d, "
                "published up to %d", partition, writer.next_offset, checkpoint.applied)
    started = time.monotonic()
    writer = store.reset_writer(partition, partitions=count)
    writer.restore(logged(changelog.read(partition),
                          f"partition {partition} restoring from the changelog", logger),
                   log.identity())
    writer.bind_log(log)
    logger.info("partition %d restored from the changelog up to offset %d in %.2fs",
                partition, writer.next_offset, time.monotonic() - started)
    return writer
