"""The judge of the partitions one node serves: queries answered from its own projection.

An answer is given only for a partition the node serves at the moment of the read: one
assigned here, restored, and open (a partition revoked, restoring or being reopened yields
an :class:`Unanswered`, which the HTTP route forwards or the asker retries, never "absent").
It waits until the partition has applied what the query needs, then reads the key and the
applied offset from one RocksDB snapshot and checks that the partition is still served
after the read. The premises it names are the node's: the events topic's ID, the
generation it read, and the asker's fingerprint, which must be one this release judges
(:class:`~effectlog.judge.CannotJudge` otherwise).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from consumers.node.gate import PartitionGate
from effectlog.errors import BackendUnavailable, EffectlogError
from effectlog.judge.premises import CannotJudge
from effectlog.judge.query import Answer, Premises, Query
from effectlog.log.base import EVENTS, Position
from projections.rocksdb.reader import PartitionMoved, PartitionReads
from projections.verdicts import answer_from

#: The least a fresh question's read of the log's end is given, whatever its timeout: a
#: question asked with no wait (``timeout_ms`` 0) still gets its one broker round trip.
END_READ_FLOOR_S = 0.25


@dataclass(frozen=True, slots=True)
class Unanswered:
    """A query this node cannot answer now, and why; ``here`` is False when another member
    owns (or may own) the partition, so the query is for that member; ``late`` when the
    partition is served here but had not applied what the query needs in time."""

    key: str
    partition: int
    reason: str
    here: bool = True
    late: bool = False

    def as_json(self) -> dict[str, object]:
        return {"key": self.key, "partition": self.partition, "reason": self.reason}


class PartitionJudge:
    """Answers queries about the keys of the partitions ``gate`` says are served here."""

    def __init__(self, gate: PartitionGate, reader: PartitionReads, url: str,
                 topic_id: str | None, fingerprints: Collection[str],
                 end_offsets: Callable[[], dict[int, int]]) -> None:
        self.gate = gate
        self.reader = reader
        self.url = url
        self.topic_id = topic_id
        self.fingerprints = frozenset(fingerprints)
        self.end_offsets = end_offsets

    def holds(self, partition: int) -> bool:
        """Whether ``partition`` is assigned here (serving or restoring)."""
        return self.gate.status(partition) is not None

    def refuse_unknown(self, judge: str) -> None:
        """Raise :class:`CannotJudge` unless this release judges writers of ``judge``."""
        if judge not in self.fingerprints:
            raise CannotJudge(f"{self.url} cannot judge events written with fingerprint {judge} "
                              f"(it judges {', '.join(sorted(self.fingerprints))}): another "
                              "release of the rules or writer schema; upgrade serve first")

    def read(self, query: Query, judge: str, target: int) -> Answer | Unanswered:
        """One consistent read of ``query``'s key, without waiting; Unanswered when the
        partition is not served here now or has not applied ``target`` yet."""
        partition = self.reader.partition_of(query.key)
        status = self.gate.status(partition)
        if status is None:
            return Unanswered(query.key, partition, f"partition {partition} is not served by "
                                                   f"{self.url}", here=False)
        if status == "halted":
            why = self.gate.halted().get(partition, "")
            return Unanswered(query.key, partition, f"partition {partition} is halted: {why}")
        if status == "restoring":
            left = self.gate.restore_left(partition)
            return Unanswered(query.key, partition,
                              f"partition {partition} is restoring ({left} records to apply)")
        try:
            read = self.reader.read_consistent(query.key)
        except PartitionMoved:
            read = None
        if read is None or self.gate.status(partition) != "serving":
            return Unanswered(query.key, partition, f"partition {partition} is moving "
                                                   "(revoked or reopened during the read)")
        if read.applied < target:
            return Unanswered(query.key, partition, f"partition {partition} has applied "
                                                   f"{read.applied}, short of {target}",
                              late=True)
        premises = Premises(self.topic_id, read.generation, judge, self.url)
        return answer_from(read, query, premises, self._rejection_at(partition))

    def target(self, query: Query) -> int:
        """The applied offset ``query`` needs (reading the log's end for a fresh query)."""
        target = query.applied_at_least
        if query.fresh:
            partition = self.reader.partition_of(query.key)
            target = max(target, self.end_offsets().get(partition, 0))
        return target

    async def answer(self, query: Query, judge: str, timeout_s: float) -> Answer | Unanswered:
        """:meth:`read` once the partition has applied what ``query`` needs (at most
        ``timeout_s``), on the event loop."""
        deadline = time.monotonic() + timeout_s
        try:
            target = await asyncio.wait_for(asyncio.to_thread(self.target, query),
                                            max(timeout_s, END_READ_FLOOR_S)) if query.fresh \
                else query.applied_at_least
        except EffectlogError as exc:
            return Unanswered(query.key, self.reader.partition_of(query.key),
                              f"cannot read the log's end offsets: {exc}")
        except TimeoutError:
            return Unanswered(query.key, self.reader.partition_of(query.key),
                              "the log's end offsets were not read within "
                              f"{max(timeout_s, END_READ_FLOOR_S):g}s")
        partition = self.reader.partition_of(query.key)
        reached = False
        while True:
            found = self.read(query, judge, target)
            left = deadline - time.monotonic()
            if isinstance(found, Answer) or not found.here or left <= 0:
                return found
            if reached:  # the gate said applied, the store not yet (a partition reopened)
                await asyncio.sleep(min(0.01, left))
            reached = await self.gate.wait_async(partition, target, left)
            if not reached and self.gate.status(partition) is None:
                return Unanswered(query.key, partition, f"partition {partition} moved to "
                                                       "another member", here=False)

    def answer_blocking(self, query: Query, judge: str, timeout_s: float) -> Answer | Unanswered:
        """:meth:`answer` for a thread (the node's own reconciler)."""
        deadline = time.monotonic() + timeout_s
        target = self.target(query)
        partition = self.reader.partition_of(query.key)
        reached = False
        while True:
            found = self.read(query, judge, target)
            left = deadline - time.monotonic()
            if isinstance(found, Answer) or not found.here or left <= 0:
                return found
            if reached:
                time.sleep(min(0.01, left))
            reached = self.gate.wait(partition, target, left)

    def rejection_at(self, partition: int, offset: int) -> str | None:
        """The rejection reason stored for ``offset`` of ``partition``, if any."""
        return self._rejection_at(partition)(offset)

    def _rejection_at(self, partition: int) -> Callable[[int], str | None]:
        def reason(offset: int) -> str | None:
            try:
                refused = self.reader.rejected_at(Position(EVENTS, partition, offset))
            except PartitionMoved:
                return None
            return None if refused is None else refused.reason
        return reason


class NodeJudge:
    """A :class:`~effectlog.judge.Judge` answered in-process by this node's
    :class:`PartitionJudge` (its reconciler's): a key of a partition not served here raises
    :class:`~effectlog.errors.BackendUnavailable`, as a judge that cannot answer does."""

    def __init__(self, judge: PartitionJudge, fingerprint: str, timeout_s: float = 10.0) -> None:
        self.judge = judge
        self.fingerprint = fingerprint
        self.timeout_s = timeout_s

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        self.judge.refuse_unknown(self.fingerprint)
        answers = []
        for query in queries:
            found = self.judge.answer_blocking(query, self.fingerprint, self.timeout_s)
            if isinstance(found, Unanswered):
                raise BackendUnavailable(f"{found.key}: {found.reason}")
            answers.append(found)
        return answers

    def close(self) -> None:
        return None
