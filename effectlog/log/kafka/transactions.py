"""Atomic multi-record appends on Kafka: one transaction, committed for many callers at once.

The records of one key that must be seen together (a worker's CREATE + RESERVE + DISPATCH) are
produced inside a Kafka transaction; readers use ``isolation.level=read_committed``, so they
see all of them or none, whatever happens to the writer. A commit costs a few round trips to
the transaction coordinator, so concurrent appends share one (group commit): the caller that
finds no commit under way commits, in one transaction, its own append and every append that
arrives meanwhile, round after round until none is waiting; the others wait for their round.

A commit returns once the coordinator has decided; the markers that make the records visible
reach the partitions a moment later, so an append returns only when the partitions' last
stable offsets have passed its records (read-your-writes for every ``read_committed`` reader).

``transactional.id`` names the writer instance (URL parameter ``transactional_id``; by default
host, process and a random suffix): a restarted instance with the same id fences its zombie
(``init_transactions`` bumps the producer epoch, and the old one's commits are refused).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Message, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.errors import BackendUnavailable
from effectlog.log.base import Position
from effectlog.log.kafka.partitioner import murmur2_partition
from effectlog.log.kafka.producer import REPORT_SLACK_S, Delivery, error_text, producer_config
from effectlog.log.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)


def default_transactional_id(settings: KafkaSettings) -> str:
    return f"effectlog-{settings.prefix}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass(eq=False)
class _Pending:
    """One caller's append, waiting for the next commit."""

    name: str
    topic: str
    items: Sequence[tuple[str, bytes]]
    done: threading.Event = field(default_factory=threading.Event)
    positions: list[Position] | None = None
    error: BackendUnavailable | None = None


class TransactionalAppender:
    """Group-committing transactional producer; :meth:`append` blocks until its commit."""

    def __init__(self, settings: KafkaSettings, transactional_id: str | None = None) -> None:
        self.settings = settings
        self.transactional_id = transactional_id or settings.transactional_id \
            or default_transactional_id(settings)
        self._producer: Producer | None = None
        self._offsets: Consumer | None = None  # asks the last stable offsets after a commit
        self._lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._committing = False
        self._closed = False

    def unavailable(self, detail: str) -> BackendUnavailable:
        return BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: {detail}")

    def append(self, name: str, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        """Append ``items`` in a transaction; returns their positions once it committed."""
        pending = _Pending(name, topic, items)
        with self._lock:
            if self._closed:
                raise self.unavailable("the transactional appender is closed")
            self._queue.append(pending)
            lead = not self._committing
            self._committing = True
        if lead:
            self._commit_rounds()
        elif not pending.done.wait(2 * self.settings.timeout_s + REPORT_SLACK_S):
            raise self.unavailable(f"no commit for {name} within {2 * self.settings.timeout_s}s; "
                                   "the append is in doubt")
        if pending.error is not None:
            raise pending.error
        assert pending.positions is not None
        return pending.positions

    def _commit_rounds(self) -> None:
        """Commit what is waiting, round after round, until nothing is."""
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self._committing = False
                    return
            self._commit(batch)

    def _ready(self) -> Producer:
        if self._producer is None:
            producer = Producer({**producer_config(self.settings),
                                 "transactional.id": self.transactional_id,
                                 # a writer killed mid-transaction holds read_committed
                                 # readers back until its transaction times out
                                 "transaction.timeout.ms": max(1000, int(self.settings.timeout_s * 1000))})
            try:
                producer.init_transactions(self.settings.timeout_s)
            except KafkaException as exc:
                raise self.unavailable(f"cannot start transactions: {error_text(exc)}") from None
            self._producer = producer
        return self._producer

    def _commit(self, batch: list[_Pending]) -> None:
        deliveries: list[Delivery] = []
        try:
            producer = self._ready()
            producer.begin_transaction()
            partitions = self.settings.partitions
            for pending in batch:
                delivery = Delivery(pending.topic, len(pending.items))
                deliveries.append(delivery)
                for index, (key, value) in enumerate(pending.items):
                    encoded = key.encode("utf-8")
                    producer.produce(pending.name, value, encoded,
                                     partition=murmur2_partition(encoded, partitions),
                                     on_delivery=_reporter(delivery, index, encoded))
            producer.commit_transaction(self.settings.timeout_s)
        except (KafkaException, BackendUnavailable) as exc:
            error = exc if isinstance(exc, BackendUnavailable) else \
                self.unavailable(f"transaction not committed: {error_text(exc)}")
            self._recover(exc)
            for pending in batch:
                pending.error = error
                pending.done.set()
            return
        last: dict[tuple[str, int], int] = {}
        for pending, delivery in zip(batch, deliveries, strict=True):
            if delivery.errors or any(p is None for p in delivery.positions):
                pending.error = self.unavailable("a committed transaction lacks delivery reports")
                continue
            pending.positions = [p for p in delivery.positions if p is not None]
            for position in pending.positions:
                where = (pending.name, position.partition)
                last[where] = max(last.get(where, -1), position.offset)
        try:
            self._wait_visible(last)
        except BackendUnavailable as exc:
            for pending in batch:
                pending.error = pending.error or exc
        for pending in batch:
            pending.done.set()

    def _wait_visible(self, last: dict[tuple[str, int], int]) -> None:
        """Until each partition's last stable offset is past the committed records."""
        if self._offsets is None:
            self._offsets = Consumer({**self.settings.client_config(),
                                      "group.id": f"effectlog-txn-{uuid.uuid4().hex}",
                                      "isolation.level": "read_committed",
                                      "socket.nagle.disable": True})
        deadline = time.monotonic() + self.settings.timeout_s
        waiting = dict(last)
        while waiting:
            try:
                found = self._offsets.offsets_for_times(
                    [TP(name, p, OFFSET_END) for name, p in waiting], timeout=self.settings.timeout_s)
            except KafkaException as exc:
                raise self.unavailable(f"committed, but not visible yet: {error_text(exc)}") from None
            for tp in found:
                if tp.error is None and tp.offset > waiting.get((tp.topic, tp.partition), tp.offset):
                    waiting.pop((tp.topic, tp.partition), None)
            if waiting:
                if time.monotonic() > deadline:
                    raise self.unavailable(f"committed records not visible within "
                                           f"{self.settings.timeout_s}s")
                time.sleep(0.0005)

    def _recover(self, exc: BaseException) -> None:
        """After a failed commit: abort if the transaction allows it, else start afresh."""
        err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
        producer = self._producer
        if producer is not None and isinstance(err, KafkaError) and err.txn_requires_abort():
            try:
                producer.abort_transaction(self.settings.timeout_s)
                return
            except KafkaException as again:
                log.warning("aborting a kafka transaction failed: %s", error_text(again))
        if producer is not None:
            log.warning("replacing the transactional producer after: %s", error_text(exc))
            self._producer = None
            producer.flush(0)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        if self._producer is not None:
            self._producer.flush(self.settings.timeout_s)
        if self._offsets is not None:
            self._offsets.close()


def _reporter(delivery: Delivery, index: int, key: bytes):  # type: ignore[no-untyped-def]
    def report(err: KafkaError | None, msg: Message) -> None:
        delivery.report(index, key, err, msg)
    return report
