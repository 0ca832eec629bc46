"""The Kafka changelog writer's transaction handling, against a producer that fails the way
librdkafka does when the transaction coordinator is paused (no broker needed)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from effectlog.errors import BackendUnavailable, Fenced
from effectlog.log.kafka.changelog import KafkaChangelogWriter

TIMED_OUT = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed to flush all outstanding "
                                      "messages within the API timeout", retriable=True))
REQUIRES_ABORT = KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "3 message(s) timed out",
                                           txn_requires_abort=True))
FATAL = KafkaException(KafkaError(KafkaError.INVALID_TXN_STATE, "invalid state", fatal=True))


class Producer:
    """Records the transactional calls; ``fail`` maps a call to the exceptions it raises next.
    Like librdkafka, an abort while a commit is in progress is refused."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.fail: dict[str, list[BaseException]] = {}
        self.committing = False

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == "abort_transaction" and self.committing:
            raise KafkaException(KafkaError(KafkaError._CONFLICT, "Conflicting "
                                            "commit_transaction API call is already in progress"))
        queued = self.fail.get(name)
        if queued:
            raise queued.pop(0)

    def begin_transaction(self) -> None:
        self._call("begin_transaction")

    def produce(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("produce")

    def commit_transaction(self, timeout: float) -> None:
        self.committing = True
        try:
            self._call("commit_transaction")
        except KafkaException as exc:  # a commit that needs an abort is over
            self.committing = not exc.args[0].txn_requires_abort()
            raise
        self.committing = False

    def abort_transaction(self, timeout: float) -> None:
        self._call("abort_transaction")
        self.committing = False

    def purge(self) -> None:
        self._call("purge")

    def flush(self, timeout: float) -> int:
        self._call("flush")
        return 0


def writer(producer: Producer) -> KafkaChangelogWriter:
    made = KafkaChangelogWriter.__new__(KafkaChangelogWriter)
    made.settings = type("S", (), {"timeout_s": 1.0, "bootstrap": "127.0.0.1:9"})()  # type: ignore[assignment]
    made.partition, made.name = 0, "t.state"
    made._producer = producer  # type: ignore[assignment]
    made._unfinished = None
    return made


def failing(**calls: list[BaseException]) -> tuple[Producer, KafkaChangelogWriter]:
    """A writer on a fake producer whose named calls raise the given exceptions, in turn."""
    producer = Producer()
    producer.fail.update(calls)
    return producer, writer(producer)


def publish(changelog: KafkaChangelogWriter) -> None:
    changelog.publish([(b"k", b"v")], b"checkpoint")


def test_a_commit_that_timed_out_is_finished_by_the_next_publication_not_aborted() -> None:
    producer, changelog = failing(commit_transaction=[TIMED_OUT])
    with pytest.raises(BackendUnavailable):
        publish(changelog)
    assert "abort_transaction" not in producer.calls  # librdkafka would refuse it
    producer.calls.clear()
    publish(changelog)  # the broker is back
    assert producer.calls[:2] == ["commit_transaction", "begin_transaction"]
    assert producer.calls[-1] == "commit_transaction"


def test_a_commit_that_can_only_be_aborted_is_aborted_and_the_publication_goes_on() -> None:
    """The records of a commit retried after the broker was away timed out meanwhile: the
    next publication aborts that transaction and publishes (its changes carry them)."""
    producer, changelog = failing(commit_transaction=[TIMED_OUT, REQUIRES_ABORT])
    with pytest.raises(BackendUnavailable):
        publish(changelog)
    producer.calls.clear()
    publish(changelog)
    assert producer.calls == ["commit_transaction", "abort_transaction", "begin_transaction",
                              "produce", "produce", "commit_transaction"]


def test_an_abort_the_broker_did_not_answer_is_asked_again_before_the_next_transaction() -> None:
    producer, changelog = failing(commit_transaction=[REQUIRES_ABORT],
                                  abort_transaction=[TIMED_OUT, TIMED_OUT])
    with pytest.raises(BackendUnavailable):  # the commit needs an abort, which times out
        publish(changelog)
    with pytest.raises(BackendUnavailable):  # the abort again, still away: nothing begins
        publish(changelog)
    assert producer.calls.count("begin_transaction") == 1
    producer.calls.clear()
    publish(changelog)  # back: abort, then publish
    assert producer.calls[:2] == ["abort_transaction", "begin_transaction"]
    assert producer.calls[-1] == "commit_transaction"


def test_a_publication_failing_before_its_commit_is_aborted_at_once() -> None:
    producer, changelog = failing(begin_transaction=[TIMED_OUT])
    with pytest.raises(BackendUnavailable):
        publish(changelog)
    assert "abort_transaction" not in producer.calls  # nothing began
    producer.calls.clear()

    def failing_produce(*args: Any, **kwargs: Any) -> None:
        producer.calls.append("produce")
        raise TIMED_OUT

    producer.produce = failing_produce  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailable):
        publish(changelog)
    assert producer.calls == ["begin_transaction", "produce", "abort_transaction"]
    assert changelog._unfinished is None


def test_a_fatal_producer_is_fenced_and_closing_it_raises_nothing() -> None:
    producer, changelog = failing(begin_transaction=[FATAL], abort_transaction=[FATAL], flush=[FATAL])
    with pytest.raises(Fenced):
        publish(changelog)
    changelog.close()  # inside a revoke callback: an exception here would escape the group
    assert producer.calls[-3:] == ["abort_transaction", "purge", "flush"]
