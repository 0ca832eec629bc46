"""Latency of each Kafka adapter operation beside the bare confluent-kafka call, same run.

Operations: a durable append of one record, of three records of one key in order (the
worker's CREATE+RESERVE+DISPATCH) and all or none (one transaction, ``Worker.write``), the
end offsets of every partition, and a positioned read of 0
records (at the end), 1 record and 1,000 records from a random position. The bare side uses
the same broker, topic and durability settings: a producer waiting for its delivery report,
a consumer's ListOffsets request, a consumer assigned at the position and polled until it
has the records (and, for 0 records, a ListOffsets request telling it there are none).

Usage: python bench/kafka_ops.py [--samples N]   (EFFECTLOG_BENCH_KAFKA=host:port for a broker
of your own; otherwise Apache Kafka is started from the Maven jars, see tools/kafka)
The last line gives each operation's p50 as a ratio to the bare call, and the absolute figures.
"""

from __future__ import annotations

import argparse
import random
import time
import uuid
from collections.abc import Callable
from typing import Any

from _common import kafka_bootstrap, percentile
from confluent_kafka import OFFSET_END, Consumer, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.log.base import EVENTS
from effectlog.log.kafka import KafkaLog, KafkaSettings, create_topics, murmur2_partition
from effectlog.log.kafka.producer import producer_config
from effectlog.log.kafka.reader import reader_config

FILL = 5000
VALUE = bytes(400)  # about the size of an encoded effect event


def keys_on(partition: int, partitions: int, count: int) -> list[str]:
    found, n = [], 0
    while len(found) < count:
        key = f"agent:bench-{n}:email.send:mailto:u{n}@example.com"
        if murmur2_partition(key.encode(), partitions) == partition:
            found.append(key)
        n += 1
    return found


class Bare:
    """The raw confluent-kafka calls, configured as effectlog configures its clients."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.producer = Producer(producer_config(settings))
        self.consumer = Consumer(reader_config(settings))

    def produce(self, topic: str, partition: int, items: list[tuple[str, bytes]]) -> None:
        pending = [len(items)]

        def done(err: Any, msg: Any) -> None:
            assert err is None, err
            pending[0] -= 1

        for key, value in items:
            self.producer.produce(topic, value, key.encode(), partition=partition, on_delivery=done)
        while pending[0]:
            self.producer.poll(0.0005)

    def ends(self, topic: str, partitions: int) -> dict[int, int]:
        found = self.consumer.offsets_for_times([TP(topic, p, OFFSET_END) for p in range(partitions)],
                                                timeout=10)
        return {tp.partition: tp.offset for tp in found}

    def read(self, topic: str, partition: int, offset: int, count: int) -> int:
        if count == 0:
            _low, high = self.consumer.get_watermark_offsets(TP(topic, partition), timeout=10)
            return max(0, high - offset)
        self.consumer.assign([TP(topic, partition, offset)])
        got = 0
        while got < count:
            for msg in self.consumer.consume(count - got, 0.001):
                if msg.error() is None:
                    got += 1
        return got

    def close(self) -> None:
        self.producer.flush(10)
        self.consumer.close()


def sample(fn: Callable[[], object], samples: int) -> list[float]:
    for _ in range(min(20, samples)):
        fn()
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        fn()
        out.append((time.perf_counter() - start) * 1000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        url = f"kafka://{bootstrap}?prefix=ops{uuid.uuid4().hex[:8]}"
        settings = KafkaSettings.from_url(url)
        create_topics(settings)
        name, parts = settings.topic(EVENTS), settings.partitions
        log, bare = KafkaLog.from_url(url), Bare(settings)
        keys = keys_on(0, parts, 50)
        log.append_many(EVENTS, [(keys[i % len(keys)], VALUE) for i in range(FILL)])
        rng = random.Random(7)
        n = args.samples

        def key() -> str:
            return rng.choice(keys)

        rows = [
            ("append 1", sample(lambda: log.append(EVENTS, key(), VALUE), n),
             sample(lambda: bare.produce(name, 0, [(key(), VALUE)]), n)),
            ("append 3 ordered (worker)", sample(
                lambda: log.append_ordered(EVENTS, [(key(), VALUE)] * 3), n),
             sample(lambda: bare.produce(name, 0, [(key(), VALUE)] * 3), n)),
            ("append 3 atomic (txn)", sample(lambda: log.append_many(EVENTS, [(key(), VALUE)] * 3), n),
             sample(lambda: bare.produce(name, 0, [(key(), VALUE)] * 3), n)),
            ("end offsets (all)", sample(lambda: log.end_offsets(EVENTS), n),
             sample(lambda: bare.ends(name, parts), n)),
        ]
        end = log.end_offsets(EVENTS)[0]
        rows.append(("read 0 (at the end)", sample(lambda: log.read(EVENTS, 0, end, 10), n),
                     sample(lambda: bare.read(name, 0, end, 0), n)))
        for count in (1, 1000):
            reads = max(30, n // (10 if count > 1 else 1))
            rows.append((f"read {count} (random position)",
                         sample(lambda c=count: log.read(EVENTS, 0, rng.randrange(FILL - c), c), reads),
                         sample(lambda c=count: bare.read(name, 0, rng.randrange(FILL - c), c), reads)))
        log.close()
        bare.close()
    print(f"{'operation':28s} {'effectlog p50':>14s} {'p99':>8s} {'bare p50':>10s} {'p99':>8s} {'ratio':>6s}")
    summary = []
    for label, ours, raw in rows:
        p50, raw50 = percentile(ours, 50), percentile(raw, 50)
        print(f"{label:28s} {p50:11.3f} ms {percentile(ours, 99):8.3f} {raw50:7.3f} ms "
              f"{percentile(raw, 99):8.3f} {p50 / raw50:6.2f}x")
        summary.append(f"{label} {p50 / raw50:.2f}x ({p50:.2f} vs {raw50:.2f} ms)")
    print("kafka_ops p50 vs bare: " + "; ".join(summary))


if __name__ == "__main__":
    main()
