"""The event log port: an append-only, partitioned, ordered log of keyed records.

Two topics exist on every backend: ``events`` (effect transitions, keyed by idempotency
key) and ``commands`` (reconciliation commands). A key always maps to one partition, so
the log order per key is total.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from effectlog.log.changelog import Changelog

EVENTS = "events"
COMMANDS = "commands"
TOPICS = (EVENTS, COMMANDS)
#: The changelog of accepted state, on logs whose events topic is compacted (Kafka).
STATE = "state"


class Position(NamedTuple):
    """Where a record sits in the log: topic, partition and offset (a named tuple: one is
    made per appended record, so it must be cheap)."""

    topic: str
    partition: int
    offset: int


#: The value of a tombstone: an expiry of its key (see :meth:`EventLog.expire`). Kafka
#: writes it as a null value, the tombstone of its compaction.
TOMBSTONE = b""
#: The Kafka record header of a tombstone naming the effect it expires (its last event id).
EXPIRES_HEADER = "effectlog-expires"
#: ``Record.expires`` of a purge mark: a tombstone with no earlier record of its key left
#: (a purge deleted them). It removes whatever the key holds, even what a reader applied of
#: the deleted records before (see :func:`effectlog.machine.check_expiry`).
PURGED = "*purged*"


@dataclass(frozen=True, slots=True)
class Record:
    """One record read back from the log (``value`` empty: a tombstone)."""

    topic: str
    partition: int
    offset: int
    key: str
    value: bytes
    timestamp_ms: int
    #: A tombstone's named effect: the event id of the last accepted event of the effect it
    #: expires (None: any settled effect, as tombstones of earlier releases and of logs
    #: that append them conditionally)
    expires: str | None = None

    @property
    def position(self) -> Position:
        return Position(self.topic, self.partition, self.offset)


class EventLog(ABC):
    """An append-only log with one or more partitions per topic.

    ``append`` returns only once the record is durable (committed and fsync'd, or
    acknowledged by all in-sync replicas) and raises :class:`BackendUnavailable` otherwise.
    """

    url: str
    #: True when :meth:`append_after` is supported (an atomic compare-and-append per key).
    conditional: bool = False
    #: How many blocking appends one process can usefully have in flight at once (an async
    #: writer sizes its thread pool by it): 1 where appends share one connection and lock.
    concurrent_appends: int = 8
    #: True when old records of a key may be compacted away (a key's first surviving record
    #: need not be its CREATE).
    compacted: bool = False
    #: True when reading one key's records is an index lookup (SQLite, memory), so a writer
    #: may fold a key from the log itself; False where it scans a partition (Kafka), where
    #: writers read state through the projection cluster instead.
    indexed_keys: bool = True

    @abstractmethod
    def partitions(self, topic: str) -> int:
        """Number of partitions of ``topic``."""

    @abstractmethod
    def partition_for(self, topic: str, key: str) -> int:
        """The partition ``key`` is written to."""

    @abstractmethod
    def append(self, topic: str, key: str, value: bytes) -> Position:
        """Durably append one record and return its position."""

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        """Durably append ``values`` under ``key``, all or none, only if the key's latest
        record is at ``last_offset`` (None: no record yet).

        Returns None, appending nothing, when another record of the key came in between.
        Only backends with ``conditional = True`` implement it.
        """
        raise NotImplementedError(f"{type(self).__name__} has no conditional append")

    def last_offset(self, topic: str, key: str) -> int | None:
        """Offset of ``key``'s latest record, or None."""
        records = self.read_key(topic, key)
        return records[-1].offset if records else None

    def append_many(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        """Durably append several records; per-key order follows ``items`` order."""
        return [self.append(topic, key, value) for key, value in items]

    def expire(self, effects: Sequence[tuple[str, str]]) -> dict[str, Position]:
        """Expire settled effects, each given as (key, the event id of its last accepted
        event): a tombstone (:data:`TOMBSTONE`) of its key on the events topic, on which the
        projector removes the key if it is settled (see
        :func:`effectlog.machine.check_expiry`). The keys whose tombstone was written, and where.

        A tombstone must expire that effect and no other: two expirers may pick the same
        key, and the second tombstone could land after the key expired and was used again.
        A compare-and-append log writes it only if the key, folded by the rules, still ends
        with that event and nothing came after (so not at all otherwise); a log without
        compare-and-append names the event in the tombstone, which the rules check."""
        if not self.conditional:
            raise NotImplementedError(f"{type(self).__name__} cannot expire effects")
        from effectlog.machine import fold  # the rules, read once per key (like purge_expired)
        from effectlog.view import decode_events

        written: dict[str, Position] = {}
        for key, event_id in effects:
            records = self.read_key(EVENTS, key)
            current, _ = fold(decode_events(self, key, records))
            if current is None or current.event_id != event_id:
                continue  # expired already, and perhaps used again since
            if appended := self.append_after(EVENTS, key, [TOMBSTONE], records[-1].offset):
                written[key] = appended[0]
        return written

    def purge_expired(self, before_ms: int) -> int:
        """Delete the records before each accepted tombstone logged before ``before_ms``
        that ends its key; how many records went. The tombstone stays as a purge mark (see
        :data:`PURGED`). A compacted log's broker does this itself (compaction, and the
        tombstone after ``delete.retention.ms``): 0 here."""
        return 0

    def append_ordered(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        """Durably append several records in order, without the promise of all or none.

        A failed call may have written some of ``items``; a caller relies only on each
        record's own fate (the projector judges every record in log order). Where
        :meth:`append_many` costs no more (SQLite: one transaction either way) it is used.
        """
        return self.append_many(topic, items)

    @abstractmethod
    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        """Up to ``limit`` records of one partition starting at ``offset`` (inclusive).

        Waits up to ``timeout`` seconds for at least one record when none is there yet.
        """

    @abstractmethod
    def end_offsets(self, topic: str) -> dict[int, int]:
        """Next offset to be written, per partition (the high watermark)."""

    def read_key(self, topic: str, key: str) -> list[Record]:
        """Every record of ``key`` in log order (a scan of the key's partition by default)."""
        partition = self.partition_for(topic, key)
        return [r for r in self.scan(topic, partition) if r.key == key]

    def scan(self, topic: str, partition: int, start: int = 0,
             end: int | None = None, batch: int = 5000) -> Iterator[Record]:
        """Iterate one partition from ``start`` up to ``end`` (default: its end now)."""
        stop = self.partition_end(topic, partition) if end is None else end
        offset = start
        while offset < stop:
            records = self.read_before(topic, partition, offset, min(batch, stop - offset), stop)
            if not records:
                return
            for record in records:
                if record.offset >= stop:
                    return
                yield record
            offset = records[-1].offset + 1

    def acknowledged_ends(self, topic: str) -> dict[int, int]:
        """Where each partition ends counting every acknowledged record, those after an open
        transaction too (Kafka's high watermark, where :meth:`end_offsets` is the last stable
        offset a ``read_committed`` reader stops at): what a fresh read must have applied."""
        return self.end_offsets(topic)

    def partition_end(self, topic: str, partition: int) -> int:
        """The end offset of one partition (backends may ask for just that one)."""
        return self.end_offsets(topic).get(partition, 0)

    def read_before(self, topic: str, partition: int, offset: int, limit: int,
                    end: int) -> list[Record]:
        """:meth:`read` when the caller knows where the partition ends (``end``, exclusive),
        which a backend may use to stop there instead of asking."""
        return self.read(topic, partition, offset, limit)

    def changelog(self) -> Changelog | None:
        """The changelog projections of this log restore from (see
        :mod:`effectlog.log.changelog`): on a compacted log (Kafka), where the events topic
        alone cannot rebuild a projection; None where the log keeps every record (SQLite)."""
        return None

    def compaction_lag_ms(self) -> int | None:
        """How long the events topic surely keeps every record after it was appended
        (Kafka's ``min.compaction.lag.ms``); None where no record is ever compacted away."""
        return None

    def identity(self) -> str | None:
        """The log's id: made with the log and never reused (SQLite: a row in the log file;
        Kafka: the events topic's topic ID), so state built from one log can tell it from
        another one at the same URL. None when the backend cannot tell (checks are skipped)."""
        return None

    def check_serving(self, *, running: bool = False) -> None:  # noqa: B027 - optional hook
        """Raise :class:`~effectlog.errors.Conflict` when the log's settings break a premise a
        serving projection rests on (Kafka: records carry the broker's time, which recovery
        measures "stuck" on; the events stay long enough to reach the changelog, which
        exists and never deletes). ``running``: asked again by a serving node, which leaves
        a compaction lag below serve's floor to its compaction guard instead of stopping."""

    def connect(self) -> None:  # noqa: B027 - optional hook
        """Do now what the first append would pay for (Kafka: connect, read the topic's
        metadata, acquire the idempotent producer id), so no first call does; raise
        :class:`~effectlog.errors.BackendUnavailable` when the backend does not answer."""

    def verify(self) -> None:  # noqa: B027 - optional hook
        """Ask the backend whether its storage is intact, before writing (SQLite runs its
        quick_check); raise :class:`BackendUnavailable` when it reports damage."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and flush pending work."""

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
