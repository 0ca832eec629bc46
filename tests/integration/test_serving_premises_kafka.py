"""What serve rests on is checked while it serves, not only when it starts: a topic config
altered under a running serve stops it with the line it would refuse to start with (exit 3),
and an events topic that deletes records before the changelog may have them is refused, as is
unclean leader election on the events or state topic (set there or inherited from the
brokers), which could take back records a verdict was given on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from effectlog.log.base import EVENTS, STATE
from effectlog.log.kafka import KafkaSettings
from effectlog.log.kafka.admin import serving_problem

pytestmark = pytest.mark.kafka


def alter(url: str, name: str, value: str | None, logical: str = EVENTS) -> None:
    """Set (``None``: remove) one config of a topic, as an operator's kafka-configs.sh would."""
    settings = KafkaSettings.from_url(url)
    alter_resource(settings, "topic", settings.topic(logical), name, value)


def alter_resource(settings: KafkaSettings, kind: str, resource_name: str, name: str,
                   value: str | None) -> None:
    admin = AdminClient(settings.client_config())
    entry = (ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
             if value is not None else
             ConfigEntry(name, "", incremental_operation=AlterConfigOpType.DELETE))
    resource = ConfigResource(kind, resource_name, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def test_a_running_serve_takes_a_lower_lag_and_stops_when_the_topic_takes_writers_clocks(
        kafka_url: str, tmp_path: Path) -> None:
    from tests.cluster_support import Serve, wait_until

    node = Serve(tmp_path, "s0", kafka_url, None)
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve owns every partition")
        alter(kafka_url, "min.compaction.lag.ms", "2000")  # below serve's floor: the guard's
        wait_until(lambda: "min.compaction.lag.ms is now 2000 ms" in node.err_path.read_text(),
                   30, "the compaction guard took the lower lag")
        assert node.process.poll() is None and len(node.serving()) == 6
        alter(kafka_url, "message.timestamp.type", "CreateTime")
        node.process.wait(60)  # it notices at its next look and stops by itself
    finally:
        err = node.stop()
    assert node.process.returncode == 3, err
    last = err.strip().splitlines()[-1]
    assert "writers' clocks" in last and "stopped serving" in last, err


def test_serve_refuses_an_events_topic_that_deletes_records(kafka_url: str,
                                                            tmp_path: Path) -> None:
    alter(kafka_url, "cleanup.policy", "compact,delete")
    alter(kafka_url, "retention.ms", "86400000")
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url,
                           "--state", str(tmp_path / "state"), "serve", "--http", "127.0.0.1:0",
                           "--no-recovery"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "retention.ms=86400000" in done.stderr, done.stderr
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_serve_stops_and_refuses_to_start_on_unclean_leader_election(kafka_url: str,
                                                                    tmp_path: Path) -> None:
    from tests.cluster_support import Serve, wait_until

    node = Serve(tmp_path, "s0", kafka_url, None)
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve owns every partition")
        alter(kafka_url, "unclean.leader.election.enable", "true")
        node.process.wait(60)  # it notices at its next look and stops by itself
    finally:
        err = node.stop()
    assert node.process.returncode == 3, err
    last = err.strip().splitlines()[-1]
    assert "unclean.leader.election.enable=true" in last and "stopped serving" in last, err
    alter(kafka_url, "unclean.leader.election.enable", "false")
    alter(kafka_url, "unclean.leader.election.enable", "true", STATE)
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url,
                           "--state", str(tmp_path / "fresh"), "serve", "--http", "127.0.0.1:0",
                           "--no-recovery"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    settings = KafkaSettings.from_url(kafka_url)
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"kafka topic {settings.topic(STATE)} has unclean.leader.election.enable=true" \
        in done.stderr, done.stderr
    assert not (tmp_path / "fresh").exists()  # refused before anything was made


def test_unclean_leader_election_inherited_from_the_brokers_is_refused(kafka_url: str) -> None:
    """describe_configs gives the effective value: a topic without its own setting takes the
    brokers' default, and serve judges on that."""
    from tests.cluster_support import wait_until

    settings = KafkaSettings.from_url(kafka_url)
    assert serving_problem(settings) is None
    alter(kafka_url, "unclean.leader.election.enable", None)  # effectlog sets false: drop it
    brokers = AdminClient(settings.client_config()).list_topics(timeout=10).brokers
    changed = []
    try:  # on every broker (librdkafka cannot name the cluster-wide default)
        for broker in brokers:
            alter_resource(settings, "broker", str(broker), "unclean.leader.election.enable",
                           "true")
            changed.append(broker)
        wait_until(lambda: serving_problem(settings) is not None, 30,
                   "the brokers' default reaches the topic")
        assert "unclean.leader.election.enable=true" in str(serving_problem(settings))
    finally:
        for broker in changed:
            alter_resource(settings, "broker", str(broker), "unclean.leader.election.enable",
                           None)
