"""A Kafka log's identity is its events topic's topic ID: a projection built from one topic is
refused (exit 4, nothing written) once the topic was deleted and created again."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from effectlog.log import open_log
from effectlog.log.kafka import KafkaSettings, create_topics
from tests.judges import scribe

pytestmark = pytest.mark.kafka

LINE = json.dumps({"operation_id": "id-1", "kind": "email.send", "target": "mailto:a@x",
                   "payload": {}, "transition": "create", "worker_id": "w1"}) + "\n"


def cli(url: str, state: Path, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
                           str(state), *args], input=stdin, capture_output=True, text=True,
                          timeout=120)


def test_a_replaced_topic_is_refused_by_the_projection_built_from_the_old_one(
        kafka_url: str, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with open_log(kafka_url) as log:
        scribe(log, "w1").create("id-1", "email.send", "mailto:a@x", {})
    assert cli(kafka_url, state, "project", "--once").returncode == 0
    settings = KafkaSettings.from_url(kafka_url)
    with open_log(kafka_url) as log:
        before = log.identity()
    admin = AdminClient(settings.client_config())
    for future in admin.delete_topics([settings.topic(t) for t in ("events", "commands")]).values():
        future.result(30)
    deadline = time.monotonic() + 60
    while True:  # deletion is asynchronous on the broker
        try:
            create_topics(settings)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    with open_log(kafka_url) as log:
        assert log.identity() != before
    files = sorted(str(p) for p in state.rglob("*"))
    for args in (("project", "--once"), ("stats",), ("recover", "--once")):
        done = cli(kafka_url, state, *args)
        assert done.returncode == 4, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(str(p) for p in state.rglob("*")) == files  # nothing new written
    adopted = cli(kafka_url, state, "rebuild")
    assert adopted.returncode == 0, adopted.stderr


def test_a_running_serve_stops_when_its_topic_is_replaced(kafka_url: str, tmp_path: Path) -> None:
    from consumers.providers.fake import FakeProvider
    from tests.cluster_support import Serve, wait_until

    FakeProvider(tmp_path / "provider.db").close()
    node = Serve(tmp_path, "s0", kafka_url, tmp_path / "provider.db")
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve owns every partition")
        settings = KafkaSettings.from_url(kafka_url)
        admin = AdminClient(settings.client_config())
        for future in admin.delete_topics([settings.topic("events")]).values():
            future.result(30)
        node.process.wait(60)  # it notices within its check interval and stops by itself
    finally:
        err = node.stop()
    assert node.process.returncode == 4, err
    assert "stopped serving" in err and "effectlog rebuild" in err
