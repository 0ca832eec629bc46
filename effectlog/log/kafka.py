"""Kafka event log: ``kafka://host:9092[,host2:9092]?prefix=effects``, over confluent-kafka.

Logical topics map to ``<prefix>.events`` (compacted) and ``<prefix>.commands``; create
them with ``effectlog topics create`` (:func:`effectlog.log.kafka_admin.create_topics`).
The log never auto-creates topics: a missing topic is a :class:`BackendUnavailable`.
Keys are placed by ``murmur2_random``, the Java client's hash, so ``partition_for``
needs no broker.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.errors import BackendUnavailable, Conflict, InvalidInput
from effectlog.log.base import EventLog, Position, Record
from effectlog.log.kafka_settings import (
    ClientConfig,
    KafkaSettings,
    murmur2,
    murmur2_partition,
)
from effectlog.redact import redact_url

__all__ = ["KafkaLog", "KafkaSettings", "murmur2", "murmur2_partition", "redact_url"]

log = logging.getLogger(__name__)
# Producer settings that make an append durable and its partition computable: never overridable.
_PRODUCER_INVARIANTS = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}
_REPORT_SLACK_S = 5.0  # how long past message.timeout.ms we wait for a delivery report
_EOF = KafkaError._PARTITION_EOF
_OUT_OF_RANGE = (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)
_TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE)


def _error_text(exc: BaseException | KafkaError) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)


class _Delivery:
    """Collects the delivery reports of one append call; ``wait`` returns after the last.

    Reports arrive on the producer's poll thread (or a thread polling while the queue is
    full); ``itertools.count`` is an atomic counter under the GIL, and a plain lock, held
    until the last report, is the cheapest latch to wait on.
    """

    __slots__ = ("_latch", "_reported", "_total", "errors", "positions", "topic")

    def __init__(self, topic: str, count: int) -> None:
        self.topic = topic
        self.positions: list[Position | None] = [None] * count
        self.errors: list[KafkaError] = []
        self._total = count
        self._reported = itertools.count(1)
        self._latch = threading.Lock()
        if count:
            self._latch.acquire()

    def report(self, index: int, err: KafkaError | None, msg: Message) -> None:
        partition, offset = msg.partition(), msg.offset()
        if err is None and partition is not None and offset is not None and offset >= 0:
            self.positions[index] = Position(self.topic, partition, offset)
        else:
            self.errors.append(err or KafkaError(KafkaError._FAIL, "delivery report without offset"))
        if next(self._reported) == self._total:
            self._latch.release()

    def wait(self, timeout: float) -> bool:
        """True once every report arrived; False after ``timeout`` seconds."""
        if not self._total:
            return True
        return self._latch.acquire(timeout=timeout)


class _PolledProducer:
    """A confluent Producer plus the daemon thread that serves its delivery callbacks."""

    def __init__(self, config: ClientConfig) -> None:
        self.stale = False  # set after a failed delivery or a fatal error: replace me
        self.producer = Producer({**config, "error_cb": self._on_error})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="effectlog-kafka-poll",
                                        daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self.stale = True
            log.error("kafka producer fatal error: %s", err.str())
        else:
            log.debug("kafka producer error: %s", err.str())

    def close(self, timeout: float) -> int:
        """Stop polling and flush; returns how many records were left undelivered."""
        self._stop.set()
        self._thread.join()
        return self.producer.flush(timeout)


class KafkaLog(EventLog):
    """The event log on Kafka: idempotent producer (acks=all), assign-only consumer.

    Clients are created on first use, never in ``__init__``. Appends from many threads share
    one producer; each waits only for its own delivery reports. Reads share one consumer.
    """

    compacted = True  # <prefix>.events is a compacted topic

    def __init__(self, settings: KafkaSettings, url: str | None = None) -> None:
        self.settings = settings
        self.url = redact_url(url) if url else f"kafka://{settings.bootstrap}?prefix={settings.prefix}"
        self._lock = threading.Lock()  # guards producer creation and replacement
        self._read_lock = threading.Lock()  # the consumer serves one thread at a time
        self._producer: _PolledProducer | None = None
        self._consumer: Consumer | None = None
        self._cursor: tuple[str, int, int] | None = None  # consumer assignment: next offset
        self._at_eof = False
        self._checked: dict[str, set[str]] = {"writer": set(), "reader": set()}

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

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        name = self.settings.topic(topic)
        if not 0 <= partition < self.settings.partitions:
            raise InvalidInput(f"{name} has no partition {partition}")
        if limit <= 0:
            return []
        with self._read_lock:
            consumer = self._reader()
            self._ensure_topic(name, consumer)
            return self._fetch(consumer, topic, partition, max(offset, 0), limit, timeout)

    def end_offsets(self, topic: str) -> dict[int, int]:
        return self._ends(topic, range(self.settings.partitions))

    def scan(self, topic: str, partition: int, start: int = 0,
             end: int | None = None, batch: int = 5000) -> Iterator[Record]:
        if end is None:  # the end of this one partition is enough
            end = self._ends(topic, [partition])[partition]
        return super().scan(topic, partition, start, end, batch)

    def close(self) -> None:
        with self._lock:
            handle, self._producer = self._producer, None
        if handle is not None:
            left = handle.close(self.settings.timeout_s)
            if left:
                log.warning("%d records unacknowledged when closing %s", left, self.url)
        with self._read_lock:
            consumer, self._consumer, self._cursor = self._consumer, None, None
            self._checked["reader"].clear()
        if consumer is not None:
            consumer.close()

    # -- internals ------------------------------------------------------------------------

    def _unavailable(self, detail: str) -> BackendUnavailable:
        return BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: {detail}")

    def _writer(self) -> _PolledProducer:
        handle = self._producer
        if handle is not None and not handle.stale:
            return handle  # the common case takes no lock: appenders never queue up here
        with self._lock:
            handle = self._producer
            if handle is not None and handle.stale:
                # After a failed delivery the broker may not know our producer id any more (a
                # restarted tansu rejects it forever); a fresh producer gets a new one. The old
                # one finishes other threads' in-flight records in the background.
                threading.Thread(target=handle.close, args=(self.settings.timeout_s,),
                                 name="effectlog-kafka-retire", daemon=True).start()
                handle = self._producer = None
                self._checked["writer"].clear()
            if handle is None:
                timeout_ms = max(1000, int(self.settings.timeout_s * 1000))
                config = {**self.settings.client_config(),
                          "linger.ms": self.settings.linger_ms,
                          "message.timeout.ms": timeout_ms,
                          "request.timeout.ms": min(timeout_ms, 30000),
                          "allow.auto.create.topics": False,
                          **_PRODUCER_INVARIANTS}
                handle = self._producer = _PolledProducer(config)
            return handle

    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                **self.settings.client_config(),
                "group.id": f"effectlog-reader-{uuid.uuid4().hex}",  # required; never joined
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error",
                "fetch.wait.max.ms": 100,
                "allow.auto.create.topics": False,
                "error_cb": lambda err: log.debug("kafka consumer error: %s", err.str()),
            })
        return self._consumer

    def _ensure_topic(self, name: str, client: Producer | Consumer) -> None:
        """Check once per client that ``name`` exists with the configured partition count.

        Asking through the client that will use the topic also warms its metadata cache.
        """
        checked = self._checked["writer" if isinstance(client, Producer) else "reader"]
        if name in checked:
            return
        try:
            meta = client.list_topics(name, timeout=self.settings.timeout_s)
        except KafkaException as exc:
            raise self._unavailable(_error_text(exc)) from None
        topic = meta.topics.get(name)
        if topic is None or not topic.partitions:
            raise BackendUnavailable(
                f"kafka topic {name} does not exist on {self.settings.bootstrap}: "
                "create it with `effectlog topics create`")
        if topic.error is not None:
            raise self._unavailable(f"topic {name}: {topic.error.str()}")
        if len(topic.partitions) != self.settings.partitions:
            raise Conflict(f"kafka topic {name} has {len(topic.partitions)} partitions but the "
                           f"log URL says {self.settings.partitions}: add "
                           f"partitions={len(topic.partitions)} to the URL")
        checked.add(name)

    def _produce(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        name = self.settings.topic(topic)
        handle = self._writer()
        self._ensure_topic(name, handle.producer)
        delivery = _Delivery(topic, len(items))
        produce, budget = handle.producer.produce, self.settings.timeout_s
        for index, (key, value) in enumerate(items):
            callback = functools.partial(delivery.report, index)
            stalled = time.monotonic() + budget
            while True:
                try:
                    produce(name, value, key.encode("utf-8"), on_delivery=callback)
                    break
                except BufferError:  # local queue full: let deliveries drain it
                    if time.monotonic() > stalled:
                        handle.stale = True
                        raise self._unavailable(f"producer queue stayed full for {budget}s") from None
                    handle.producer.poll(0.05)
                except KafkaException as exc:
                    raise self._delivery_error(handle, name, [exc.args[0]], len(items)) from None
        if not delivery.wait(budget + _REPORT_SLACK_S):
            handle.stale = True
            raise self._unavailable(f"no delivery report for {name} within {budget}s; "
                                    "the append may or may not be durable")
        if delivery.errors:
            raise self._delivery_error(handle, name, delivery.errors, len(items))
        return [p for p in delivery.positions if p is not None]

    def _delivery_error(self, handle: _PolledProducer, name: str, errors: list[KafkaError],
                        total: int) -> Exception:
        first = errors[0]
        if isinstance(first, KafkaError) and first.code() in _TOO_LARGE:
            return InvalidInput(f"record too large for kafka topic {name}: {first.str()}")
        handle.stale = True
        what = _error_text(first) if isinstance(first, KafkaError) else str(first)
        return self._unavailable(f"{len(errors)} of {total} records to {name} not delivered: {what}")

    def _fetch(self, consumer: Consumer, topic: str, partition: int, offset: int,
               limit: int, timeout: float) -> list[Record]:
        """Up to ``limit`` records from ``offset``, continuing the current assignment if it fits."""
        name = self.settings.topic(topic)
        if self._cursor != (name, partition, offset):
            consumer.assign([TP(name, partition, offset)])
            self._cursor, self._at_eof = (name, partition, offset), False
        start = time.monotonic()
        wait_until = start + max(timeout, 0.0)
        silent_until = start + max(timeout, min(2.0, self.settings.timeout_s))
        records: list[Record] = []
        answered = self._at_eof
        position = offset
        while len(records) < limit:
            batch = consumer.consume(min(limit - len(records), 1000), 0)
            if not batch:
                now = time.monotonic()
                if records or (answered and now >= wait_until):
                    break
                if not answered and now >= silent_until:
                    # Kafka answers a fetch past the end with OFFSET_OUT_OF_RANGE; tansu stays
                    # silent. A broker that answers metadata is up, so "no records" is the answer.
                    try:
                        consumer.list_topics(name, timeout=max(1.0, self.settings.timeout_s
                                                               - (now - start)))
                    except KafkaException as exc:
                        self._cursor = None
                        raise self._unavailable(_error_text(exc)) from None
                    break
                message = consumer.poll(min(0.1, max(0.0, max(wait_until, silent_until) - now)))
                batch = [message] if message is not None else []
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == _EOF:
                        self._at_eof = answered = True
                    elif err.code() in _OUT_OF_RANGE:
                        position = self._out_of_range(consumer, name, partition, position)
                        if position < 0:
                            self._cursor = None
                            return records
                    else:
                        log.debug("kafka fetch from %s/%d: %s", name, partition, err.str())
                    continue
                msg_offset = msg.offset()
                if msg.topic() != name or msg.partition() != partition or msg_offset is None \
                        or msg_offset < position:
                    continue  # left over from an earlier assignment
                records.append(self._record(topic, partition, msg_offset, msg))
                position, self._at_eof, answered = msg_offset + 1, False, True
            self._cursor = (name, partition, position)
            high = consumer.get_watermark_offsets(TP(name, partition), cached=True)[1]
            if records and (self._at_eof or 0 <= high <= position):
                break
        return records

    @staticmethod
    def _record(topic: str, partition: int, offset: int, msg: Message) -> Record:
        kind, stamp = msg.timestamp()
        key = msg.key()
        return Record(topic, partition, offset, key.decode("utf-8") if key else "",
                      msg.value() or b"", stamp if kind else 0)

    def _out_of_range(self, consumer: Consumer, name: str, partition: int, position: int) -> int:
        """Where to continue after OFFSET_OUT_OF_RANGE: the log start, or -1 past the end."""
        try:
            low, high = consumer.get_watermark_offsets(TP(name, partition),
                                                      timeout=self.settings.timeout_s)
        except KafkaException as exc:
            raise self._unavailable(_error_text(exc)) from None
        if position >= high:
            return -1
        consumer.assign([TP(name, partition, low)])
        return low

    def _ends(self, topic: str, partitions: Sequence[int]) -> dict[int, int]:
        """High watermarks as fetch responses report them.

        ListOffsets alone is not trusted: tansu answers it with the last batch's base offset
        + 1. So we assign at the end and wait for each partition's end-of-partition event,
        whose offset is the fetch response's high watermark (one extra round trip on Kafka).
        """
        name = self.settings.topic(topic)
        with self._read_lock:
            consumer = self._reader()
            self._ensure_topic(name, consumer)
            self._cursor = None
            consumer.assign([TP(name, p, OFFSET_END) for p in partitions])
            ends: dict[int, int] = {}
            seen: dict[int, int] = {}
            deadline = time.monotonic() + self.settings.timeout_s
            try:
                while len(ends) < len(partitions):
                    if time.monotonic() > deadline:
                        raise self._unavailable(f"no end offsets for {name} within "
                                                f"{self.settings.timeout_s}s")
                    for msg in consumer.consume(1000, 0.05):
                        p, err, at = msg.partition(), msg.error(), msg.offset()
                        if p is None or at is None or msg.topic() != name:
                            continue
                        if err is None:
                            seen[p] = max(seen.get(p, 0), at + 1)
                        elif err.code() == _EOF:
                            ends[p] = max(at, seen.get(p, 0))
            finally:
                consumer.unassign()
            return {p: ends[p] for p in sorted(ends)}
