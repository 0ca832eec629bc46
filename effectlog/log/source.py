"""Where a projector's records come from: the events partitions assigned to this process.

A :class:`RecordSource` delivers the records of the partitions assigned to this process, in
log order per partition, and tells an :class:`AssignmentListener` when partitions are
assigned, revoked or lost. :class:`LogSource` is a fixed assignment read with positioned
reads of any :class:`~effectlog.log.base.EventLog`; on Kafka a consumer group decides the
assignment (:mod:`effectlog.log.kafka.group`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

from effectlog.log.base import EVENTS, EventLog, Record

_REFRESH_S = 0.05  # end offsets of a caught-up multi-partition source, at most this often


class AssignmentListener(Protocol):
    """Told about the partitions this process gains and loses (on the polling thread)."""

    def assigned(self, partitions: Sequence[int]) -> Mapping[int, int]:
        """Partitions gained; returns the offset to start reading each at."""
        ...

    def revoked(self, partitions: Sequence[int], *, lost: bool) -> None:
        """Partitions taken away: ``lost`` when another process may own them already
        (stop at once), else after the current batch (a cooperative hand-over)."""
        ...


class Fetched(NamedTuple):
    """One poll: records in log order per partition, and ``reached``: partitions whose
    readable records below the given offset have all been delivered (the offsets between
    the last record and it are no events: transaction markers, compacted gaps)."""

    records: list[Record]
    reached: dict[int, int]


class RecordSource(ABC):
    """Records of the partitions assigned to this process."""

    @abstractmethod
    def start(self, listener: AssignmentListener) -> None:
        """Begin; the listener hears of every assignment from now on."""

    @abstractmethod
    def poll(self, limit: int, timeout_s: float) -> Fetched:
        """Up to ``limit`` records, waiting up to ``timeout_s`` when there are none."""

    @abstractmethod
    def seek(self, partition: int, offset: int) -> None:
        """Read ``partition`` again from ``offset``."""

    @property
    def exhausted(self) -> bool:
        """A bounded source has delivered everything it was asked for."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Leave the assignment and release the clients."""


class LogSource(RecordSource):
    """A fixed set of partitions read with positioned reads.

    ``until`` bounds the source (end offsets per partition, e.g. the log end when a
    one-shot projector started). Unbounded, it follows the log: one partition is read with
    the log's own wait; several are read round-robin among those behind the end offsets,
    which are fetched again once all are caught up.
    """

    def __init__(self, log: EventLog, partitions: Iterable[int] | None = None, *,
                 until: Mapping[int, int] | None = None, empty_reads_before_giving_up: int = 3,
                 topic: str = EVENTS) -> None:
        self.log = log
        self.topic = topic
        self.partitions = sorted(range(log.partitions(topic)) if partitions is None
                                 else set(partitions))
        self.until = None if until is None else dict(until)
        self.give_up_after = empty_reads_before_giving_up
        self._cursors: dict[int, int] = {}
        self._ends: dict[int, int] = dict(until or {})
        self._empty: dict[int, int] = {}
        self._turn = 0
        self._ends_at = 0.0
        self._listener: AssignmentListener | None = None

    def start(self, listener: AssignmentListener) -> None:
        self._listener = listener
        starts = listener.assigned(self.partitions)
        self._cursors = {p: int(starts.get(p, 0)) for p in self.partitions}
        if self.until is None and len(self._cursors) > 1:
            self._ends = self.log.end_offsets(self.topic)

    def seek(self, partition: int, offset: int) -> None:
        if partition in self._cursors:
            self._cursors[partition] = offset
            self._empty.pop(partition, None)

    def add(self, partition: int, offset: int) -> None:
        """Read ``partition`` too, from ``offset`` (its writer is opened by the caller)."""
        self._cursors[partition] = offset
        self._empty.pop(partition, None)

    def drop(self, partition: int) -> None:
        """Stop reading ``partition`` (the caller closes or hands over its writer)."""
        self._cursors.pop(partition, None)
        self._empty.pop(partition, None)

    @property
    def reading(self) -> list[int]:
        """The partitions read now."""
        return sorted(self._cursors)

    @property
    def exhausted(self) -> bool:
        return self.until is not None and not self._behind()

    def poll(self, limit: int, timeout_s: float) -> Fetched:
        if not self._cursors:
            return Fetched([], {})
        if self.until is None and len(self._cursors) == 1:
            [(partition, offset)] = self._cursors.items()
            fetched = self._read(partition, offset, limit, timeout_s)
            if not fetched.records and not fetched.reached and \
                    time.monotonic() - self._ends_at >= _REFRESH_S:
                # the end asked now, before the next read: if that read finds nothing
                # either, the offsets up to it hold no readable record (markers, aborted)
                self._ends = self.log.end_offsets(self.topic)
                self._ends_at = time.monotonic()
            return fetched
        behind = self._behind()
        if not behind and self.until is None:
            time.sleep(max(timeout_s, 0.0))
            if time.monotonic() - self._ends_at >= _REFRESH_S:
                self._ends = self.log.end_offsets(self.topic)
                self._ends_at = time.monotonic()
                self._empty.clear()
                behind = self._behind()
        if not behind:
            return Fetched([], {})
        self._turn += 1
        partition = behind[self._turn % len(behind)]
        return self._read(partition, self._cursors[partition], limit, 0.0)

    def _behind(self) -> list[int]:
        return [p for p, at in self._cursors.items()
                if at < self._ends.get(p, 0) and self._empty.get(p, 0) < self.give_up_after]

    def _read(self, partition: int, offset: int, limit: int, timeout_s: float) -> Fetched:
        if self.until is not None:
            limit = min(limit, max(0, self.until.get(partition, 0) - offset))
            if limit == 0:
                return Fetched([], {})
        records = self.log.read(self.topic, partition, offset, limit, timeout_s)
        if self.until is not None:
            records = [r for r in records if r.offset < self.until.get(partition, 0)]
        if not records:
            end = self._ends.get(partition, 0)
            if offset < end:  # nothing readable before an end asked before this read
                self._cursors[partition] = end
                return Fetched([], {partition: end})
            self._empty[partition] = self._empty.get(partition, 0) + 1
            return Fetched([], {})
        self._empty[partition] = 0
        self._cursors[partition] = records[-1].offset + 1
        return Fetched(records, {})
