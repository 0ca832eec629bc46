"""The Kafka :class:`~effectlog.log.base.EventLog`: an :class:`AppendProducer` for durable
appends and a :class:`PartitionReader` for positioned reads, created on first use.

Logical topics map to ``<prefix>.events`` (compacted) and ``<prefix>.commands``; create them
with ``effectlog topics create``. The log never auto-creates topics: a missing topic is a
:class:`BackendUnavailable`. Keys are placed by ``murmur2_random``, the Java client's hash, so
``partition_for`` needs no broker.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import KafkaException

from effectlog.errors import BackendUnavailable, Conflict, InvalidInput
from effectlog.log.base import EVENTS, EXPIRES_HEADER, TOMBSTONE, EventLog, Position, Record
from effectlog.log.kafka.admin import topic_id
from effectlog.log.kafka.changelog import KafkaChangelog
from effectlog.log.kafka.ends import EndOffsetRounds
from effectlog.log.kafka.partitioner import murmur2_partition
from effectlog.log.kafka.producer import AppendProducer, Headers, error_text
from effectlog.log.kafka.reader import PartitionReader
from effectlog.log.kafka.settings import KafkaSettings
from effectlog.log.kafka.transactions import TransactionalAppender
from effectlog.redact import redact_url

log = logging.getLogger(__name__)

#: How far back :meth:`KafkaLog._find` reads for a record acknowledged without an offset.
FIND_LIMIT = 20_000


class KafkaLog(EventLog):
    """The event log on Kafka: idempotent producer (acks=all), assign-only reader.

    No network in ``__init__``. Appends from many threads share one producer and each waits
    only for its own delivery reports; an append of several records of one key is one Kafka
    transaction (all or nothing for every ``read_committed`` reader), concurrent ones sharing a
    commit; a worker's CREATE + RESERVE + DISPATCH goes through :meth:`append_ordered` (one
    ordered produce). Reads share one consumer, one at a time; end-offset requests have a
    client of their own, do not wait behind a read, and threads asking at once share one.
    """

    compacted = True  # <prefix>.events is a compacted topic
    indexed_keys = False  # a key's records are found by scanning its partition

    def __init__(self, settings: KafkaSettings, url: str | None = None) -> None:
        self.settings = settings
        self.url = redact_url(url) if url else f"kafka://{settings.bootstrap}?prefix={settings.prefix}"
        self._lock = threading.Lock()  # guards producer creation and replacement
        self._read_lock = threading.Lock()  # the reader serves one thread at a time
        self._ends_lock = threading.Lock()  # end offsets need not wait behind a long read
        self._end_rounds: dict[str, EndOffsetRounds] = {}  # concurrent askers share requests
        self._producer: AppendProducer | None = None
        self._transactions: TransactionalAppender | None = None
        self._reader = PartitionReader(settings)
        self._checked: dict[str, set[str]] = {"writer": set(), "reader": set()}
        self._identity: str | None = None

    @classmethod
    def from_url(cls, url: str) -> KafkaLog:
        return cls(KafkaSettings.from_url(url), url)

    def __repr__(self) -> str:
        return f"KafkaLog({self.url!r})"

    # -- port -----------------------------------------------------------------------------

    def partitions(self, topic: str) -> int:
        self.settings.topic(topic)
        return self.settings.partitions

    def partition_for(self, topic: str, key: str) -> int:
        self.settings.topic(topic)
        return murmur2_partition(key.encode("utf-8"), self.settings.partitions)

    def append(self, topic: str, key: str, value: bytes) -> Position:
        return self._produce(topic, ((key, value),))[0]

    def append_many(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        return self._produce(topic, items)

    def append_ordered(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        """One pipelined produce on the idempotent producer: in order, one round trip, no
        transaction (a writer killed mid-call may leave some of the records)."""
        return self._produce(topic, items, atomic=False)

    def expire(self, effects: Sequence[tuple[str, str]]) -> dict[str, Position]:
        """Tombstones (null values: compaction removes the keys) naming the effect each
        expires in its :data:`EXPIRES_HEADER`; pipelined like :meth:`append_ordered`."""
        if not effects:
            return {}
        name = self.settings.topic(EVENTS)
        handle = self._writer()
        self._ensure_writer_topic(name, handle)
        items = [(key, TOMBSTONE) for key, _ in effects]
        headers: list[Headers] = [[(EXPIRES_HEADER, event_id.encode("utf-8"))]
                                  for _, event_id in effects]
        positions = handle.append(name, EVENTS, items, headers)
        if any(position.offset < 0 for position in positions):
            positions = self._place(EVENTS, items, positions)
        return {key: position for (key, _), position in zip(items, positions, strict=True)}

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        return self._read(topic, partition, offset, limit, timeout, None)

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self._ends(topic, range(self.settings.partitions))

    def partition_end(self, topic: str, partition: int) -> int:
        return self._ends(topic, [partition])[partition]

    def acknowledged_ends(self, topic: str) -> dict[int, int]:
        name = self.settings.topic(topic)
        if name not in self._checked["reader"]:
            with self._read_lock:
                self._ensure_reader_topic(name)
        with self._ends_lock:
            return self._reader.end_offsets(name, list(range(self.settings.partitions)),
                                            acknowledged=True)

    def read_before(self, topic: str, partition: int, offset: int, limit: int,
                    end: int) -> list[Record]:
        return self._read(topic, partition, offset, limit, 0.0, end)

    def identity(self) -> str:
        """The topic ID of ``<prefix>.events``: a topic deleted and created again under the
        same name has another one. Raises :class:`LogMissing` when the topic does not exist."""
        if self._identity is None:
            self._identity = topic_id(self.settings, self.settings.topic(EVENTS))
        return self._identity

    def changelog(self) -> KafkaChangelog:
        return KafkaChangelog(self.settings)

    def connect(self) -> None:
        """Do now what the first append would: connect the producer, check the events topic,
        read its topic ID (which a worker checks verdicts against) and wait for the idempotent
        producer id (within ``timeout_s``)."""
        self.identity()
        handle = self._writer()
        self._ensure_writer_topic(self.settings.topic(EVENTS), handle)
        if not handle.wait_ready(self.settings.timeout_s):
            raise handle.unavailable(f"no idempotent producer id within {self.settings.timeout_s}s")

    @property
    def connected(self) -> bool:
        """True once the producer holds its idempotent producer id (see :meth:`connect`)."""
        handle = self._producer
        return handle is not None and not handle.stale and handle.wait_ready(0)

    def compaction_lag_ms(self) -> int | None:
        from effectlog.log.kafka.admin import compaction_lag_ms

        return compaction_lag_ms(self.settings)

    def check_serving(self, *, running: bool = False) -> None:
        from effectlog.log.kafka.admin import MIN_SERVING_LAG_MS, serving_problem

        problem = serving_problem(self.settings, lag_floor_ms=0 if running else MIN_SERVING_LAG_MS)
        if problem is not None:
            raise Conflict(problem)

    def close(self) -> None:
        with self._lock:
            handle, self._producer = self._producer, None
            transactions, self._transactions = self._transactions, None
        if transactions is not None:
            transactions.close()
        if handle is not None:
            left = handle.close(self.settings.timeout_s)
            if left:
                log.warning("%d records unacknowledged when closing %s", left, self.url)
        with self._read_lock, self._ends_lock:
            self._reader.close()
            self._checked["reader"].clear()

    # -- internals ------------------------------------------------------------------------

    def _writer(self) -> AppendProducer:
        handle = self._producer
        if handle is not None and not handle.stale:
            return handle  # the common case takes no lock: appenders never queue up here
        with self._lock:
            handle = self._producer
            if handle is not None and handle.stale:
                # After a fatal error or a delivery report that never came, a fresh producer
                # (with a new producer id) takes over. The old one finishes other threads' in-flight
                # records in the background.
                threading.Thread(target=handle.close, args=(self.settings.timeout_s,),
                                 name="effectlog-kafka-retire", daemon=True).start()
                handle = self._producer = None
                self._checked["writer"].clear()
            if handle is None:
                handle = self._producer = AppendProducer(self.settings)
            return handle

    def _check_partitions(self, name: str, found: int) -> None:
        if found != self.settings.partitions:
            raise Conflict(f"kafka topic {name} has {found} partitions but the log URL says "
                           f"{self.settings.partitions}: if it was created with {found}, add "
                           f"partitions={found} to the URL; a topic grown after effects were "
                           "written cannot be used (keys move to partitions without their "
                           "history): write to a new topic prefix")

    def _ensure_writer_topic(self, name: str, handle: AppendProducer) -> None:
        """Check once per producer that ``name`` exists with the configured partition count
        (asking through the producer also warms its metadata cache)."""
        if name in self._checked["writer"]:
            return
        try:
            meta = handle.producer.list_topics(name, timeout=self.settings.timeout_s)
        except KafkaException as exc:
            raise handle.unavailable(error_text(exc)) from None
        topic = meta.topics.get(name)
        if topic is None or not topic.partitions:
            raise BackendUnavailable(f"kafka topic {name} does not exist on "
                                     f"{self.settings.bootstrap}: create it with `effectlog topics create`")
        if topic.error is not None:
            raise handle.unavailable(f"topic {name}: {topic.error.str()}")
        self._check_partitions(name, len(topic.partitions))
        self._checked["writer"].add(name)

    def _ensure_reader_topic(self, name: str) -> None:
        if name not in self._checked["reader"]:
            self._check_partitions(name, self._reader.check_topic(name))
            self._checked["reader"].add(name)

    def _produce(self, topic: str, items: Sequence[tuple[str, bytes]],
                 atomic: bool = True) -> list[Position]:
        name = self.settings.topic(topic)
        if not items:
            return []
        handle = self._writer()
        self._ensure_writer_topic(name, handle)
        if atomic and len(items) > 1 and all(key == items[0][0] for key, _ in items):
            positions = self._transactional().append(name, topic, items)
        else:
            positions = handle.append(name, topic, items)
        if any(position.offset < 0 for position in positions):
            return self._place(topic, items, positions)
        return positions

    def _place(self, topic: str, items: Sequence[tuple[str, bytes]],
               positions: list[Position]) -> list[Position]:
        """Find the records that are durable at an offset their delivery report did not name
        (librdkafka's report of a retried batch the broker already had), by reading their
        partition back between the neighbours this call placed. One call's records of one
        partition are written in order, so the last is found first, below the partition's end,
        and each earlier one below the one after it (an effectlog record's bytes name its
        event id; equal bytes are told apart by that order)."""
        placed = list(positions)
        for index in reversed(range(len(positions))):
            position = positions[index]
            if position.offset >= 0:
                continue
            same = [(i, p.offset) for i, p in enumerate(placed)
                    if p.partition == position.partition and p.offset >= 0]
            low = max((o for i, o in same if i < index), default=-1) + 1
            high = min((o for i, o in same if i > index), default=None)
            key, value = items[index]
            placed[index] = position._replace(
                offset=self._find(topic, position.partition, key, value, low, high))
        return placed

    def _find(self, topic: str, partition: int, key: str, value: bytes, low: int,
              high: int | None) -> int:
        """The offset of the last record ``key``/``value`` in ``[low, high)`` (``high``: the
        partition's end, asked until ``timeout_s``); scans back at most ``FIND_LIMIT`` records."""
        deadline = time.monotonic() + self.settings.timeout_s
        while True:
            end = high if high is not None else self.partition_end(topic, partition)
            floor, top = max(low, end - FIND_LIMIT), end
            while top > floor:
                start = max(floor, top - 500)
                for record in reversed(self.read_before(topic, partition, start, top - start, top)):
                    if record.key == key and record.value == value:
                        return record.offset
                top = start
            if high is not None or time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"a record to {self.settings.topic(topic)}/{partition} was acknowledged "
                    "without an offset and is not found in the partition: the append is in doubt")
            time.sleep(0.05)

    def _transactional(self) -> TransactionalAppender:
        appender = self._transactions
        if appender is None:
            with self._lock:
                if self._transactions is None:
                    self._transactions = TransactionalAppender(self.settings)
                appender = self._transactions
        return appender

    def _read(self, topic: str, partition: int, offset: int, limit: int, timeout: float,
              end: int | None) -> list[Record]:
        name = self.settings.topic(topic)
        if not 0 <= partition < self.settings.partitions:
            raise InvalidInput(f"{name} has no partition {partition}")
        if limit <= 0:
            return []
        with self._read_lock:
            self._ensure_reader_topic(name)
            return self._reader.read(topic, name, partition, max(offset, 0), limit, timeout, end)

    def _ends(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        name = self.settings.topic(topic)
        if name not in self._checked["reader"]:
            with self._read_lock:
                self._ensure_reader_topic(name)
        rounds = self._end_rounds.get(name)
        if rounds is None:
            with self._lock:
                rounds = self._end_rounds.setdefault(name, EndOffsetRounds(
                    functools.partial(self._all_ends, name)))
        ends = rounds.ends()
        return {p: ends[p] for p in partitions}

    def _all_ends(self, name: str) -> dict[int, int]:
        with self._ends_lock:
            return self._reader.end_offsets(name, list(range(self.settings.partitions)))
