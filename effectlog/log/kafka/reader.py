"""Positioned reads and end offsets on Kafka, over one assign-only consumer (never a group).

End offsets come from one ListOffsets request for all partitions (``offsets_for_times`` with
the "latest" sentinel, at ``read_committed`` isolation), well under a millisecond on loopback.
They are asked through a client of their own: a broker answers the requests of one connection
in order, so a ListOffsets queued behind the reader's idle long-poll fetch would wait it out.
A read that knows where its partition ends stops there and drops its assignment, so no idle
fetch is left in flight to delay the next request; only a read asked to wait (``timeout``)
long-polls, and the broker answers that poll the moment a record arrives.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from typing import cast

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as TP

from effectlog.errors import BackendUnavailable
from effectlog.log.base import EXPIRES_HEADER, PURGED, Record
from effectlog.log.kafka.producer import error_text
from effectlog.log.kafka.settings import ClientConfig, KafkaSettings

log = logging.getLogger(__name__)

_EOF = KafkaError._PARTITION_EOF
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
#: ListOffsets answers while a leader moves, a topic is new or a broker restarted: retried.
#: OFFSET_NOT_AVAILABLE: a leader just elected whose high watermark has not caught up yet.
_LEADER_MOVED = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                 KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.FENCED_LEADER_EPOCH,
                 KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.STALE_BROKER_EPOCH,
                 KafkaError.OFFSET_NOT_AVAILABLE,
                 KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC)  # stale metadata
#: How long a metadata refresh after a failed request may add to the failure.
REFRESH_S = 1.0


def reader_config(settings: KafkaSettings) -> ClientConfig:
    """librdkafka settings of the positioned reader (see docs/kafka/settings.md)."""
    return {
        **settings.client_config(),
        "group.id": f"effectlog-reader-{uuid.uuid4().hex}",  # required by librdkafka; never joined
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",  # a position outside the log is reported, not reset
        "isolation.level": "read_committed",
        "fetch.wait.max.ms": 10,  # an idle long-poll holds the connection at most this long
        "fetch.error.backoff.ms": 20,
        "socket.nagle.disable": True,
        "allow.auto.create.topics": False,
    }


class PartitionReader:
    """Reads one partition at a time from a position; continues the current assignment when
    the next read starts where the last one ended. Not thread-safe: the owner serialises."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._consumer: Consumer | None = None
        self._offsets: Consumer | None = None  # ListOffsets only: never fetches
        self._acknowledged: Consumer | None = None  # the same, at read_uncommitted
        self._cursor: tuple[str, int, int] | None = None  # assignment: (topic, partition, next)

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                **reader_config(self.settings),
                "error_cb": lambda err: log.debug("kafka consumer error: %s", err.str()),
            })
        return self._consumer

    @property
    def offsets_client(self) -> Consumer:
        if self._offsets is None:
            self._offsets = Consumer({
                **reader_config(self.settings),
                "error_cb": lambda err: log.debug("kafka offsets client error: %s", err.str()),
            })
        return self._offsets

    @property
    def acknowledged_client(self) -> Consumer:
        """ListOffsets at ``read_uncommitted``: the high watermark, past open transactions."""
        if self._acknowledged is None:
            self._acknowledged = Consumer({
                **reader_config(self.settings), "isolation.level": "read_uncommitted",
                "error_cb": lambda err: log.debug("kafka offsets client error: %s", err.str()),
            })
        return self._acknowledged

    def unavailable(self, detail: str) -> BackendUnavailable:
        return BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: {detail}")

    def end_offsets(self, name: str, partitions: Sequence[int],
                    acknowledged: bool = False) -> dict[int, int]:
        """The next offset to be read at the end of each partition (one ListOffsets request;
        retried while a new topic's leaders become known or a restarted broker catches up).
        ``acknowledged``: the high watermark (every acknowledged record, those after an open
        transaction too) instead of the last stable offset a ``read_committed`` reader ends at."""
        deadline = time.monotonic() + self.settings.timeout_s
        client = self.acknowledged_client if acknowledged else self.offsets_client
        while True:
            try:
                found = client.offsets_for_times(
                    [TP(name, p, OFFSET_END) for p in partitions], timeout=self.settings.timeout_s)
                errors = [tp.error for tp in found if tp.error is not None]
                if not errors:
                    break
                error: KafkaError = errors[0]
            except KafkaException as exc:
                first = exc.args[0] if exc.args else None
                if not isinstance(first, KafkaError):
                    raise self.unavailable(error_text(exc)) from None
                error = first
            if error.code() not in _LEADER_MOVED or time.monotonic() >= deadline:
                _refresh(client, name, min(REFRESH_S, self.settings.timeout_s))
                raise self.unavailable(f"no end offsets for {name}: {error.str()}")
            time.sleep(0.02)
            _refresh(client, name, self.settings.timeout_s)
        ends = {}
        for tp in found:
            if tp.offset < 0:
                raise self.unavailable(f"no end offset for {name}/{tp.partition}: offset {tp.offset}")
            ends[tp.partition] = tp.offset
        return ends

    def read(self, topic: str, name: str, partition: int, offset: int, limit: int,
             timeout: float, end: int | None = None) -> list[Record]:
        """Up to ``limit`` records from ``offset``; waits up to ``timeout`` s for the first.

        ``end`` (exclusive), when the caller knows it, saves the ListOffsets request.
        """
        consumer = self.consumer
        if end is None:
            end = self.end_offsets(name, [partition])[partition]
        if offset >= end and timeout <= 0:
            return []
        if self._cursor != (name, partition, offset):
            consumer.assign([TP(name, partition, offset)])
            self._cursor = (name, partition, offset)
        deadline = time.monotonic() + timeout
        silent = time.monotonic() + self.settings.timeout_s  # a broker that stopped answering
        records: list[Record] = []
        position = offset
        while len(records) < limit and (position < end or not records):
            batch = consumer.consume(limit - len(records), 0)
            if not batch:
                if records:
                    break
                now = time.monotonic()
                if position >= end and now >= deadline:
                    break
                if now >= max(deadline, silent):
                    self._cursor = None
                    _refresh(consumer, name, min(REFRESH_S, self.settings.timeout_s))
                    raise self.unavailable(f"no records from {name}/{partition} at {position} "
                                           f"within {self.settings.timeout_s}s")
                message = consumer.poll(min(0.5, max(0.001, max(deadline, silent) - now)))
                batch = [message] if message is not None else []
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == _EOF:  # the fetch position, past any control records
                        position = max(position, msg.offset() or 0)
                    elif err.code() in _OUT_OF_RANGE:
                        position = self._out_of_range(name, partition, position)
                        if position < 0:
                            return records
                    else:
                        log.debug("kafka fetch from %s/%d: %s", name, partition, err.str())
                    continue
                at = msg.offset()
                if msg.topic() != name or msg.partition() != partition or at is None \
                        or at < position:
                    continue  # left over from an earlier assignment
                records.append(record_of(topic, partition, at, msg))
                position = at + 1
            self._cursor = (name, partition, position)
        if position >= end:  # stop fetching: no idle long-poll left to delay the next request
            consumer.unassign()
            self._cursor = None
        return records

    def _out_of_range(self, name: str, partition: int, position: int) -> int:
        """Where to continue after OFFSET_OUT_OF_RANGE: the log start, or -1 past the end."""
        try:
            low, high = self.consumer.get_watermark_offsets(TP(name, partition),
                                                           timeout=self.settings.timeout_s)
        except KafkaException as exc:
            self._cursor = None
            raise self.unavailable(error_text(exc)) from None
        if position >= high:
            self._cursor = None
            return -1
        self.consumer.assign([TP(name, partition, low)])
        self._cursor = (name, partition, low)
        return low

    def check_topic(self, name: str) -> int:
        """The partition count of topic ``name`` (which must exist), asked through the reader."""
        try:
            meta = self.consumer.list_topics(name, timeout=self.settings.timeout_s)
        except KafkaException as exc:
            raise self.unavailable(error_text(exc)) from None
        topic = meta.topics.get(name)
        if topic is None or not topic.partitions or (
                topic.error is not None and topic.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
            raise BackendUnavailable(
                f"kafka topic {name} does not exist on {self.settings.bootstrap}: "
                "create it with `effectlog topics create`")
        if topic.error is not None:
            raise self.unavailable(f"topic {name}: {topic.error.str()}")
        return len(topic.partitions)

    def close(self) -> None:
        clients = (self._consumer, self._offsets, self._acknowledged)
        self._consumer, self._offsets, self._acknowledged, self._cursor = None, None, None, None
        for client in clients:
            if client is not None:
                client.close()


def _refresh(client: Consumer, name: str, timeout: float) -> None:
    """Ask for ``name``'s leaders again. A leader that stopped answering (a paused broker
    keeps its connections open) raises no error that would make librdkafka ask: without this,
    a client kept sending to a zombie leader long after another node took its partitions."""
    with contextlib.suppress(KafkaException):
        client.list_topics(name, timeout=timeout)


def record_of(topic: str, partition: int, offset: int, msg: Message) -> Record:
    """The :class:`Record` of a consumed message (a tombstone with the effect it names)."""
    kind, stamp = msg.timestamp()
    key, value = msg.key(), msg.value()
    expires = None
    if not value:
        for name, header in cast(list[tuple[str, bytes | None]], msg.headers() or []):
            if name == EXPIRES_HEADER and header is not None:
                expires = header.decode("utf-8", "replace")
        if expires == PURGED:  # a purge mark is made by reading a SQLite log, never written
            expires = None
    return Record(topic, partition, offset, key.decode("utf-8") if key else "",
                  value or b"", stamp if kind else 0, expires)
