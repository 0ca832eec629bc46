"""Restore of one events partition from the compacted topic, against bare consume + decode.

1. Writes N effect events with distinct keys into a one-partition events topic (what a
   compacted topic holds: the latest snapshot of each key), with a bare batching producer.
2. Baseline: a bare confluent-kafka consumer assigned at offset 0 reads them all and decodes
   each with the shared Avro codec (fastavro), in the same batches the node reads.
3. effectlog: a node (``consumers.node``, no HTTP) joins a fresh group on that topic with an
   empty state directory and restores the partition (judge, snapshot, index, counters and
   offset in one RocksDB WriteBatch per batch); the time is the gate's, from assignment to
   serving. Run twice: a restore from scratch, then from an own store a few events behind.

Usage: python bench/cluster_restore.py [--events N]   (EFFECTLOG_BENCH_KAFKA=host:port for a
broker of your own; otherwise Apache Kafka is started from the Maven jars, see tools/kafka)
The last line gives effectlog's restore rate as a ratio to the bare rate, and the absolutes.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _common import kafka_bootstrap
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as TP

from consumers.node.node import Node, NodeSettings
from effectlog.codec import event_codec
from effectlog.log.base import EVENTS
from effectlog.log.kafka import KafkaSettings, create_topics
from effectlog.machine import advance, new_effect
from effectlog.model import Transition as T


def fill(settings: KafkaSettings, count: int) -> None:
    """``count`` RESERVED snapshots of distinct keys, produced in large batches."""
    codec = event_codec()
    producer = Producer({**settings.client_config(), "linger.ms": 20, "acks": "all",
                         "partitioner": "murmur2_random",
                         "enable.idempotence": True, "batch.size": 1 << 20})
    topic = settings.topic(EVENTS)
    template = advance(new_effect("op", "email.send", "mailto:u@example.com", {"n": 0}, "w1"),
                       T.RESERVE, "w1").to_record()
    for i in range(count):
        record = dict(template, idempotency_key=f"agent:op{i}:email.send:mailto:u{i}@example.com",
                      operation_id=f"op{i}", target=f"mailto:u{i}@example.com",
                      event_id=f"e{i}")
        while True:
            try:
                producer.produce(topic, codec.encode(record), record["idempotency_key"].encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)


def bare(settings: KafkaSettings, count: int, batch: int) -> float:
    """Seconds a bare consumer takes to read and decode ``count`` records from offset 0."""
    decode = event_codec().decode
    consumer = Consumer({**settings.client_config(), "group.id": f"bare-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.min.bytes": 1})
    consumer.assign([TP(settings.topic(EVENTS), 0, 0)])
    seen = 0
    started = time.perf_counter()
    while seen < count:
        for msg in consumer.consume(batch, 1.0):
            if msg.error() is None:
                decode(msg.value())
                seen += 1
    took = time.perf_counter() - started
    consumer.close()
    return took


def restore(url: str, state_dir: Path) -> tuple[int, float]:
    """(records restored, seconds from assignment to serving) of a node on ``state_dir``."""
    done = threading.Event()
    figures: list[tuple[int, float]] = []
    node = Node(url, NodeSettings(state_dir=state_dir, http_port=None, loops=False,
                                  group=f"bench-{uuid.uuid4().hex[:8]}",
                                  session_timeout_ms=6000))
    node.gate.on_restored = lambda p, n, s: (figures.append((n, s)), done.set())
    node.start()
    try:
        if not done.wait(600):
            raise SystemExit("the partition did not restore within 600 s")
    finally:
        node.stop(30)
        node.close()
    return figures[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        url = f"kafka://{bootstrap}?prefix=restore{uuid.uuid4().hex[:8]}&partitions=1"
        settings = KafkaSettings.from_url(url)
        create_topics(settings)
        fill(settings, args.events)
        work = Path(tempfile.mkdtemp(prefix="effectlog-restore-"))
        try:
            bare_s = bare(settings, args.events, 2000)
            records, restore_s = restore(url, work / "state")
            tail = 1000
            fill(settings, tail)  # the store is now ``tail`` events behind
            behind, resume_s = restore(url, work / "state")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    bare_rate, rate = args.events / bare_s, records / restore_s
    print(f"bare consume+decode: {args.events} records in {bare_s:.2f}s ({bare_rate:,.0f}/s)")
    print(f"effectlog restore from scratch: {records} records in {restore_s:.2f}s "
          f"({rate:,.0f}/s); {restore_s * 100_000 / records:.2f}s per 100k keys")
    print(f"effectlog restore from its own store: {behind} records behind, {resume_s:.2f}s")
    print(f"restore/bare = {rate / bare_rate:.2f}x; restore {rate:,.0f} events/s, bare "
          f"{bare_rate:,.0f} events/s, {restore_s * 100_000 / records:.2f} s per 100k keys")


if __name__ == "__main__":
    main()
