"""The owner's side of the changelog: publish what this node accepted, partition by partition.

When the group assigns a partition here, :meth:`Publisher.take` takes the partition's changelog
writer first, which fences every earlier owner (one that is paused and resumes cannot commit a
publication any more), and only then does the projector open the partition, restoring it from
the changelog when its own copy is not exactly what was last published. Every ``interval_s``
the publisher publishes each owned partition's changes: the states of the keys changed since
the last publication, read from one RocksDB snapshot, and a checkpoint naming the events offset
they reflect, in one transaction. A cooperative revoke publishes what is left before the
partition goes, so its next owner restores without replaying; a lost partition is just let go.
A publication that fails is retried with the next round; a fenced one means another member
owns the partition now, and it is let go.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence

from effectlog.errors import BackendUnavailable, Fenced
from effectlog.log.changelog import Changelog, ChangelogWriter
from projections.checkpoint import Checkpoint
from projections.store import PartitionWriter

logger = logging.getLogger(__name__)

#: Seconds between publications (a restore replays at most about this much of the events).
PUBLISH_EVERY_S = 1.0


class Publisher:
    """Publishes the partitions this node owns to ``changelog``; ``writers`` are the
    projector's open partition writers, by partition."""

    def __init__(self, changelog: Changelog, writers: Callable[[], Mapping[int, PartitionWriter]],
                 log_id: str | None, interval_s: float = PUBLISH_EVERY_S) -> None:
        self.changelog = changelog
        self.writers = writers
        self.log_id = log_id
        self.interval_s = interval_s
        self._owned: dict[int, ChangelogWriter] = {}
        self._floor: dict[int, int] = {}  # publish only once applied past the last checkpoint
        self._lock = threading.Lock()  # one publication (or take, or release) at a time
        self.publications = 0

    def take(self, partitions: Sequence[int]) -> None:
        """Become the only publisher of ``partitions`` (before the projector opens them).

        A copy already open here (a standby promoted) publishes only once it has applied
        past the changelog's last checkpoint, so the changelog never goes back in time."""
        for partition in partitions:
            with self._lock:
                if partition in self._owned:
                    continue
                self._owned[partition] = self.changelog.writer(partition)
                raw = self.changelog.last_checkpoint(partition)
                self._floor[partition] = 0 if raw is None else Checkpoint.decode(raw).applied
                logger.info("partition %d: publishing its state to the changelog", partition)

    def release(self, partitions: Sequence[int], *, final: bool) -> None:
        """Let ``partitions`` go; ``final``: publish what is left first (a cooperative
        revoke), else not (lost: another member may own them already)."""
        for partition in partitions:
            if final:
                try:
                    self.publish(partition)
                except BackendUnavailable as exc:
                    logger.warning("partition %d: last publication failed: %s", partition, exc)
            with self._lock:
                writer = self._owned.pop(partition, None)
                self._floor.pop(partition, None)
            if writer is not None:
                writer.close()

    def publish(self, partition: int) -> bool:
        """Publish ``partition``'s changes now; False when there were none (or it is not
        owned here). Raises :class:`BackendUnavailable` when the log did not take them."""
        with self._lock:
            owner = self._owned.get(partition)
            store = self.writers().get(partition)
            if owner is None or store is None or store.next_offset < self._floor[partition]:
                return False
            changes = store.take_changes()
            if changes is None:
                return False
            try:
                owner.publish(changes.changes, changes.checkpoint(self.log_id))
            except Fenced as exc:
                logger.warning("%s", exc)
                store.published(changes, ok=False)
                self._owned.pop(partition, None)
                owner.close()
                return False
            except BackendUnavailable:
                store.published(changes, ok=False)
                raise
            store.published(changes, ok=True)
            self.publications += 1
            return True

    def owned(self) -> list[int]:
        with self._lock:
            return sorted(self._owned)

    def run(self, stop: threading.Event) -> None:
        """Publish every owned partition every ``interval_s`` until ``stop`` is set."""
        while not stop.wait(self.interval_s):
            for partition in self.owned():
                try:
                    self.publish(partition)
                except BackendUnavailable as exc:
                    logger.warning("partition %d: publication failed (retried): %s",
                                   partition, exc)

    def close(self) -> None:
        with self._lock:
            owned, self._owned = self._owned, {}
        for writer in owned.values():
            writer.close()
