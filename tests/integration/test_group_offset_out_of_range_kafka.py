"""serve's group member reads each partition from the projection's own offset, never a
reset one: a position the events partition no longer holds (the log truncated under it) is
refused as a wrong log, not silently read again from the log start, and a brand-new partition
is still read from offset 0."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping, Sequence

import pytest
from confluent_kafka import Producer

from effectlog.errors import WrongLog
from effectlog.log.base import EVENTS, Record
from effectlog.log.kafka import KafkaSettings
from effectlog.log.kafka.group import GroupSettings, GroupSource

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


class StartAt:
    """An assignment listener that starts every partition at ``offset``."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def assigned(self, partitions: Sequence[int]) -> Mapping[int, int]:
        return {p: self.offset for p in partitions}

    def revoked(self, partitions: Sequence[int], *, lost: bool) -> None:
        return None


def _source(url: str, offset: int) -> GroupSource:
    settings = KafkaSettings.from_url(url)
    source = GroupSource(settings, GroupSettings(f"g{uuid.uuid4().hex[:8]}",
                                                 "http://127.0.0.1:1", session_timeout_ms=6000))
    source.start(StartAt(offset))
    return source


def _produce(url: str, partition: int, count: int) -> None:
    settings = KafkaSettings.from_url(url)
    producer = Producer({"bootstrap.servers": settings.bootstrap, "linger.ms": 0})
    for n in range(count):
        producer.produce(settings.topic(EVENTS), key=f"k{n}", value=b"x", partition=partition)
    assert producer.flush(10) == 0


def test_a_position_past_the_partitions_end_is_a_wrong_log_not_a_reset(kafka_url: str) -> None:
    _produce(kafka_url, 0, 3)  # offsets 0-2; the projection says it applied up to 50
    source = _source(kafka_url, 50)
    delivered: list[Record] = []
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(WrongLog) as refused:
            while time.monotonic() < deadline:
                delivered += source.poll(100, 0.2).records
        assert delivered == [], "read again from the log start: a silent reset"
        # every partition starts past its end: whichever the consumer fetches first is refused
        assert re.search(r"partition \d+ no longer holds", str(refused.value))
        assert WrongLog.HINT in str(refused.value)
    finally:
        source.close()


def test_a_new_partition_is_read_from_offset_zero(kafka_url: str) -> None:
    source = _source(kafka_url, 0)
    try:
        deadline = time.monotonic() + 30
        while not source.joined.is_set() and time.monotonic() < deadline:
            source.poll(100, 0.2)
        _produce(kafka_url, 2, 2)
        delivered: list[Record] = []
        while len(delivered) < 2 and time.monotonic() < deadline:
            delivered += source.poll(100, 0.2).records
        assert [(r.partition, r.offset) for r in delivered] == [(2, 0), (2, 1)]
    finally:
        source.close()
