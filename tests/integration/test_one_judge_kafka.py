"""The one judge on Apache Kafka: reads that are fresh even behind an open transaction."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from effectlog.errors import BackendUnavailable
from effectlog.judge import Query
from effectlog.judge.client import ClusterJudge
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings, murmur2_partition
from effectlog.log.kafka.producer import producer_config
from effectlog.worker import Worker
from tests.cluster_support import Serve, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


@pytest.fixture
def serve(kafka_url: str, tmp_path: Path) -> Iterator[Serve]:
    node = Serve(tmp_path, "judge", kafka_url, None)
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve serves every partition")
        yield node
    finally:
        node.stop()


def test_a_fresh_read_waits_for_acknowledged_records_behind_an_open_transaction(
        kafka_url: str, serve: Serve) -> None:
    """7. A transaction left open holds ``read_committed`` readers at its first offset; a
    record acknowledged after it is still "in the log" for a fresh read, which must wait
    for it (and say so when it cannot) rather than answer without it."""
    settings = KafkaSettings.from_url(kafka_url)
    log = open_log(kafka_url)
    judge = ClusterJudge(serve.url, wait_s=1.5, retry_for_s=0.5)
    key = "agent:behind-txn:email.send:mailto:t@example.com"
    partition = murmur2_partition(key.encode(), settings.partitions)
    txn = Producer({**producer_config(settings), "transactional.id": f"open-{settings.prefix}",
                    "transaction.timeout.ms": 60_000})
    try:
        txn.init_transactions(10)
        txn.begin_transaction()
        txn.produce(settings.topic(EVENTS), b"not an event", b"agent:txn:k:t", partition=partition)
        txn.flush(10)  # in the log, not committed: the last stable offset stops here
        writer = Worker(log, "w1", judge=judge)
        with pytest.raises(BackendUnavailable):  # its own verdict waits behind the transaction
            writer.create("behind-txn", "email.send", "mailto:t@example.com", {})
        with pytest.raises(BackendUnavailable, match="short of"):
            judge.ask([Query(key, fresh=True)])  # never "absent"
        txn.commit_transaction(10)
        answer = judge.ask([Query(key, fresh=True)])[0]
        assert answer.state is not None and answer.state.idempotency_key == key
    finally:
        judge.close()
        log.close()


def test_records_carry_the_brokers_time_and_serve_refuses_writers_clocks(
        kafka_url: str, tmp_path: Path) -> None:
    """6. On Kafka "stuck" is measured on the broker's append time: a record produced with a
    writer's clock 10 minutes behind is read with the broker's time, and serve refuses an
    events topic that would keep the writers' clocks."""
    import subprocess
    import sys
    import time

    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    settings = KafkaSettings.from_url(kafka_url)
    name = settings.topic(EVENTS)
    producer = Producer(producer_config(settings))
    skewed = int(time.time() * 1000) - 600_000
    producer.produce(name, b"x", b"agent:clock:k:t", partition=0, timestamp=skewed)
    producer.flush(10)
    log = open_log(kafka_url)
    try:
        record = log.read(EVENTS, 0, 0, 1, timeout=10)[0]
    finally:
        log.close()
    assert abs(record.timestamp_ms - time.time() * 1000) < 60_000, record.timestamp_ms - skewed
    admin = AdminClient(settings.client_config())
    resource = ConfigResource("topic", name, incremental_configs=[ConfigEntry(
        "message.timestamp.type", "CreateTime",
        incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url,
                           "--state", str(tmp_path / "state"), "serve", "--http", "127.0.0.1:0",
                           "--no-recovery"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert "writers' clocks" in done.stderr and done.stderr.count("\n") == 1, done.stderr
