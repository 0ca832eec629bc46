"""A topic grown after effects were written is refused, on Apache Kafka.

Growing the events topic (kafka-topics --alter --partitions) moves keys to partitions that
lack their history: a SUCCEEDED effect would read as absent there, and its provider would be
called again. `serve` refuses it, on the state directory it projected before (the recorded
partition count) and on a fresh one (the count its changelog's checkpoints carry), with exit
4 and one line, before it gives any verdict.
"""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from effectlog.log import open_log
from effectlog.log.kafka import KafkaSettings, create_topics, murmur2_partition
from effectlog.worker import Worker
from effectlog.worker.sync import EffectCall
from tests.cluster_support import Serve, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

KIND, TARGET = "payment.charge", "stripe:cus_1"


def moving_operation() -> str:
    """An operation whose key is in another partition of 4 than of 2."""
    for n in range(1000):
        key = f"agent:op-{n}:{KIND}:{TARGET}".encode()
        if murmur2_partition(key, 2) != murmur2_partition(key, 4):
            return f"op-{n}"
    raise AssertionError("no key moves")


def test_serve_refuses_a_topic_grown_after_effects_were_written(kafka_bootstrap: str,
                                                                tmp_path: Path) -> None:
    prefix = f"grow{uuid.uuid4().hex[:10]}"
    url2 = f"kafka://{kafka_bootstrap}?prefix={prefix}&partitions=2"
    url4 = f"kafka://{kafka_bootstrap}?prefix={prefix}&partitions=4"
    settings = KafkaSettings.from_url(url2)
    create_topics(settings)
    state = tmp_path / "state"
    calls: list[int] = []

    def charge(call: EffectCall) -> dict[str, bool]:
        calls.append(call.fencing_epoch)
        return {"charged": True}

    serve = Serve(tmp_path, "a", url2, None, state)
    try:
        wait_until(lambda: len(serve.serving()) == 2, 90, "serve a serves 2 partitions")
        log = open_log(url2)
        try:
            with Worker(log, "w1", server=serve.url) as worker:
                worker.perform(moving_operation(), KIND, TARGET, {"amount": 1}, charge)
            changelog = log.changelog()
            assert changelog is not None
            # published (every second): the checkpoints carry the partition count
            wait_until(lambda: all(changelog.last_checkpoint(p) for p in (0, 1)), 60,
                       "both partitions published")
        finally:
            log.close()
    finally:
        serve.stop()
    assert calls == [1]

    admin = AdminClient(settings.client_config())
    for future in admin.create_partitions(
            [NewPartitions(settings.topic(t), 4) for t in ("events", "commands", "state")]
    ).values():
        future.result(30)

    for name, state_dir in (("same-state", state), ("fresh-state", tmp_path / "fresh")):
        grown = Serve(tmp_path, name, url4, None, state_dir)
        with contextlib.suppress(subprocess.TimeoutExpired):
            grown.process.wait(90)
        err = grown.stop()
        assert grown.process.returncode == 4, err[-1500:]
        assert "the events topic has 4 partitions but" in err and "made with 2" in err, err
        assert "write to a new log" in err
    assert calls == [1]
