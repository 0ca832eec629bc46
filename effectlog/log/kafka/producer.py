"""Durable appends to Kafka: one idempotent producer, delivery reports as the only proof.

An append is durable only when every record's delivery report names its offset (acks=all).
The records of one call that share a key are enqueued with ``produce_batch`` onto the key's
partition in one step (never partly: room is reserved first), and no more is ever queued than
fits in one record batch, so librdkafka writes them into ONE record batch: the broker appends a
batch whole or not at all and exposes it whole to readers
(``tests/integration/test_kafka_atomic_append.py`` checks the batch boundaries with Kafka's own
``DumpLogSegments`` after killing writers mid-append).
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Sequence

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.log.base import Position
from effectlog.log.kafka.partitioner import murmur2_partition
from effectlog.log.kafka.settings import ClientConfig, KafkaSettings

log = logging.getLogger(__name__)

#: What makes an append durable and its partition computable: never overridable.
INVARIANTS = {"enable.idempotence": True, "acks": "all", "partitioner": "murmur2_random"}
#: librdkafka cuts a record batch at ``batch.num.messages`` or ``batch.size``; while no more
#: than that is queued, every ``produce_batch`` call lands inside one batch.
BATCH_MESSAGES = 10_000
BATCH_BYTES = 1_000_000
MAX_QUEUED_MESSAGES = BATCH_MESSAGES // 2
MAX_QUEUED_BYTES = BATCH_BYTES // 2  # keys + values; leaves room for per-record overhead
REPORT_SLACK_S = 5.0  # how long past message.timeout.ms we wait for a delivery report
_TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE)


def error_text(exc: BaseException | KafkaError) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)


def producer_config(settings: KafkaSettings) -> ClientConfig:
    """librdkafka settings of the appending producer (see README "Kafka settings")."""
    timeout_ms = max(1000, int(settings.timeout_s * 1000))
    return {**settings.client_config(),
            "linger.ms": settings.linger_ms,  # appends are synchronous: send at once
            "socket.nagle.disable": True,  # small requests on loopback: no 40 ms Nagle stalls
            "message.timeout.ms": timeout_ms,
            "request.timeout.ms": min(timeout_ms, 30000),
            "batch.num.messages": BATCH_MESSAGES,
            "batch.size": BATCH_BYTES,
            # effectlog reserves queue room itself (AppendProducer._reserve); librdkafka's
            # own limits sit above it, so a produce_batch is never refused halfway.
            "queue.buffering.max.messages": 2 * BATCH_MESSAGES,
            "queue.buffering.max.kbytes": 2 * BATCH_BYTES // 1024,
            "allow.auto.create.topics": False,
            **INVARIANTS}


class Delivery:
    """Collects the delivery reports of one append call; ``wait`` returns after the last.

    Reports arrive on the producer's poll thread; ``itertools.count`` is an atomic counter
    under the GIL, and a plain lock, held until the last report, is the cheapest latch.
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
        return not self._total or self._latch.acquire(timeout=timeout)


class AppendProducer:
    """A confluent Producer, the daemon thread serving its callbacks, and durable appends.

    ``stale`` is set after a failed delivery or a fatal error: the owner replaces the
    producer (the broker may no longer know its producer id).
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.stale = False
        self.producer = Producer({**producer_config(settings), "error_cb": self._on_error})
        self._room = threading.Condition()  # guards the two counters of queued records
        self._queued_messages = 0
        self._queued_bytes = 0
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

    def unavailable(self, detail: str) -> BackendUnavailable:
        return BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: {detail}")

    def append(self, name: str, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        """Produce ``items`` to topic ``name`` and wait for every delivery report.

        Consecutive items of one key go in one ``produce_batch`` call (one record batch).
        """
        delivery = Delivery(topic, len(items))
        partitions = self.settings.partitions
        start = 0
        while start < len(items):
            key = items[start][0]
            stop = start + 1
            while stop < len(items) and items[stop][0] == key:
                stop += 1
            encoded = key.encode("utf-8")
            self._enqueue(name, murmur2_partition(encoded, partitions), encoded,
                          items, start, stop, delivery)
            start = stop
        budget = self.settings.timeout_s
        if not delivery.wait(budget + REPORT_SLACK_S):
            self.stale = True
            raise self.unavailable(f"no delivery report for {name} within {budget}s; "
                                   "the append may or may not be durable")
        if delivery.errors:
            raise self._failed(name, delivery.errors, len(items))
        return [p for p in delivery.positions if p is not None]

    def _enqueue(self, name: str, partition: int, key: bytes, items: Sequence[tuple[str, bytes]],
                 start: int, stop: int, delivery: Delivery) -> None:
        count = stop - start
        size = sum(len(key) + len(items[i][1]) for i in range(start, stop))
        if count > MAX_QUEUED_MESSAGES or size > MAX_QUEUED_BYTES:
            raise InvalidInput(f"one append holds at most {MAX_QUEUED_MESSAGES} records and "
                               f"{MAX_QUEUED_BYTES} bytes of one key")
        callback = self._delivered
        with self._room:
            self._reserve(count, size)
            try:
                if count == 1:
                    self.producer.produce(name, items[start][1], key, partition=partition,
                                          on_delivery=functools.partial(
                                              callback, delivery, start, size))
                    return
                messages = [{"key": key, "value": items[i][1],
                             "callback": functools.partial(callback, delivery, i,
                                                           len(key) + len(items[i][1]))}
                            for i in range(start, stop)]
                queued = self.producer.produce_batch(name, messages, partition=partition)
            except (BufferError, KafkaException) as exc:
                self._release(count, size)
                if isinstance(exc, BufferError):
                    raise self.unavailable(f"producer queue of {name} full") from None
                raise self._failed(name, [exc.args[0]], count) from None
            if queued != count:  # cannot happen below librdkafka's limits; never hide it
                self.stale = True
                raise self.unavailable(f"only {queued} of {count} records of one key were "
                                       f"queued for {name}; the append may be partial")

    def _reserve(self, count: int, size: int) -> None:
        """Wait (holding ``_room``) until ``count`` records of ``size`` bytes fit the queue."""
        deadline = time.monotonic() + self.settings.timeout_s
        while (self._queued_messages + count > MAX_QUEUED_MESSAGES
               or self._queued_bytes + size > MAX_QUEUED_BYTES):
            left = deadline - time.monotonic()
            if left <= 0 or not self._room.wait(left):
                self.stale = True
                raise self.unavailable(f"producer queue stayed full for {self.settings.timeout_s}s")
        self._queued_messages += count
        self._queued_bytes += size

    def _release(self, count: int, size: int) -> None:
        self._queued_messages -= count
        self._queued_bytes -= size
        self._room.notify_all()

    def _delivered(self, delivery: Delivery, index: int, size: int, err: KafkaError | None,
                   msg: Message) -> None:
        with self._room:
            self._release(1, size)
        delivery.report(index, err, msg)

    def _failed(self, name: str, errors: list[KafkaError], total: int) -> Exception:
        first = errors[0]
        if isinstance(first, KafkaError) and first.code() in _TOO_LARGE:
            return InvalidInput(f"record too large for kafka topic {name}: {first.str()}")
        if isinstance(first, KafkaError) and first.code() == KafkaError._QUEUE_FULL:
            return self.unavailable(f"producer queue full for {name}")
        self.stale = True
        return self.unavailable(f"{len(errors)} of {total} records to {name} not delivered: "
                                f"{error_text(first)}")

    def close(self, timeout: float) -> int:
        """Stop polling and flush; returns how many records were left undelivered."""
        self._stop.set()
        self._thread.join()
        return self.producer.flush(timeout)
