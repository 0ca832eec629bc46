"""``effectlog topics create`` on a cluster of three Apache Kafka nodes and on one broker: the
replication it picks (never fewer replicas because a node is down), the configs Kafka then
reports, and the checks of existing topics."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ConfigSource,
    NewTopic,
    ResourceType,
)

from effectlog.errors import Conflict
from effectlog.log.base import COMMANDS, EVENTS, STATE
from effectlog.log.kafka import KafkaSettings, create_topics
from tests.broker_faults import assert_unavailable, cli
from tests.cluster_faults import nodes_away
from tests.cluster_support import wait_until
from tests.kafka_broker import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def _described(bootstrap: str, topic: str) -> tuple[set[int], dict[str, str]]:
    """(replica counts of its partitions, its configs) as Kafka reports them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    configs = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
    entries = next(iter(configs.values())).result(10)
    return {len(p.replicas) for p in meta.partitions.values()}, {k: e.value for k, e in entries.items()}


def test_on_three_brokers_topics_get_three_replicas_two_in_sync_no_unclean_election(
        kafka_cluster: KafkaCluster, tmp_path: Path) -> None:
    url = f"kafka://{kafka_cluster.bootstrap}?prefix=r{uuid.uuid4().hex[:8]}"
    done = cli("--log", url, "topics", "create")
    assert done.code == 0, done.stderr
    why, *lines = done.stdout.splitlines()
    assert why.startswith("replication 3, min.insync.replicas=2, "
                          "unclean.leader.election.enable=false: the cluster has 3 brokers")
    assert [line.split()[0] for line in lines] == ["created", "created", "created"]
    settings = KafkaSettings.from_url(url)
    for logical in (EVENTS, COMMANDS, STATE):
        replicas, configs = _described(kafka_cluster.bootstrap, settings.topic(logical))
        assert replicas == {3}
        assert configs["min.insync.replicas"] == "2"
        assert configs["unclean.leader.election.enable"] == "false"
    assert _described(kafka_cluster.bootstrap, settings.topic(EVENTS))[1][
        "message.timestamp.type"] == "LogAppendTime"
    again = cli("--log", url, "topics", "create", "--strict", "--json")
    assert again.code == 0 and again.stderr == "", again.stderr
    assert json.loads(again.stdout)["warnings"] == []


def test_on_three_brokers_a_topic_with_one_replica_is_a_warning_or_exit_3_with_strict(
        kafka_cluster: KafkaCluster) -> None:
    prefix = f"w{uuid.uuid4().hex[:8]}"
    create_topics(KafkaSettings.from_url(f"kafka://{kafka_cluster.bootstrap}?prefix={prefix}"
                                         "&replication=1"))
    url = f"kafka://{kafka_cluster.bootstrap}?prefix={prefix}"
    done = cli("--log", url, "topics", "create")
    assert done.code == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [f"exists {prefix}.{t} (6 partitions, 1 warning)"
                                            for t in (EVENTS, COMMANDS, STATE)]
    assert done.stderr.splitlines() == [
        f"warning: kafka topic {prefix}.{t} has 1 replica, a cluster of 3 brokers calls for 3 "
        "(--strict refuses it)" for t in (EVENTS, COMMANDS, STATE)]
    strict = cli("--log", url, "topics", "create", "--strict")
    assert strict.code == 3 and strict.stdout == "", strict
    (line,) = strict.stderr.splitlines()
    assert line.startswith(f"error: kafka topic {prefix}.events has 1 replica") \
        and line.endswith("(refused with --strict)"), line


def test_on_three_brokers_unclean_election_on_an_existing_topic_is_refused(
        kafka_cluster: KafkaCluster) -> None:
    settings = KafkaSettings.from_url(f"kafka://{kafka_cluster.bootstrap}"
                                      f"?prefix=u{uuid.uuid4().hex[:8]}")
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
    unclean = NewTopic(settings.topic(EVENTS), num_partitions=6, replication_factor=3, config={
        "cleanup.policy": "compact", "retention.ms": "-1",
        "min.compaction.lag.ms": str(settings.min_compaction_lag_ms),
        "message.timestamp.type": "LogAppendTime", "min.insync.replicas": "2",
        "unclean.leader.election.enable": "true"})
    admin.create_topics([unclean])[settings.topic(EVENTS)].result(timeout=10)
    with pytest.raises(Conflict) as refused:  # serve would refuse to judge on it
        create_topics(settings)
    assert str(refused.value) == (
        f"kafka topic {settings.topic(EVENTS)} contradicts the settings: has unclean.leader."
        "election.enable=true: a replica that missed acknowledged appends may become leader "
        "and take them back, verdicts given on them included; set it to false")


def test_on_three_brokers_with_one_down_topics_create_refuses_rather_than_settle(
        kafka_cluster: KafkaCluster) -> None:
    """The metadata lists only the brokers that answer: a create during a rolling restart
    must not take two brokers for a cluster of two and make unreplicated topics."""
    prefix = f"d{uuid.uuid4().hex[:8]}"
    url = f"kafka://{kafka_cluster.bootstrap}?prefix={prefix}"
    settings = KafkaSettings.from_url(url)
    with nodes_away(kafka_cluster, [3], "kill"):
        wait_until(lambda: len(kafka_cluster.live_brokers(1.0)) == 2, 30, "node 3 fenced")
        done = cli("--log", url, "topics", "create")
        assert_unavailable(done, 40, "topics create with a node down")
        assert ("fewer than the 3 replicas" in done.stderr
                and "set replication= in the log URL" in done.stderr), done.stderr
        admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap})
        assert not [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix)]
        chosen = create_topics(KafkaSettings.from_url(url + "&replication=2"))
        assert chosen.durability.replication == 2 and chosen.durability.told
    wait_until(lambda: len(kafka_cluster.live_brokers(1.0)) == 3
               and kafka_cluster.fully_replicated([settings.topic(t) for t in
                                                   (EVENTS, COMMANDS, STATE)]),
               90, "node 3 back and in sync")
    again = create_topics(settings)  # all three back: the topics exist, with fewer replicas
    assert again.durability.replication == 3 and len(again.warnings) == 3, again.warnings


def test_on_one_broker_topics_keep_one_replica_and_say_why(kafka_bootstrap: str) -> None:
    url = f"kafka://{kafka_bootstrap}?prefix=o{uuid.uuid4().hex[:8]}"
    done = cli("--log", url, "topics", "create", "--strict")
    assert done.code == 0, done.stderr
    why = done.stdout.splitlines()[0]
    assert why == ("replication 1: the cluster has 1 broker; replicated topics need 3 (set "
                   "replication= in the log URL to choose)")
    assert all("replication 1, cleanup.policy=" in line for line in done.stdout.splitlines()[1:])
    settings = KafkaSettings.from_url(url)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    for logical in (EVENTS, COMMANDS, STATE):  # set on the topic: never the brokers' default
        resource = ConfigResource(ResourceType.TOPIC, settings.topic(logical))
        entry = next(iter(admin.describe_configs([resource]).values())).result(10)[
            "unclean.leader.election.enable"]
        assert (entry.value, entry.source) == ("false", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
