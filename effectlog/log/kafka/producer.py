"""Durable appends to Kafka: one idempotent producer, delivery reports as the only proof.

An append is durable only when every record's delivery report names its offset (acks=all).
Appends that must be atomic (several records of one key) go through
:mod:`effectlog.log.kafka.transactions` instead: librdkafka may split even one
``produce_batch`` call into several record batches, which a writer killed in between leaves
half written (``tests/integration/test_kafka_atomic_append.py`` shows it with Kafka's own
``DumpLogSegments``).
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
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
#: The headers of one produced record (name, value).
Headers = list[tuple[str, str | bytes | None]]
REPORT_SLACK_S = 5.0  # how long past message.timeout.ms we wait for a delivery report
#: librdkafka's statistics carry the idempotent producer's state: how :meth:`AppendProducer.
#: wait_ready` learns the producer id is assigned (a 2 KB string every 100 ms, not parsed).
STATS_INTERVAL_MS = 100
_PID_ASSIGNED = re.compile(r'"idemp_state":\s*"Assigned"')
_TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE)


def error_text(exc: BaseException | KafkaError) -> str:
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    return err.str() if isinstance(err, KafkaError) else str(err)


def producer_config(settings: KafkaSettings) -> ClientConfig:
    """librdkafka settings of the appending producer (see docs/kafka/settings.md)."""
    timeout_ms = max(1000, int(settings.timeout_s * 1000))
    return {**settings.client_config(),
            "linger.ms": settings.linger_ms,  # appends are synchronous: send at once
            "socket.nagle.disable": True,  # small requests on loopback: no 40 ms Nagle stalls
            "message.timeout.ms": timeout_ms,
            "request.timeout.ms": min(timeout_ms, 30000),
            "allow.auto.create.topics": False,
            **INVARIANTS}


class Delivery:
    """Collects the delivery reports of one append call; ``wait`` returns after the last.

    A report of success that names no offset (librdkafka's answer when a retried batch was
    already written: durable, offset unknown) leaves the position at offset -1, for the log
    to find by reading the partition back (:meth:`KafkaLog._place`).
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

    def report(self, index: int, key: bytes, err: KafkaError | None, msg: Message) -> None:
        partition, offset = msg.partition(), msg.offset()
        if err is None and partition is not None and partition >= 0:
            placed = offset if offset is not None and offset >= 0 else -1
            self.positions[index] = Position(self.topic, partition, placed)
        else:
            self.errors.append(err or KafkaError(KafkaError._FAIL, "delivery report without partition"))
        if next(self._reported) == self._total:
            self._latch.release()

    def wait(self, timeout: float) -> bool:
        """True once every report arrived; False after ``timeout`` seconds."""
        return not self._total or self._latch.acquire(timeout=timeout)


class AppendProducer:
    """A confluent Producer, the daemon thread serving its callbacks, and durable appends.

    ``stale`` is set after a fatal error or a delivery report that never came: the owner
    replaces the producer. A delivery that failed (timed out on a dead or paused leader, say)
    leaves it in use: librdkafka bumps the idempotent producer's epoch by itself, whereas a
    new producer needs a new producer id, which brokers cannot hand out while the controller
    is away (30 s by default; see docs/kafka/cluster.md).
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.stale = False
        self._ready = threading.Event()
        self.producer = Producer({**producer_config(settings), "error_cb": self._on_error,
                                  "statistics.interval.ms": STATS_INTERVAL_MS,
                                  "stats_cb": self._on_stats})
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

    def _on_stats(self, text: str) -> None:
        if not self._ready.is_set() and _PID_ASSIGNED.search(text):
            self._ready.set()

    def wait_ready(self, timeout: float) -> bool:
        """True once the broker assigned this producer its id (librdkafka asks for one once
        it has a connection: read metadata first); False after ``timeout`` seconds."""
        return self._ready.wait(timeout)

    def unavailable(self, detail: str) -> BackendUnavailable:
        return BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: {detail}")

    def append(self, name: str, topic: str, items: Sequence[tuple[str, bytes]],
               headers: Sequence[Headers] | None = None) -> list[Position]:
        """Produce ``items`` to topic ``name`` (``headers``: each item's record headers) and
        wait for every delivery report (a durable record whose report named no offset is at
        offset -1; see :class:`Delivery`)."""
        delivery = Delivery(topic, len(items))
        produce, partitions = self.producer.produce, self.settings.partitions
        budget = self.settings.timeout_s
        for index, (key, value) in enumerate(items):
            encoded = key.encode("utf-8")
            callback = functools.partial(delivery.report, index, encoded)
            partition = murmur2_partition(encoded, partitions)
            stalled = time.monotonic() + budget
            while True:
                try:
                    # an empty value is a tombstone: null, as Kafka's compaction knows it
                    if headers is None:
                        produce(name, value or None, encoded, partition=partition,
                                on_delivery=callback)
                    else:
                        produce(name, value or None, encoded, partition=partition,
                                on_delivery=callback, headers=headers[index])
                    break
                except BufferError:  # local queue full: let deliveries drain it
                    if time.monotonic() > stalled:
                        self.stale = True
                        raise self.unavailable(f"producer queue stayed full for {budget}s") from None
                    self.producer.poll(0.05)
                except KafkaException as exc:
                    raise self._failed(name, [exc.args[0]], len(items)) from None
        if not delivery.wait(budget + REPORT_SLACK_S):
            self.stale = True
            raise self.unavailable(f"no delivery report for {name} within {budget}s; "
                                   "the append may or may not be durable")
        if delivery.errors:
            raise self._failed(name, delivery.errors, len(items))
        return [p for p in delivery.positions if p is not None]

    def _failed(self, name: str, errors: list[KafkaError], total: int) -> Exception:
        first = errors[0]
        if isinstance(first, KafkaError) and first.code() in _TOO_LARGE:
            return InvalidInput(f"record too large for kafka topic {name}: {first.str()}")
        if any(isinstance(e, KafkaError) and e.fatal() for e in errors):
            self.stale = True
        return self.unavailable(f"{len(errors)} of {total} records to {name} not delivered: "
                                f"{error_text(first)}")

    def close(self, timeout: float) -> int:
        """Stop polling and flush; returns how many records were left undelivered."""
        self._stop.set()
        self._thread.join()
        return self.producer.flush(timeout)
