"""The owner's side of the changelog: publish what this node accepted, partition by partition.

When the group assigns a partition here, :meth:`Publisher.take` takes the partition's changelog
writer first, which fences every earlier owner (one that is paused and resumes cannot commit a
publication any more), and only then does the projector open the partition, restoring it from
the changelog when its own copy is not exactly what was last published. Every ``interval_s``
the publisher publishes each owned partition's changes: the states of the keys changed since
the last publication, read from one RocksDB snapshot, and a checkpoint naming the events offset
they reflect, in one transaction. A cooperative revoke publishes what is left before the
partition goes, so its next owner restores without replaying; a lost partition is just let go.
A publication that fails is retried with the next round. A fenced one means another member
owns the partition now, or the transaction coordinator ended the writer (a publication left
open past ``transaction.timeout.ms`` while the broker was away): either way the writer is let
go, and taken again after :data:`RETAKE_AFTER_S` if the group still gives this member the
partition then.
Taking it again is as safe as the first take: it fences every other writer before it reads the
last checkpoint, and publishes only once applied past it, so the changelog never goes back in
time, whoever publishes last. Without it, a partition would go unpublished until its next
rebalance, and a restore after that would replay ever more of the events topic, which
compaction may already have thinned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from effectlog.errors import BackendUnavailable, Fenced
from effectlog.log.changelog import Changelog, ChangelogWriter
from projections.checkpoint import Checkpoint
from projections.store import PartitionWriter

logger = logging.getLogger(__name__)

#: Seconds between publications (a restore replays at most about this much of the events).
PUBLISH_EVERY_S = 1.0
#: Seconds (at least) before a fenced partition's writer is taken again. A member paused through
#: a rebalance (a zombie) learns from the group within a few heartbeats once it runs again that
#: the partition is another member's, and lets it go before then.
RETAKE_AFTER_S = 30.0
#: Writers taken side by side at most (each has a producer of its own while it is taken).
PARALLEL_TAKES = 8


class Publisher:
    """Publishes the partitions this node owns to ``changelog``; ``writers`` are the
    projector's open partition writers, by partition; ``held`` says whether the group gives
    this member a partition now (a fenced writer is taken again only then)."""

    def __init__(self, changelog: Changelog, writers: Callable[[], Mapping[int, PartitionWriter]],
                 log_id: str | None, interval_s: float = PUBLISH_EVERY_S,
                 retake_after_s: float = RETAKE_AFTER_S,
                 held: Callable[[int], bool] = lambda partition: True,
                 clock: Callable[[], float] = time.monotonic,
                 partitions: int | None = None) -> None:
        self.changelog = changelog
        self.partitions = partitions  # the events topic's count, carried by each checkpoint
        self.writers = writers
        self.held = held
        self.log_id = log_id
        self.interval_s = interval_s
        self.retake_after_s = retake_after_s
        self._clock = clock
        self._owned: dict[int, ChangelogWriter] = {}
        self._fenced: dict[int, float] = {}  # held here, writer lost: when it was fenced
        self._current: dict[int, float] = {}  # when the changelog last held all applied here
        self._floor: dict[int, int] = {}  # publish only once applied past the last checkpoint
        self._lock = threading.Lock()  # one publication (or take, or release) at a time
        self.publications = 0

    def take(self, partitions: Sequence[int]) -> None:
        """Become the only publisher of ``partitions`` (before the projector opens them).
        Their writers are taken side by side (each is a round trip to the transaction
        coordinator and one to the partition's leader): a takeover of many partitions
        holds the rebalance up about as long as one. Those taken stay taken when another
        fails, whose error is raised (the caller tries again).

        A copy already open here (a standby promoted) publishes only once it has applied
        past the changelog's last checkpoint, so the changelog never goes back in time."""
        with self._lock:
            for partition in partitions:
                self._fenced.pop(partition, None)
            wanted = [p for p in dict.fromkeys(partitions) if p not in self._owned]
            if not wanted:
                return
            with ThreadPoolExecutor(max_workers=min(len(wanted), PARALLEL_TAKES),
                                    thread_name_prefix="changelog-take") as pool:
                opening = {p: pool.submit(self._open, p) for p in wanted}
            errors = []
            for partition, future in opening.items():
                error = future.exception()
                if error is None:
                    self._own(partition, *future.result())
                else:
                    errors.append(error)
            if errors:
                raise errors[0]

    def retake(self) -> list[int]:
        """Take again the writers fenced :attr:`retake_after_s` ago or more, of the
        partitions the projector still holds and the group gives this member; the partitions
        taken. One that fails is tried again after as long."""
        taken = []
        with self._lock:
            due = sorted(self._fenced.items())
        for partition, since in due:
            if self._clock() - since < self.retake_after_s or \
                    partition not in self.writers() or not self.held(partition):
                continue
            with self._lock:
                if self._fenced.pop(partition, None) is None:  # released meanwhile
                    continue
                try:
                    self._take(partition)
                except (Fenced, BackendUnavailable) as exc:
                    logger.warning("partition %d: taking its changelog writer again failed "
                                   "(tried again in %gs): %s", partition,
                                   self.retake_after_s, exc)
                    self._fenced[partition] = self._clock()
                    continue
            taken.append(partition)
        return taken

    def _take(self, partition: int) -> None:
        """Take ``partition``'s writer (under the lock)."""
        if partition not in self._owned:
            self._own(partition, *self._open(partition))

    def _open(self, partition: int) -> tuple[ChangelogWriter, int]:
        """A writer of ``partition``, which fences every earlier one, and the offset of the
        last checkpoint, read after that: no other writer can move past it any more."""
        writer = self.changelog.writer(partition)
        try:
            raw = self.changelog.last_checkpoint(partition)
            return writer, 0 if raw is None else Checkpoint.decode(raw).applied
        except BaseException:
            writer.close()
            raise

    def _own(self, partition: int, writer: ChangelogWriter, floor: int) -> None:
        self._owned[partition] = writer
        self._floor[partition] = floor
        self._current.setdefault(partition, self._clock())
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
                self._fenced.pop(partition, None)
                self._current.pop(partition, None)
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
                self._current[partition] = self._clock()
                return False
            try:
                owner.publish(changes.changes, changes.checkpoint(self.log_id, self.partitions))
            except Fenced as exc:
                logger.warning("%s; taking it again in %gs if this member still holds it",
                               exc, self.retake_after_s)
                store.published(changes, ok=False)
                self._owned.pop(partition, None)
                self._fenced[partition] = self._clock()
                owner.close()
                return False
            except BackendUnavailable:
                store.published(changes, ok=False)
                raise
            store.published(changes, ok=True)
            self._current[partition] = self._clock()
            self.publications += 1
            return True

    def unpublished_s(self) -> dict[int, float]:
        """Per partition held here (its writer owned or fenced): seconds since the changelog
        last held everything its projection had applied. A restore past that point replays
        the events topic, so it must stay well below ``min.compaction.lag.ms``."""
        now = self._clock()
        with self._lock:
            return {p: now - since for p, since in sorted(self._current.items())}

    def owned(self) -> list[int]:
        with self._lock:
            return sorted(self._owned)

    def run(self, stop: threading.Event) -> None:
        """Publish every owned partition every ``interval_s`` until ``stop`` is set (and
        take fenced writers again when it is time), then once more: a member stopped before
        its first round (or whose handles are left unclosed at exit) still leaves its last
        state and checkpoint, with the partition count, for the next owner."""
        while not stop.wait(self.interval_s):
            self.retake()
            self._round("retried")
        self._round("the next owner replays from the previous checkpoint")

    def _round(self, then: str) -> None:
        for partition in self.owned():
            try:
                self.publish(partition)
            except BackendUnavailable as exc:
                logger.warning("partition %d: publication failed (%s): %s", partition, then, exc)

    def close(self) -> None:
        with self._lock:
            owned, self._owned = self._owned, {}
            self._fenced.clear()
            self._current.clear()
        for writer in owned.values():
            writer.close()
