"""A broker that stops answering never crashes a serve's loops (found by the Kafka soak):
the identity check and the group description report it as unavailable, the group is not
described while no broker answers, and partitions assigned as the broker went away are
taken once it is back. Fakes stand in for the librdkafka clients."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as TP

from effectlog.errors import BackendUnavailable
from effectlog.log.kafka import admin, group
from effectlog.log.kafka.group import GroupMembership, GroupSettings, GroupSource
from effectlog.log.kafka.settings import KafkaSettings

SETTINGS = KafkaSettings("127.0.0.1:9", prefix="t", timeout_s=0.05)
MEMBER = GroupSettings("t.serve", "http://127.0.0.1:1")


def pending() -> Future[Any]:
    """A request the broker never answers."""
    return Future()


class SilentAdmin:
    """An admin client whose broker accepts requests and never answers them."""

    def __init__(self, *args: object, reachable: bool = True) -> None:
        self.reachable = reachable
        self.described = 0

    def describe_topics(self, topics: object, request_timeout: float) -> dict[str, Future[Any]]:
        return {SETTINGS.topic("events"): pending()}

    def list_topics(self, topic: str, timeout: float) -> object:
        if not self.reachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return object()

    def describe_consumer_groups(self, groups: list[str],
                                 request_timeout: float) -> dict[str, Future[Any]]:
        self.described += 1
        return {g: pending() for g in groups}

    def poll(self, timeout: float) -> int:
        return 0


def test_the_identity_check_reports_a_silent_broker_as_unavailable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(admin, "AdminClient", SilentAdmin)
    with pytest.raises(BackendUnavailable, match=r"unreachable: no answer describing t\.events"):
        admin.topic_id(SETTINGS, SETTINGS.topic("events"))


def test_the_group_is_not_described_while_no_broker_answers() -> None:
    membership = GroupMembership(SETTINGS, MEMBER, min_interval_s=0)
    membership._admin = fake = SilentAdmin(reachable=False)  # type: ignore[assignment]
    membership._owners = {0: "http://127.0.0.1:2"}
    membership.refresh()
    assert fake.described == 0 and membership._owners == {0: "http://127.0.0.1:2"}


def test_a_group_description_that_times_out_keeps_the_last_owners() -> None:
    membership = GroupMembership(SETTINGS, MEMBER, min_interval_s=0)
    membership._admin = fake = SilentAdmin()  # type: ignore[assignment]
    membership._owners = {0: "http://127.0.0.1:2"}
    membership.refresh()  # before the fix: TimeoutError out of the membership loop
    assert fake.described == 1 and membership._owners == {0: "http://127.0.0.1:2"}


class FlakyListener:
    """Opens partitions only once the broker is back (after ``failures`` refusals)."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def assigned(self, partitions: Sequence[int]) -> Mapping[int, int]:
        self.calls += 1
        if self.calls <= self.failures:
            raise BackendUnavailable("kafka broker 127.0.0.1:9 unreachable: no end offsets")
        return {p: 10 * p for p in partitions}

    def revoked(self, partitions: Sequence[int], *, lost: bool) -> None:
        pass


class FakeConsumer:
    def __init__(self) -> None:
        self.assigned: list[tuple[int, int]] = []

    def committed(self, tps: list[TP], timeout: float) -> list[TP]:
        return [TP(tp.topic, tp.partition, 3) for tp in tps]

    def incremental_assign(self, tps: list[TP]) -> None:
        self.assigned += [(tp.partition, tp.offset) for tp in tps]


def test_partitions_assigned_as_the_broker_went_away_are_taken_once_it_is_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(group.time, "sleep", lambda s: None)
    source = GroupSource(SETTINGS, MEMBER)
    listener = FlakyListener(failures=3)
    source._listener = listener
    consumer = FakeConsumer()
    source._on_assign(consumer, [TP("t.events", 1), TP("t.events", 2)])  # type: ignore[arg-type]
    assert listener.calls == 4
    assert consumer.assigned == [(1, 10), (2, 20)]
    assert source.command_offsets() == {1: 3, 2: 3}


def test_an_assignment_gives_up_once_the_group_has_dropped_the_member(
        monkeypatch: pytest.MonkeyPatch) -> None:
    source = GroupSource(SETTINGS, GroupSettings("t.serve", "http://127.0.0.1:1",
                                                 max_poll_interval_ms=1))
    source._listener = FlakyListener(failures=1000)
    consumer = FakeConsumer()
    with pytest.raises(BackendUnavailable):
        source._on_assign(consumer, [TP("t.events", 1)])  # type: ignore[arg-type]
    assert consumer.assigned == []
