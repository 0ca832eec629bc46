"""The replication ``topics create`` picks for a cluster's size, and what it asks of existing
topics (pure logic: no broker)."""

from __future__ import annotations

import pytest

from effectlog.errors import InvalidInput
from effectlog.log.kafka import KafkaSettings
from effectlog.log.kafka.durability import majority, plan

URL = "kafka://127.0.0.1:9092?prefix=d"
REPLICATED = {"min.insync.replicas": "2", "unclean.leader.election.enable": "false"}


def test_three_brokers_get_three_replicas_two_in_sync_and_no_unclean_election() -> None:
    durability = plan(KafkaSettings.from_url(URL), brokers=3)
    assert (durability.replication, durability.min_insync, durability.told) == (3, 2, False)
    assert durability.configs() == REPLICATED
    assert durability.why.startswith("replication 3, min.insync.replicas=2, "
                                     "unclean.leader.election.enable=false: the cluster has 3")


@pytest.mark.parametrize("brokers", [1, 2])
def test_fewer_brokers_keep_one_replica_and_say_why(brokers: int) -> None:
    durability = plan(KafkaSettings.from_url(URL), brokers=brokers)
    assert (durability.replication, durability.min_insync, durability.configs()) == (1, None, {})
    assert f"the cluster has {brokers} broker" in durability.why
    assert "replicated topics need 3" in durability.why


def test_the_url_decides_over_the_cluster_size() -> None:
    durability = plan(KafkaSettings.from_url(URL + "&replication=5"), brokers=7)
    assert (durability.replication, durability.min_insync, durability.told) == (5, 3, True)
    assert "from the log URL" in durability.why
    one = plan(KafkaSettings.from_url(URL + "&replication=1"), brokers=3)
    assert (one.replication, one.configs()) == (1, {})
    chosen = plan(KafkaSettings.from_url(URL + "&min_insync_replicas=3"), brokers=4)
    assert (chosen.replication, chosen.min_insync) == (3, 3)


@pytest.mark.parametrize(("replication", "expected"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3)])
def test_min_insync_defaults_to_a_majority(replication: int, expected: int) -> None:
    assert majority(replication) == expected


@pytest.mark.parametrize("query", ["replication=0", "min_insync_replicas=0",
                                   "replication=2&min_insync_replicas=3", "replication=x"])
def test_impossible_replication_is_bad_input(query: str) -> None:
    with pytest.raises(InvalidInput):
        KafkaSettings.from_url(f"{URL}&{query}")


def test_an_existing_topic_short_of_the_clusters_replication_is_a_warning() -> None:
    review = plan(KafkaSettings.from_url(URL), brokers=3).review([1] * 6, {})
    assert review.conflicts == []
    assert review.warnings == ["has 1 replica, a cluster of 3 brokers calls for 3"]
    weak = plan(KafkaSettings.from_url(URL), brokers=3).review(
        [3] * 6, {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"})
    assert [w.split(" ")[0] for w in weak.warnings] == ["min.insync.replicas=1"]
    assert len(weak.conflicts) == 1
    assert weak.conflicts[0].startswith("has unclean.leader.election.enable=true")


def test_an_existing_topic_short_of_what_the_url_says_is_a_conflict() -> None:
    review = plan(KafkaSettings.from_url(URL + "&replication=3"), brokers=3).review(
        [3, 3, 2], {"min.insync.replicas": "1"})
    assert review.conflicts == ["has 2 replicas, settings say 3", "min.insync.replicas=1 is "
                                "below 2: an acknowledged append may be on fewer brokers"]


def test_a_topic_that_can_never_acknowledge_is_a_conflict() -> None:
    review = plan(KafkaSettings.from_url(URL), brokers=1).review([1], {"min.insync.replicas": "2"})
    assert review.conflicts == ["min.insync.replicas=2 exceeds its 1 replicas: every acks=all "
                                "append would be refused"]


def test_a_replicated_topic_meets_the_plan() -> None:
    review = plan(KafkaSettings.from_url(URL), brokers=3).review([3] * 6, REPLICATED)
    assert (review.conflicts, review.warnings) == ([], [])
