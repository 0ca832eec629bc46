"""Restore of one partition from the changelog (``<prefix>.state``), against bare consume + decode
of the events topic it stands for.

1. Fill: a one-partition events topic, made by effectlog's ``create_topics`` (so the changelog
   topic exists), receives N effects of 4 transitions each (CREATE, RESERVE, DISPATCH, RECORD,
   one key after another, 1% with a stale RESERVE re-sent, which is rejected), from a bare
   batching producer.
2. Publish: a first node (``consumers.node.Node``: the projector and changelog publisher that
   ``effectlog serve`` runs, no HTTP) projects the partition and publishes its state about once
   a second; once the last checkpoint covers the events topic's end it stops.
3. Floor: a bare confluent-kafka consumer assigned the events partition at offset 0 reads every
   record and decodes it with the shared Avro codec (fastavro), with the changelog reader's
   settings, batch size and wait (``read_config``, ``READ_BATCH``, ``READ_WAIT_S``).
4. effectlog: a fresh node with an empty state directory joins a new group and is assigned the
   partition, which runs what serve runs on assignment: take the changelog writer (fences the
   last owner), restore the partition from the changelog (each key's published state, its index
   entry, the checkpoint's offset and counters), replay the events after the checkpoint (none
   here). Timed from the group's assignment callback to the partition serving; the restored
   partition must equal the first node's (states, index, counters). Floor and restore take
   turns ``--runs`` times; the best of each is kept.
5. Resume: the last restored node, stopped, comes back on its own store after 250 more effects
   (1,002 events), which it replays from the events topic.

Figures: restored keys/s, and the events of the topic the restore covers per second (its
checkpoint's offset over the time). The headline ratio is the latter over the floor's events/s
(equivalently, the floor's time over the restore's time); the per-record ratio (keys/s over the
floor's records/s) is printed beside it.

Usage: python bench/cluster_restore.py [--effects N] [--runs N]   (EFFECTLOG_BENCH_KAFKA=host:port
for a broker of your own; otherwise Apache Kafka is started from the Maven jars, see tools/kafka)
The last line gives effectlog's restore rate as a ratio to the floor, and the absolutes.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import kafka_bootstrap, run_topics
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as TP

from consumers.node.assignments import Assignments
from consumers.node.node import Node, NodeSettings
from consumers.node.publisher import Publisher
from effectlog.codec import event_codec
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings
from effectlog.log.kafka.changelog import READ_BATCH, READ_WAIT_S, read_config
from effectlog.machine import advance, new_effect
from effectlog.model import Outcome, State
from effectlog.model import Transition as T
from projections.checkpoint import Checkpoint
from projections.projector import Projector
from projections.rocksdb.digest import partition_digest

#: What a restore must reproduce of the first node's partition (rejections are not published).
COMPARED = ("state", "index", "metadata")


def fill(settings: KafkaSettings, effects: int, start: int = 0) -> int:
    """Produce ``effects`` effects' events (numbered from ``start``); the records written."""
    codec = event_codec()
    producer = Producer({**settings.client_config(), "linger.ms": 20, "acks": "all",
                         "enable.idempotence": True, "batch.size": 1 << 20})
    topic, written = settings.topic(EVENTS), 0
    for i in range(start, start + effects):
        created = new_effect(f"op{i}", "email.send", f"mailto:user{i}@example.com",
                             {"to": f"user{i}@example.com", "n": i}, "bench")
        reserved = advance(created, T.RESERVE, "w1")
        dispatched = advance(reserved, T.DISPATCH, "w1")
        done = advance(dispatched, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"id": i}))
        events = [created, reserved, dispatched, *([reserved] if i % 100 == 99 else []), done]
        key = created.idempotency_key.encode()
        for event in events:
            value = codec.encode(event.to_record())
            while True:
                try:
                    producer.produce(topic, value, key, partition=0)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
        written += len(events)
    if producer.flush(120):
        raise SystemExit("the fill was not acknowledged within 120 s")
    return written


