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
