"""Append throughput and durable-transition latency: effectlog against the raw paths.

SQLite: effect cycles through the worker API (create, reserve, dispatch, record; each event
durable and read back) against bare fsync'd inserts of the same bytes, one commit each.
Kafka: workers sharing one KafkaLog producer against a bare confluent-kafka producer with the
same durability settings (idempotence, acks=all) producing the same bytes.

Usage: python bench/append.py [--events N] [--threads T]
The last line is effectlog's throughput as a ratio to the raw baseline, with absolute rates.
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from _common import kafka_bootstrap, median, percentile

from effectlog.codec import event_codec
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.machine import advance, new_effect
from effectlog.model import EffectEvent, Outcome, State, Transition
from effectlog.worker import Worker


def cycle_records(n_cycles: int) -> list[tuple[str, bytes]]:
    """The encoded events of ``n_cycles`` full effect cycles (4 events each)."""
    codec = event_codec()
    out: list[tuple[str, bytes]] = []
    for i in range(n_cycles):
        e = new_effect(f"bench-{i}", "email.send", f"mailto:u{i}@example.com", {"n": i}, "w")
        r = advance(e, Transition.RESERVE, "w")
        d = advance(r, Transition.DISPATCH, "w")
        s = advance(d, Transition.RECORD, "w", outcome=Outcome(State.SUCCEEDED, {"id": i}))
        out += [(ev.idempotency_key, codec.encode(ev.to_record())) for ev in (e, r, d, s)]
    return out


class OwnWritesView:
    """State of the keys this process wrote: what a worker that owns its keys needs on
    Kafka when no projection runs beside it (read-your-writes off)."""

    def __init__(self) -> None:
        self.latest: dict[str, EffectEvent] = {}
        self.lock = threading.Lock()

    def current(self, key: str) -> EffectEvent | None:
        return self.latest.get(key)

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        with self.lock:
            self.latest[event.idempotency_key] = event
        return True


def run_cycles(log: EventLog, prefix: str, count: int, view: Any = None,
               verify: bool = True) -> None:
    worker = Worker(log, f"bench-{prefix}", view=view, verify=verify or view is not None)
    for i in range(count):
        worker.perform(f"{prefix}-{i}", "email.send", f"mailto:u{i}@example.com", {"n": i},
                       lambda call: {"id": call.key})


def threaded(threads: int, fn: Any) -> float:
    start = time.perf_counter()
    pool = [threading.Thread(target=fn, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - start


# -- SQLite -------------------------------------------------------------------------------

def bare_sqlite(path: Path, records: list[tuple[str, bytes]]) -> float:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    # The same table layout as the log (rowid offsets, index by key): only effectlog's own
    # work differs between the two runs.
    db.execute("CREATE TABLE events (rid INTEGER PRIMARY KEY, key TEXT, value BLOB, ts INTEGER)")
    db.execute("CREATE INDEX events_key ON events(key, rid)")
    start = time.perf_counter()
    for key, value in records:
        db.execute("BEGIN")
        db.execute("INSERT INTO events(key, value, ts) VALUES (?, ?, ?)", (key, value, 0))
        db.execute("COMMIT")
    elapsed = time.perf_counter() - start
    db.close()
    return elapsed


def bench_sqlite(tmp: Path, events: int, threads: int, rounds: int = 3) -> dict[str, float]:
    """Alternate bare and effectlog runs on fresh files; keep the median of each."""
    from effectlog.log.sqlite import SqliteLog

    cycles = events // 4
    records = cycle_records(cycles)
    bare, ours = [], []
    for r in range(rounds):
        bare.append(bare_sqlite(tmp / f"bare{r}.db", records))
        log = SqliteLog(tmp / f"effectlog{r}.db")
        ours.append(_time(lambda log=log, r=r: run_cycles(log, f"s{r}", cycles)))
        log.close()
    bare_s, ours_s = median(bare), median(ours)
    log = SqliteLog(tmp / "latency.db")
    latencies = []
    worker = Worker(log, "lat")
    for i in range(200):
        key = f"agent:lat-{i}:email.send:mailto:x@example.com"
        worker.create(f"lat-{i}", "email.send", "mailto:x@example.com", {"i": i})
        worker.reserve(key)
        start = time.perf_counter()
        worker.dispatch(key)
        latencies.append(time.perf_counter() - start)
    shared = SqliteLog(tmp / "shared.db")
    per_thread = max(1, cycles // threads)
    conc_s = threaded(threads, lambda t: run_cycles(shared, f"t{t}", per_thread))
    return {
        "bare_eps": len(records) / bare_s, "ours_eps": cycles * 4 / ours_s,
        "cycle_ratio": ours_s / bare_s,
        "p50_ms": percentile(latencies, 50) * 1000, "p99_ms": percentile(latencies, 99) * 1000,
        "concurrent_eps": threads * per_thread * 4 / conc_s,
    }


def _time(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- Kafka --------------------------------------------------------------------------------

def bench_kafka(bootstrap: str, events: int, threads: int, extra: str = "") -> dict[str, float]:
    from confluent_kafka import Producer

    from effectlog.log.kafka import KafkaLog, KafkaSettings
    from effectlog.log.kafka_admin import create_topics

    url = f"kafka://{bootstrap}?prefix=bench{uuid.uuid4().hex[:8]}{extra}"
    settings = KafkaSettings.from_url(url)
    create_topics(settings)
    cycles = events // 4
    records = cycle_records(cycles)
    topic = settings.topic(EVENTS)

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": settings.linger_ms,
                         "partitioner": "murmur2_random"})
    failures: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failures.append(err)

    def produce_all() -> None:
        for key, value in records:
            while True:
                try:
                    producer.produce(topic, value, key, on_delivery=report)
                    break
                except BufferError:
                    producer.poll(0.01)
            producer.poll(0)
        producer.flush(60)

    producer.produce(topic, b"warm-up", b"warm-up", on_delivery=report)  # connect first
    producer.flush(10)
    bare_s = _time(produce_all)
    assert not failures, failures[:3]
    bare_lat = []
    for key, value in records[:200]:
        start = time.perf_counter()
        producer.produce(topic, value, key, on_delivery=report)
        producer.flush(10)
        bare_lat.append(time.perf_counter() - start)

    log = KafkaLog.from_url(url)
    log.append(EVENTS, "warm-up", b"warm-up")  # connect first, as the bare producer did
    batch_s = _time(lambda: log.append_many(EVENTS, records))
    per_thread = max(1, cycles // threads)
    views = [OwnWritesView() for _ in range(threads)]
    conc_s = threaded(threads, lambda t: run_cycles(log, f"k{t}-{uuid.uuid4().hex[:6]}",
                                                     per_thread, view=views[t]))
    lat = []
    for key, value in records[:200]:
        start = time.perf_counter()
        log.append(EVENTS, key, value)
        lat.append(time.perf_counter() - start)
    log.close()
    return {
        "bare_eps": len(records) / bare_s, "batch_eps": len(records) / batch_s,
        "concurrent_eps": threads * per_thread * 4 / conc_s,
        "p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000,
        "bare_p50_ms": median(bare_lat) * 1000, "bare_p99_ms": percentile(bare_lat, 99) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--kafka-events", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s = bench_sqlite(Path(tmp), args.events, min(args.threads, 8))
    print(f"sqlite bare fsync'd insert      {s['bare_eps']:10.0f} events/s")
    print(f"sqlite effectlog worker cycles  {s['ours_eps']:10.0f} events/s "
          f"({s['ours_eps'] / s['bare_eps']:.2f}x bare; target >= 0.5)")
    print(f"sqlite full cycle vs 4 inserts  {s['cycle_ratio']:10.2f}x (target <= 1.5)")
    print(f"sqlite durable dispatch latency p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms")
    print(f"sqlite 8 threads, one log       {s['concurrent_eps']:10.0f} events/s")
    line = (f"append: sqlite {s['ours_eps'] / s['bare_eps']:.2f}x bare "
            f"({s['ours_eps']:.0f} vs {s['bare_eps']:.0f} events/s)")
    with kafka_bootstrap() as bootstrap:
        if bootstrap is not None:
            k = bench_kafka(bootstrap, args.kafka_events, args.threads)
            print(f"kafka bare producer             {k['bare_eps']:10.0f} events/s")
            print(f"kafka effectlog append_many     {k['batch_eps']:10.0f} events/s "
                  f"({k['batch_eps'] / k['bare_eps']:.2f}x bare)")
            print(f"kafka {args.threads} worker threads, one producer {k['concurrent_eps']:8.0f} "
                  f"events/s ({k['concurrent_eps'] / k['bare_eps']:.2f}x bare)")
            print(f"kafka durable append latency p50 {k['p50_ms']:.2f} ms, p99 {k['p99_ms']:.2f} ms"
                  f" (bare produce+flush p50 {k['bare_p50_ms']:.2f} ms, "
                  f"p99 {k['bare_p99_ms']:.2f} ms)")
            line += (f"; kafka {k['batch_eps'] / k['bare_eps']:.2f}x bare batched "
                     f"({k['batch_eps']:.0f} vs {k['bare_eps']:.0f} events/s), "
                     f"{k['concurrent_eps'] / k['bare_eps']:.2f}x with {args.threads} workers "
                     f"({k['concurrent_eps']:.0f} events/s)")
    print(line)


if __name__ == "__main__":
    main()