def bare(settings: KafkaSettings) -> tuple[int, float]:
    """(records, seconds) of a bare consumer reading and decoding the events partition."""
    decode = event_codec().decode
    consumer = Consumer(read_config(settings))
    consumer.assign([TP(settings.topic(EVENTS), 0, 0)])
    seen, started = 0, time.perf_counter()
    try:
        while True:
            for msg in consumer.consume(READ_BATCH, READ_WAIT_S):
                err = msg.error()
                if err is None:
                    decode(msg.value())
                    seen += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    return seen, time.perf_counter() - started
                else:
                    raise SystemExit(f"bare consumer: {err.str()}")
    finally:
        consumer.close()


@dataclass(slots=True)
class Timeline:
    """perf_counter marks of one node's first assignment, by phase."""

    assigned: float = 0.0   # the group's assignment callback starts
    taken: float = 0.0      # the changelog writer is taken (earlier owners fenced)
    opened: float = 0.0     # the projector has opened the partition (restored from the changelog)
    serving: float = 0.0    # the gate serves the partition
    replayed: int = 0       # events applied after the restore, before serving

    def phases(self) -> str:
        return (f"take {self.taken - self.assigned:.2f}s, open+restore "
                f"{self.opened - self.taken:.2f}s, to serving {self.serving - self.opened:.2f}s")


@contextlib.contextmanager
def watched(timeline: Timeline) -> Iterator[None]:
    """Mark the phases of the next assignment a node's group hands over (wrapping the
    callback serve runs, and the publisher's take and the projector's open within it)."""
    originals = (Assignments.assigned, Publisher.take, Projector.assigned)

    def assigned(self: Assignments, partitions: Sequence[int]) -> Mapping[int, int]:
        timeline.assigned = timeline.assigned or time.perf_counter()
        return originals[0](self, partitions)

    def take(self: Publisher, partitions: Sequence[int]) -> None:
        originals[1](self, partitions)
        timeline.taken = timeline.taken or time.perf_counter()

    def opened(self: Projector, partitions: Sequence[int]) -> dict[int, int]:
        starts = originals[2](self, partitions)
        timeline.opened = timeline.opened or time.perf_counter()
        return starts

    Assignments.assigned, Publisher.take, Projector.assigned = (  # type: ignore[method-assign]
        assigned, take, opened)
    try:
        yield
    finally:
        Assignments.assigned, Publisher.take, Projector.assigned = originals  # type: ignore[method-assign]


@contextlib.contextmanager
def running(url: str, state_dir: Path) -> Iterator[tuple[Node, Timeline]]:
    """A node (serve's, no HTTP, no recovery loops) in a group of its own, until it serves
    the partition; stopped on exit (its cooperative revoke publishes what is left)."""
    timeline, done = Timeline(), threading.Event()
    node = Node(url, NodeSettings(state_dir=state_dir, http_port=None, loops=False,
                                  group=f"bench-{uuid.uuid4().hex[:8]}", session_timeout_ms=6000))
    metrics = node.gate.on_restored

    def restored(partition: int, records: int, took_s: float) -> None:
        timeline.serving, timeline.replayed = time.perf_counter(), records
        if metrics is not None:
            metrics(partition, records, took_s)
        done.set()

    node.gate.on_restored = restored
    with watched(timeline):
        node.start()
        try:
            if not done.wait(600):
                raise SystemExit("the partition did not start serving within 600 s")
        except BaseException:
            node.stop(30)
            node.close()
            raise
    try:
        yield node, timeline
    finally:
        node.stop(30)
        node.close()


def checkpoint(url: str) -> tuple[Checkpoint | None, int, int]:
    """(the last checkpoint, the events end, the changelog's records) of partition 0."""
    with open_log(url) as log:
        changelog = log.changelog()
        assert changelog is not None
        raw = changelog.last_checkpoint(0)
        published = 0 if raw is None else sum(1 for _ in changelog.read(0))
        return (None if raw is None else Checkpoint.decode(raw)), log.end_offsets(EVENTS)[0], \
            published


