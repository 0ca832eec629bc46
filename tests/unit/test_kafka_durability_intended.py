"""The replication ``topics create`` intends does not shrink with the brokers that happen to
answer, and unclean leader election on an existing topic is refused, as ``serve`` refuses it
(pure logic: no broker)."""

from __future__ import annotations

import pytest

from effectlog.log.kafka import KafkaSettings
from effectlog.log.kafka.durability import plan

URL = "kafka://127.0.0.1:9092?prefix=d"


@pytest.mark.parametrize("brokers", [1, 2])
def test_a_cluster_configured_for_three_replicas_is_short_with_a_broker_down(
        brokers: int) -> None:
    durability = plan(KafkaSettings.from_url(URL), brokers=brokers, configured=3)
    assert (durability.replication, durability.min_insync, durability.short) == (3, 2, True)
    assert "call for 3" in durability.why


def test_the_configured_replication_is_capped_at_three() -> None:
    durability = plan(KafkaSettings.from_url(URL), brokers=5, configured=5)
    assert (durability.replication, durability.short) == (3, False)


def test_a_cluster_configured_for_two_gets_two_on_two_brokers() -> None:
    durability = plan(KafkaSettings.from_url(URL), brokers=2, configured=2)
    assert (durability.replication, durability.min_insync, durability.short) == (2, 2, False)


def test_a_cluster_configured_for_one_keeps_the_old_rule() -> None:
    assert plan(KafkaSettings.from_url(URL), brokers=2, configured=1).replication == 1
    three = plan(KafkaSettings.from_url(URL), brokers=3, configured=1)
    assert (three.replication, three.short) == (3, False)


def test_a_replication_in_the_url_is_never_short() -> None:
    durability = plan(KafkaSettings.from_url(URL + "&replication=1"), brokers=2, configured=3)
    assert (durability.replication, durability.short) == (1, False)


def test_min_insync_alone_in_the_url_does_not_lower_the_intended_replication() -> None:
    durability = plan(KafkaSettings.from_url(URL + "&min_insync_replicas=2"), brokers=2,
                      configured=3)
    assert (durability.replication, durability.short) == (3, True)


@pytest.mark.parametrize(("brokers", "replicas"), [(3, 3), (1, 1)])
def test_unclean_leader_election_on_an_existing_topic_is_a_conflict(brokers: int,
                                                                     replicas: int) -> None:
    review = plan(KafkaSettings.from_url(URL), brokers=brokers).review(
        [replicas] * 6, {"min.insync.replicas": str(min(2, replicas)),
                         "unclean.leader.election.enable": "true"})
    assert review.warnings == []
    assert [c.split(" ")[1] for c in review.conflicts] == [
        "unclean.leader.election.enable=true:"]


def test_min_insync_below_a_majority_stays_a_warning() -> None:
    review = plan(KafkaSettings.from_url(URL), brokers=3).review(
        [3] * 6, {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"})
    assert review.conflicts == []
    assert [w.split(" ")[0] for w in review.warnings] == ["min.insync.replicas=1"]
