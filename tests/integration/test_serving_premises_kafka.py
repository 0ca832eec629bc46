"""What serve rests on is checked while it serves, not only when it starts: a topic config
altered under a running serve stops it with the line it would refuse to start with (exit 3),
and an events topic that deletes records before the changelog may have them is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from effectlog.log.base import EVENTS
from effectlog.log.kafka import KafkaSettings

pytestmark = pytest.mark.kafka


def alter(url: str, name: str, value: str) -> None:
    """Set one config of the events topic, as an operator's kafka-configs.sh would."""
    settings = KafkaSettings.from_url(url)
    admin = AdminClient(settings.client_config())
    resource = ConfigResource("topic", settings.topic(EVENTS), incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)])
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
