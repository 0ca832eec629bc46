"""The changelog on Kafka: ``<prefix>.state``, compacted, partition N for events partition N.

A publication is one Kafka transaction of the partition's writer, whose ``transactional.id``
names the partition (``effectlog-<prefix>-state-p<N>``): a new owner's ``init_transactions``
aborts whatever the previous owner left open and fences it, so a paused owner that resumes
after a rebalance can no longer commit anything, and readers (``read_committed``) never see
what it did not commit. The checkpoint record is the last record of every publication, so the
latest one sits just before the partition's last stable offset: it is found by reading a
short window there.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.errors import BackendUnavailable, Fenced, LogMissing
from effectlog.log.base import STATE
from effectlog.log.changelog import (
    CHECKPOINT_KEY,
    Change,
    Changelog,
    ChangelogWriter,
    ReadStopped,
    read_to_settled_end,
)
from effectlog.log.kafka.producer import error_text, producer_config
from effectlog.log.kafka.settings import ClientConfig, KafkaSettings

log = logging.getLogger(__name__)

_FENCED = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
           KafkaError.INVALID_PRODUCER_ID_MAPPING, KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
_WINDOW = 16  # records read before the end to find the last checkpoint (grown when needed)
#: Records a restore asks the consumer for at a time, and how long one ask waits to fill it: a
#: batch call returns only full or after its wait, even once the partition's end was delivered,
#: so a long wait would idle at the end of every read (the restore's and each last checkpoint's).
READ_BATCH = 5000
READ_WAIT_S = 0.02


def read_config(settings: KafkaSettings) -> ClientConfig:
    """librdkafka settings of the changelog's reader: assign-only, committed records only."""
    return {
        **settings.client_config(),
        "group.id": f"effectlog-changelog-{uuid.uuid4().hex}",  # never joined
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",  # what a fenced or crashed owner left open
        "fetch.wait.max.ms": 10,
        "allow.auto.create.topics": False,
    }