def publish(url: str, state_dir: Path) -> tuple[Checkpoint, int, float]:
    """Project and publish the partition with a first node; (the last checkpoint, records in
    the changelog, seconds from serving to the checkpoint covering the end)."""
    with running(url, state_dir) as (node, timeline):
        while True:
            with open_log(url) as log:
                end = log.end_offsets(EVENTS)[0]
                changelog = log.changelog()
                assert changelog is not None
                raw = changelog.last_checkpoint(0)
            if raw is not None and Checkpoint.decode(raw).applied >= end:
                break
            if node.crashed.is_set():
                raise SystemExit(f"the first node failed: {node.failures}")
            time.sleep(0.5)
        took = time.perf_counter() - timeline.assigned
    last, _, records = checkpoint(url)
    assert last is not None
    return last, records, took


def keys_of(last: Checkpoint) -> int:
    return sum(n for label, n in last.counts.items() if label.startswith("state:"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=100_000, help="keys (4 events each)")
    parser.add_argument("--runs", type=int, default=3, help="floor/restore turns (best kept)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="effectlog-restore-"))
    with kafka_bootstrap() as bootstrap:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        url = f"kafka://{bootstrap}?prefix=restore{uuid.uuid4().hex[:8]}&partitions=1"
        settings = KafkaSettings.from_url(url)
        try:
            with run_topics(url):
                started = time.perf_counter()
                events = fill(settings, args.effects)
                print(f"events topic: {args.effects:,} effects, {events:,} records in "
                      f"{time.perf_counter() - started:.1f}s")
                last, published, took = publish(url, work / "first")
                keys = keys_of(last)
                print(f"first node: projected and published up to offset {last.applied:,} in "
                      f"{took:.1f}s; the changelog holds {published:,} records for {keys:,} keys")
                truth = partition_digest(work / "first", 0, COMPARED)
                floors, restores = [], []
                for run in range(args.runs):  # turns, so load changes hit both alike
                    floors.append(bare(settings))
                    with running(url, work / f"restored-{run}") as (_, timeline):
                        pass
                    restores.append(timeline)
                    if partition_digest(work / f"restored-{run}", 0, COMPARED) != truth:
                        raise SystemExit(f"restore {run} differs from the first node's partition")
                    spent = timeline.serving - timeline.assigned
                    print(f"run {run + 1}: floor {floors[-1][0]:,} records in "
                          f"{floors[-1][1]:.2f}s; restore {spent:.2f}s ({timeline.phases()}; "
                          f"{timeline.replayed} events replayed); {floors[-1][1] / spent:.2f}x")
                fill(settings, 250, start=args.effects)  # 1,002 events its store lacks
                with running(url, work / f"restored-{args.runs - 1}") as (_, resumed):
                    pass
        finally:
            shutil.rmtree(work, ignore_errors=True)
    records, floor_s = min(floors, key=lambda f: f[1])
    best = min(restores, key=lambda t: t.serving - t.assigned)
    restore_s = best.serving - best.assigned
    floor_rate, covered, key_rate = records / floor_s, last.applied / restore_s, keys / restore_s
    print(f"floor, bare consume + fastavro decode of the events topic: {records:,} records in "
          f"{floor_s:.2f}s ({floor_rate:,.0f} records/s)")
    print(f"effectlog restore from the changelog: {keys:,} keys ({published:,} changelog records) "
          f"in {restore_s:.2f}s ({best.phases()}): {key_rate:,.0f} keys/s, covering "
          f"{covered:,.0f} events/s of the topic; per record {key_rate / floor_rate:.2f}x the floor")
    print(f"effectlog resume on its own store: {resumed.replayed:,} events replayed, "
          f"{resumed.serving - resumed.assigned:.2f}s from assignment to serving "
          f"({resumed.phases()})")
    print(f"restore/floor = {covered / floor_rate:.2f}x (events covered/s over bare events/s; "
          f"target >= 0.5); restore {covered:,.0f} events/s ({key_rate:,.0f} keys/s, "
          f"{restore_s:.2f}s), floor {floor_rate:,.0f} events/s ({floor_s:.2f}s)")


if __name__ == "__main__":
    main()
