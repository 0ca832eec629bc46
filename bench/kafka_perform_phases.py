"""Where one Kafka ``Worker.perform`` spends its time, request by request, warm.

``bench/kafka_worker.py`` gives perform's p50 against its floor; this script splits it into
the worker's requests: the key as it stands (a question to the judge, no wait), the ordered
produce of CREATE+RESERVE+DISPATCH, the verdict on them, the produce of RECORD and the
verdict on it; what is left is the worker's own work (building, encoding, checking).

A second phase asks each verdict a second time at once, which no longer waits for serve to
apply anything: the difference is how long serve takes, after the delivery report, to fetch
and apply the record and answer. Both phases start after a warm-up (a fresh broker's JVM and
a fresh serve are slower for their first thousand performs), and alternate in rounds, so
neither gets the warmer half of the run.

A second floor is printed beside it: ListOffsets and two produces, each followed by a bare
consumer receiving the record, the least any write judged by a projection waits for.

Usage: python bench/kafka_perform_phases.py [--samples N] [--warmup N]
The last line gives perform's p50 as a ratio to the floor (one ListOffsets plus two
acks=all produces, bare, measured in the same run), with the absolute figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import kafka_bootstrap, percentile, run_topics
from confluent_kafka import OFFSET_END, Consumer, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.log import EVENTS, open_log
from effectlog.log.base import EventLog
from effectlog.log.kafka import KafkaSettings, murmur2_partition
from effectlog.log.kafka.producer import producer_config
from effectlog.log.kafka.reader import reader_config
from effectlog.worker import Worker
from effectlog.worker.requests import Append, Ask, Request
from tests.cluster_support import Serve, wait_until

OWN = "the worker's own work"


class PhasedWorker(Worker):
    """A worker timing each request it answers; with ``again``, each verdict is asked a
    second time at once (timed apart, and not counted in the perform)."""

    def __init__(self, log: EventLog, server: str, *, again: bool = False) -> None:
        self.again = again
        self.times: dict[str, list[float]] = defaultdict(list)
        self.outside = 0.0  # seconds of this perform not spent in the worker's path
        self.waited = 0.0  # seconds of this perform spent in its requests
        super().__init__(log, "phases", server=server)

    def _answer(self, request: Request[Any]) -> Any:
        start = time.perf_counter()
        if isinstance(request, Append):
            name = f"produce of {len(request.data)}"
        elif isinstance(request, Ask):
            name = "verdict" if request.query.written else "the key as it stands"
        else:
            name = type(request).__name__
        reply = super()._answer(request)
        took = time.perf_counter() - start
        self.times[name].append(took * 1000)
        self.waited += took
        if self.again and name == "verdict":
            again = time.perf_counter()
            super()._answer(request)
            self.times["verdict asked again at once"].append(
                (time.perf_counter() - again) * 1000)
            self.outside += time.perf_counter() - again
        return reply


def produce_acked(producer: Producer, name: str, key: bytes, value: bytes,
                  partition: int) -> None:
    """One bare acks=all produce, returning once its delivery report came."""
    done = threading.Event()
    producer.produce(name, value, key, partition=partition,
                     on_delivery=lambda err, msg: done.set())
    while not done.is_set():
        producer.poll(0.01)


def floor_once(producer: Producer, offsets: Consumer, name: str, key: bytes,
               partitions: int) -> float:
    """ListOffsets plus two acks=all produces of one record, bare confluent-kafka (ms)."""
    partition = murmur2_partition(key, partitions)
    start = time.perf_counter()
    offsets.offsets_for_times([TP(name, partition, OFFSET_END)], timeout=10)
    for _ in range(2):
        produce_acked(producer, name, key, bytes(420), partition)
    return (time.perf_counter() - start) * 1000


class SeenFloor:
    """The floor of a judged write: ListOffsets, then twice a bare acks=all produce of one
    record followed by a bare consumer (already assigned, at the end) receiving it. Any
    judge that waits until a consumer has seen the writer's record pays at least this."""

    def __init__(self, settings: KafkaSettings, producer: Producer) -> None:
        self.producer = producer
        self.name = settings.topic(EVENTS)
        self.partitions = settings.partitions
        self.offsets = Consumer(reader_config(settings))
        self.consumer = Consumer({**reader_config(settings), "group.id": "seen-floor",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 100})
        ends = [TP(self.name, p, OFFSET_END) for p in range(settings.partitions)]
        self.consumer.assign(ends)

    def once(self, key: bytes, n: int) -> float:
        partition = murmur2_partition(key, self.partitions)
        start = time.perf_counter()
        self.offsets.offsets_for_times([TP(self.name, partition, OFFSET_END)], timeout=10)
        for i in range(2):
            value = b"%d-%d-" % (n, i) + bytes(400)
            produce_acked(self.producer, self.name, key, value, partition)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                msg = self.consumer.poll(0.1)
                if msg is not None and not msg.error() and msg.value() == value:
                    break
        return (time.perf_counter() - start) * 1000

    def close(self) -> None:
        self.offsets.close()
        self.consumer.close()


