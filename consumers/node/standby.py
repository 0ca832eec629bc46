"""Standby copies: warm projections of partitions other members own, promoted on failover.

With ``--standbys N`` every partition has up to N standby members besides its owner: the
members that follow the owner in the sorted list of member URLs (so each node computes the
same plan from the group's membership, with no coordination of its own). A standby member
keeps the partition's RocksDB up to date with positioned reads of the log; when the group
hands it the partition (its owner died or left), the projection is already there and the
restore before serving is the short tail since the last batch (Kafka Streams' standby
replicas; quix-streams has none).

:class:`WithStandbys` wraps the group's source: the projector sees one source whose
records come from the group (owned partitions, low latency) or from the standby reader.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence

from effectlog.log.base import EventLog
from effectlog.log.source import AssignmentListener, Fetched, LogSource, RecordSource
from projections.projector import Projector

logger = logging.getLogger(__name__)


def standby_partitions(owners: Mapping[int, str], members: Sequence[str], me: str,
                       count: int) -> set[int]:
    """The partitions ``me`` keeps warm: those whose next ``count`` members after their
    owner (in sorted URL order, wrapping around) include ``me``. An owner that has left the
    members keeps its place until the group moves its partitions, so their copies stay warm
    where the group is about to assign them."""
    if count < 1:
        return set()
    live = set(members) | {me}
    mine = set()
    for partition, owner in owners.items():
        if owner == me:
            continue
        ring = sorted(live | {owner})
        at = ring.index(owner)
        if me in (ring[at + 1:] + ring[:at])[:count]:
            mine.add(partition)
    return mine


class WithStandbys(RecordSource):
    """The group's partitions (``group``) and standby copies read from ``log``."""

    def __init__(self, group: RecordSource, log: EventLog, projector: Projector) -> None:
        self.group = group
        self.projector = projector
        self.standby = LogSource(log, [])
        self._listener: AssignmentListener | None = None
        self._lock = threading.Lock()
        self._wanted: set[int] = set()
        self._owned: set[int] = set()
        self._held: set[int] = set()  # standby partitions with an open writer

    @property
    def held(self) -> list[int]:
        """The partitions kept warm here now."""
        return sorted(self._held)

    def want(self, partitions: set[int]) -> None:
        """The standby plan changed (any thread); applied on the polling thread."""
        with self._lock:
            self._wanted = set(partitions)

    def start(self, listener: AssignmentListener) -> None:
        self._listener = listener
        self.standby.start(self.projector)
        self.group.start(_Promoting(self, listener))

    def poll(self, limit: int, timeout_s: float) -> Fetched:
        self._follow_plan()
        if self._held:  # owned partitions first; standby copies when those have nothing
            fetched = self.group.poll(limit, 0)
            if fetched.records or fetched.reached:
                return fetched
            warm = self.standby.poll(limit, 0)
            if warm.records or warm.reached:
                return warm
        return self.group.poll(limit, timeout_s)

    def seek(self, partition: int, offset: int) -> None:
        (self.standby if partition in self._held else self.group).seek(partition, offset)

    def close(self) -> None:
        self.group.close()

    def _follow_plan(self) -> None:
        """Open writers for new standby partitions, close those no longer planned."""
        with self._lock:
            wanted = self._wanted - self._owned
        for partition in sorted(self._held - wanted):
            self.standby.drop(partition)
            self._held.discard(partition)
            self.projector.revoked([partition])
            logger.info("partition %d: no longer a standby here", partition)
        for partition in sorted(wanted - self._held):
            start = self.projector.assigned([partition])[partition]
            self.standby.add(partition, start)
            self._held.add(partition)
            logger.info("partition %d: standby copy from offset %d", partition, start)

    def _promote(self, partitions: Sequence[int]) -> None:
        """The group assigned ``partitions``: standby copies among them become owned."""
        with self._lock:
            self._owned.update(partitions)
        promoted = [p for p in partitions if p in self._held]
        # the open copies only: next_offsets() would open every partition when none is open
        # yet (a promoted copy still restoring), the other members' too
        at = {p: w.next_offset for p, w in self.projector.writers().items()}
        halted = self.projector.guard.halted()
        for partition in promoted:
            self.standby.drop(partition)
            self._held.discard(partition)
            if partition in halted:  # opened afresh: restored from the changelog if behind it
                self.projector.revoked([partition])
                logger.warning("partition %d: the standby copy halted (%s); opening it afresh",
                               partition, halted[partition], extra={"partition": partition})
                continue
            logger.info("partition %d: standby promoted, applied up to offset %d (the tail "
                        "since follows before it serves)", partition, at.get(partition, 0),
                        extra={"partition": partition})

    def _demote(self, partitions: Sequence[int]) -> None:
        with self._lock:
            self._owned.difference_update(partitions)


class _Promoting:
    """The group's listener: promotes standby copies before the node hears of them."""

    def __init__(self, source: WithStandbys, listener: AssignmentListener) -> None:
        self.source = source
        self.listener = listener

    def assigned(self, partitions: Sequence[int]) -> Mapping[int, int]:
        self.source._promote(partitions)
        return self.listener.assigned(partitions)

    def revoked(self, partitions: Sequence[int], *, lost: bool) -> None:
        self.listener.revoked(partitions, lost=lost)
        self.source._demote(partitions)