def _fenced(exc: KafkaException) -> bool:
    """The producer may do nothing more: a later owner fenced it, or it hit a fatal error."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and (err.code() in _FENCED or err.fatal())


def _commit_again(exc: KafkaException) -> bool:
    """Whether a commit that raised ``exc`` may be asked again (it timed out); if not (its
    records timed out, say), the transaction can only be aborted."""
    err = exc.args[0] if exc.args else None
    return isinstance(err, KafkaError) and err.retriable() and not err.txn_requires_abort()


def transactional_id(settings: KafkaSettings, partition: int) -> str:
    """The transactional id of partition ``partition``'s publisher: one per partition, so
    its next owner fences this one."""
    return f"effectlog-{settings.prefix}-state-p{partition}"


#: How long the transaction coordinator lets a publication stay open before aborting it. A
#: paused coordinator counts its pause too: with 10 s, an 8 s pause made it abort a
#: publication whose commit was about to be retried, which made the producer fatal. A killed
#: owner's open publication holds nothing back meanwhile: its next owner aborts it at once.
TRANSACTION_TIMEOUT_MS = 60_000


class KafkaChangelogWriter(ChangelogWriter):
    """A transactional producer that publishes one partition of ``<prefix>.state``.

    A publication whose end failed (a commit that timed out, an abort the broker did not
    answer) leaves that end to finish first (``_unfinished``): librdkafka refuses any other
    transactional call until it is."""

    def __init__(self, settings: KafkaSettings, partition: int) -> None:
        self.settings = settings
        self.partition = partition
        self.name = settings.topic(STATE)
        timeout_ms = max(1000, int(settings.timeout_s * 1000))
        self._producer = Producer({
            **producer_config(settings),
            "transactional.id": transactional_id(settings, partition),
            "transaction.timeout.ms": max(TRANSACTION_TIMEOUT_MS, 2 * timeout_ms),
            "error_cb": lambda err: log.debug("changelog producer error: %s", err.str()),
        })
        self._unfinished: str | None = None  # "commit" or "abort": asked for, not finished
        try:
            self._producer.init_transactions(settings.timeout_s)
        except KafkaException as exc:
            raise self._failed(exc, "take") from None

    def publish(self, changes: Sequence[Change], checkpoint: bytes) -> None:
        producer = self._producer
        try:
            self._finish()
        except KafkaException as exc:  # still unfinished: retried by the next publication
            raise self._failed(exc, "publish") from None
        try:
            producer.begin_transaction()
            self._unfinished = "abort"  # until the commit is asked for
            for key, value in changes:
                self._produce(key, value)
            self._produce(CHECKPOINT_KEY, checkpoint)
            self._unfinished = "commit"
            producer.commit_transaction(self.settings.timeout_s)
            self._unfinished = None
        except KafkaException as exc:
            error = self._failed(exc, "publish")
            if isinstance(error, Fenced):
                raise error from None
            if self._unfinished == "commit" and not _commit_again(exc):
                self._unfinished = "abort"
            if self._unfinished == "abort":
                with contextlib.suppress(KafkaException):  # else retried by the next one
                    self._finish()
            raise error from None

    def _finish(self) -> None:
        """Finish the last publication's end. A commit that timed out is retried, not
        aborted (librdkafka refuses an abort while it is in progress); one that can only be
        aborted now is, and this publication carries its records again anyway."""
        if self._unfinished == "commit":
            try:
                self._producer.commit_transaction(self.settings.timeout_s)
                self._unfinished = None
            except KafkaException as exc:
                if _commit_again(exc) or _fenced(exc):
                    raise
                self._unfinished = "abort"
        if self._unfinished == "abort":
            self._producer.abort_transaction(self.settings.timeout_s)
            self._unfinished = None

    def _produce(self, key: bytes, value: bytes | None) -> None:
        while True:
            try:
                self._producer.produce(self.name, value, key, partition=self.partition)
                return
            except BufferError:  # the local queue is full: let it drain
                self._producer.poll(0.05)

    def _failed(self, exc: KafkaException, doing: str) -> Fenced | BackendUnavailable:
        if _fenced(exc):
            return Fenced(f"changelog partition {self.partition} of {self.name}: this writer "
                          f"was fenced (a later owner took it, or the coordinator ended its "
                          f"open publication) and may not {doing} it any more "
                          f"({error_text(exc)})", "zombie_owner")
        return BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: cannot "
                                  f"{doing} changelog partition {self.partition}: "
                                  f"{error_text(exc)}")

    def close(self) -> None:
        """Let go (best effort, never raises): what is not committed is aborted by the next
        owner's ``init_transactions`` anyway. A producer that hit a fatal error (its
        transaction outlived ``transaction.timeout.ms`` while the broker was away) raises
        from every call, so nothing here may propagate into a rebalance callback."""
        producer = self._producer
        for step in (lambda: producer.abort_transaction(0.5), lambda: producer.purge(),
                     lambda: producer.flush(0.5)):
            try:
                step()
            except Exception as exc:  # KafkaException, or a fatal KafkaError
                log.debug("closing changelog partition %d's writer: %s", self.partition, exc)


class KafkaChangelog(Changelog):
    """``<prefix>.state``: read with positioned, committed-only reads; written per partition."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.name = settings.topic(STATE)

    def writer(self, partition: int) -> KafkaChangelogWriter:
        return KafkaChangelogWriter(self.settings, partition)

    def read(self, partition: int, stop: threading.Event | None = None) -> Iterator[Change]:
        consumer = self._consumer()
        try:
            yield from read_to_settled_end(
                lambda: self._end(consumer, partition),
                lambda start, end: self._records(consumer, partition, start, end, stop),
                stop=stop)
        finally:
            consumer.close()

    def last_checkpoint(self, partition: int) -> bytes | None:
        consumer = self._consumer()
        try:
            end = self._end(consumer, partition)
            window = _WINDOW
            while True:
                start = max(0, end - window)
                found = None
                for key, value in self._records(consumer, partition, start, end):
                    if key == CHECKPOINT_KEY:
                        found = value
                if found is not None or start == 0:
                    return found
                window *= 8
        finally:
            consumer.close()

    # -- internals -----------------------------------------------------------------------

    def _consumer(self) -> Consumer:
        return Consumer({
            **read_config(self.settings),
            "error_cb": lambda err: log.debug("changelog reader error: %s", err.str()),
        })

    def _end(self, consumer: Consumer, partition: int) -> int:
        """The partition's last stable offset: where a committed-only read ends."""
        try:
            [found] = consumer.offsets_for_times([TP(self.name, partition, OFFSET_END)],
                                                 timeout=self.settings.timeout_s)
        except KafkaException as exc:
            raise BackendUnavailable(f"kafka broker {self.settings.bootstrap} unreachable: end "
                                     f"of {self.name}/{partition}: {error_text(exc)}") from None
        if found.error is not None and found.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise LogMissing(f"no changelog topic {self.name}: run `effectlog topics create`")
        if found.error is not None or found.offset < 0:
            raise BackendUnavailable(f"no end offset for {self.name}/{partition}: "
                                     f"{found.error.str() if found.error else found.offset}")
        return int(found.offset)

    def _records(self, consumer: Consumer, partition: int, start: int, end: int,
                 stop: threading.Event | None = None) -> Iterator[Change]:
        """The committed records of ``[start, end)``; :class:`ReadStopped` once ``stop``
        is set (checked at every ask of the consumer, so within READ_WAIT_S while the
        broker is silent)."""
        if start >= end:
            return
        consumer.assign([TP(self.name, partition, start)])
        quiet_s = max(30.0, 3 * self.settings.timeout_s)
        deadline = time.monotonic() + quiet_s
        try:
            while True:
                if stop is not None and stop.is_set():
                    raise ReadStopped
                batch = consumer.consume(READ_BATCH, READ_WAIT_S)
                if batch:
                    deadline = time.monotonic() + quiet_s  # bounded by silence, not by size
                for msg in batch:
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            return  # everything readable below the end was delivered
                        raise BackendUnavailable(f"reading {self.name}/{partition}: {err.str()}")
                    offset = msg.offset()
                    if offset is not None and offset >= end:
                        return
                    key = msg.key()
                    if key is not None:
                        yield bytes(key), msg.value()
                if not batch and time.monotonic() > deadline:
                    raise BackendUnavailable(f"kafka broker {self.settings.bootstrap}: nothing "
                                             f"of {self.name}/{partition} came for {quiet_s:g}s "
                                             "before its end")
        finally:
            consumer.unassign()
