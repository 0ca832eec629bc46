"""A failed delivery keeps the appending producer; only a fatal error or a missing delivery
report retires it.

A new producer needs a new idempotent producer id, and a broker whose request to a paused
controller hangs hands none out for ``controller.socket.timeout.ms``: replacing the producer
after every timed-out delivery turned one failed append on a paused leader into 30 s of them
(``tests/integration/test_zombie_leader_kafka.py``). librdkafka recovers an idempotent producer
from a timed-out delivery itself, by bumping its epoch.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError

from effectlog.errors import BackendUnavailable
from effectlog.log.kafka.producer import AppendProducer
from effectlog.log.kafka.settings import KafkaSettings

#: Nothing listens on port 9 of the loopback: every delivery times out (after 1 s).
SETTINGS = KafkaSettings("127.0.0.1:9", prefix="t", timeout_s=1.0)


@pytest.fixture
def producer() -> Iterator[AppendProducer]:
    handle = AppendProducer(SETTINGS)
    yield handle
    handle.close(0.1)


def test_a_timed_out_delivery_fails_the_append_and_keeps_the_producer(
        producer: AppendProducer) -> None:
    with pytest.raises(BackendUnavailable, match=r"1 of 1 records to t\.events not delivered: "
                                                 r"Local: Message timed out"):
        producer.append("t.events", "t.events", [("agent:a:b:c", b"x")])
    assert not producer.stale


def test_a_fatal_delivery_error_retires_the_producer(producer: AppendProducer) -> None:
    fatal = KafkaError(KafkaError._FENCED, "fenced by a newer epoch", fatal=True)
    error = producer._failed("t.events", [fatal], 1)
    assert isinstance(error, BackendUnavailable) and "fenced by a newer epoch" in str(error)
    assert producer.stale


def test_a_fatal_client_error_retires_the_producer(producer: AppendProducer) -> None:
    producer._on_error(KafkaError(KafkaError._TRANSPORT, "all brokers down"))
    assert not producer.stale
    producer._on_error(KafkaError(KafkaError._FATAL, "producer fenced", fatal=True))
    assert producer.stale