def perform_once(worker: PhasedWorker, op: str, i: int) -> float:
    """One perform's time (ms), less what ``again`` spent outside its path."""
    worker.outside = worker.waited = 0.0
    start = time.perf_counter()
    worker.perform(op, "email.send", f"mailto:{i}", {"i": i}, lambda call: None)
    took = time.perf_counter() - start - worker.outside
    worker.times[OWN].append((took - worker.waited) * 1000)
    return took * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as tmp:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        prefix = f"kp{uuid.uuid4().hex[:8]}"
        url, bare_url = f"kafka://{bootstrap}?prefix={prefix}", f"kafka://{bootstrap}?prefix={prefix}b"
        settings, bare = KafkaSettings.from_url(url), KafkaSettings.from_url(bare_url)
        with run_topics(url), run_topics(bare_url):
            node = Serve(Path(tmp), "phases", url, Path(tmp) / "provider.db")
            log = open_log(url)
            producer = Producer(producer_config(bare))
            offsets = Consumer(reader_config(bare))
            name = bare.topic(EVENTS)
            try:
                wait_until(lambda: len(node.serving()) == settings.partitions, 90, "serve is up")
                plain = PhasedWorker(log, node.url)
                again = PhasedWorker(log, node.url, again=True)
                seen = SeenFloor(bare, producer)
                floor, ours, seen_floor = [], [], []
                for i in range(args.warmup):  # the broker's JIT and serve's caches
                    floor_once(producer, offsets, name, f"warm-{i}".encode(), bare.partitions)
                    seen.once(f"warm-{i}".encode(), i)
                    perform_once(plain, f"warm-{prefix}-{i}", i)
                plain.times.clear()
                per = max(1, args.samples // args.rounds)
                for r in range(args.rounds):
                    for i in range(per):
                        floor.append(floor_once(producer, offsets, name, f"f{r}-{i}".encode(),
                                                bare.partitions))
                        seen_floor.append(seen.once(f"s{r}-{i}".encode(), i))
                        ours.append(perform_once(plain, f"plain-{prefix}-{r}-{i}", i))
                    for i in range(per // 2):
                        perform_once(again, f"again-{prefix}-{r}-{i}", i)
                seen.close()
            finally:
                producer.flush(10)
                offsets.close()
                log.close()
                node.stop()
    report(floor, seen_floor, ours, plain, again)


def report(floor: list[float], seen_floor: list[float], ours: list[float], plain: PhasedWorker,
           again: PhasedWorker) -> None:
    floor50, ours50, seen50 = (percentile(s, 50) for s in (floor, ours, seen_floor))
    print(f"floor (ListOffsets + 2 produces, bare): p50 {floor50:.2f} ms")
    print(f"floor of a judged write (ListOffsets + 2 x (produce, then a consumer receives it), "
          f"bare): p50 {seen50:.2f} ms; perform is {ours50 / seen50:.2f}x that")
    print(f"perform: p50 {ours50:.2f} ms; per request (p50, count per perform):")
    performs = len(ours)
    for name, samples in plain.times.items():
        print(f"    {name:32s} {percentile(samples, 50):5.2f} ms  x{len(samples) / performs:.0f}")
    print(f"    {'verdict asked again at once':32s} "
          f"{percentile(again.times['verdict asked again at once'], 50):5.2f} ms")
    print(f"kafka_perform_phases: perform p50 {ours50 / floor50:.2f}x floor ({ours50:.2f} vs "
          f"{floor50:.2f} ms)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
