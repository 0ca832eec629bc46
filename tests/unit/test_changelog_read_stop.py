"""A changelog read that its reader stops (the partition was revoked mid-restore) ends at
once, also while the broker sends nothing: the group's revoke callback waits on it."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from effectlog.log.changelog import ReadStopped
from effectlog.log.kafka.changelog import KafkaChangelog
from effectlog.log.kafka.settings import KafkaSettings


class SilentConsumer:
    """A consumer of a broker that answers where the partition ends (offset 10), then
    sends nothing: every ask waits its time and comes back empty."""

    def __init__(self) -> None:
        self.asks = 0
        self.closed = False

    def offsets_for_times(self, partitions: list[TopicPartition],
                          timeout: float) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, 10) for tp in partitions]

    def assign(self, partitions: list[TopicPartition]) -> None:
        pass

    def unassign(self) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.asks += 1
        time.sleep(timeout)
        return []

    def close(self) -> None:
        self.closed = True


def silent_changelog(monkeypatch: pytest.MonkeyPatch) -> tuple[KafkaChangelog, SilentConsumer]:
    changelog = KafkaChangelog(KafkaSettings.from_url("kafka://127.0.0.1:1?timeout_s=10"))
    consumer = SilentConsumer()
    monkeypatch.setattr(changelog, "_consumer", lambda: consumer)
    return changelog, consumer


def test_a_read_stopped_while_the_broker_is_silent_ends_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    changelog, consumer = silent_changelog(monkeypatch)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    with pytest.raises(ReadStopped):
        list(changelog.read(0, stop))
    # without the stop it would wait for the read's quiet bound: max(30 s, 3 x timeout_s)
    assert time.monotonic() - started < 5.0
    assert consumer.asks > 1 and consumer.closed


def test_a_read_stopped_before_it_starts_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    changelog, consumer = silent_changelog(monkeypatch)
    stop = threading.Event()
    stop.set()
    with pytest.raises(ReadStopped):
        next(changelog.read(0, stop))
    assert consumer.asks == 0 and consumer.closed
