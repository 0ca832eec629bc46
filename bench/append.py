"""Append throughput and durable-transition latency: effectlog against the raw paths.

SQLite: effect cycles through ``Worker.perform`` (create, reserve, dispatch, record; every event
durable before the next step) against bare fsync'd inserts of the same bytes, one commit each.
Kafka: ``KafkaLog.append_many`` against a bare confluent-kafka producer with the same
durability settings (idempotence, acks=all) producing the same bytes, pipelined; and worker
threads sharing one KafkaLog against bare threads sharing one producer that write the same
bytes in the same pattern (three records durable, then the fourth).

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

from _common import kafka_bootstrap, median, percentile, threaded, timed

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
        ours.append(timed(lambda log=log, r=r: run_cycles(log, f"s{r}", cycles)))
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


# -- Kafka --------------------------------------------------------------------------------

class BareProducer:
    """A confluent-kafka producer with effectlog's durability settings and a poll thread."""

    def __init__(self, bootstrap: str, linger_ms: int) -> None:
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                                  "acks": "all", "linger.ms": linger_ms,
                                  "partitioner": "murmur2_random"})
        self.failures: list[Any] = []
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failures.append(err)

    def produce_all(self, topic: str, records: list[tuple[str, bytes]]) -> None:
        """Fire and forget, then flush: the raw pipelined path."""
        for key, value in records:
            while True:
                try:
                    self.producer.produce(topic, value, key, on_delivery=self.report)
                    break
                except BufferError:
                    self.producer.poll(0.01)
        self.producer.flush(60)

    def produce_durably(self, topic: str, group: list[tuple[str, bytes]]) -> None:
        """Produce ``group`` and wait for all its delivery reports, as a worker must."""
        done, left = threading.Event(), [len(group)]

        def report(err: Any, msg: Any) -> None:
            self.report(err, msg)
            left[0] -= 1
            if not left[0]:
                done.set()

        for key, value in group:
            self.producer.produce(topic, value, key, on_delivery=report)
        if not done.wait(30):
            raise RuntimeError("no delivery report within 30s")

    def close(self) -> None:
        self._stop.set()
        self._poller.join()
        self.producer.flush(10)


def bench_kafka(bootstrap: str, events: int, thread_counts: tuple[int, ...],
                rounds: int = 3) -> dict[str, Any]:
    """Alternate bare and effectlog runs; keep the median of each.

    For each thread count, that many threads share one producer on each side: bare threads
    produce the same bytes in the worker's write pattern, effectlog threads run
    ``Worker.perform``.
    """
    from effectlog.log.kafka import KafkaLog, KafkaSettings, create_topics

    url = f"kafka://{bootstrap}?prefix=bench{uuid.uuid4().hex[:8]}"
    settings = KafkaSettings.from_url(url)
    create_topics(settings)
    topic = settings.topic(EVENTS)
    records = cycle_records(events // 4)
    bare = BareProducer(bootstrap, settings.linger_ms)
    bare.produce_durably(topic, [("warm-up", b"warm-up")])  # connect first
    log = KafkaLog.from_url(url)
    log.append(EVENTS, "warm-up", b"warm-up")  # connect first, as the bare producer did

    def bare_workers(mine: list[tuple[str, bytes]]) -> None:
        # The worker's write pattern with the same bytes: CREATE+RESERVE+DISPATCH durable
        # in one batch, then RECORD durable.
        for i in range(0, len(mine), 4):
            bare.produce_durably(topic, mine[i:i + 3])
            bare.produce_durably(topic, mine[i + 3:i + 4])

    runs: dict[str, list[float]] = {"bare": [], "batch": []}
    per_threads = {threads: max(1, min(events // 4, 4000) // threads) for threads in thread_counts}
    worker_records = {threads: cycle_records(n * threads) for threads, n in per_threads.items()}
    worker_events = {threads: len(recs) for threads, recs in worker_records.items()}
    for _ in range(rounds):
        runs["bare"].append(timed(lambda: bare.produce_all(topic, records)))
        runs["batch"].append(timed(lambda: log.append_many(EVENTS, records)))
        for threads in thread_counts:
            per_thread, mine = per_threads[threads], worker_records[threads]
            runs.setdefault(f"bare_workers{threads}", []).append(threaded(
                threads, lambda t, n=per_thread, m=mine: bare_workers(m[t * n * 4:(t + 1) * n * 4])))
            runs.setdefault(f"workers{threads}", []).append(threaded(
                threads, lambda t, n=per_thread: run_cycles(
                    log, f"k{t}-{uuid.uuid4().hex[:6]}", n, view=OwnWritesView())))
    assert not bare.failures, bare.failures[:3]
    bare_lat, lat = [], []
    for key, value in records[:200]:
        bare_lat.append(timed(lambda: bare.produce_durably(topic, [(key, value)])))  # noqa: B023
        lat.append(timed(lambda: log.append(EVENTS, key, value)))  # noqa: B023
    worker = Worker(log, "lat", view=OwnWritesView())
    dispatch_lat = []
    for i in range(200):
        key = worker.create(f"lat-{i}", "email.send", "mailto:x@example.com", {"i": i}).idempotency_key
        worker.reserve(key)
        dispatch_lat.append(timed(lambda: worker.dispatch(key)))  # noqa: B023
    bare.close()
    log.close()
    return {
        "dispatch_p50_ms": percentile(dispatch_lat, 50) * 1000,
        "dispatch_p99_ms": percentile(dispatch_lat, 99) * 1000,
        "bare_eps": len(records) / median(runs["bare"]),
        "batch_eps": len(records) / median(runs["batch"]),
        "workers": {threads: (worker_events[threads] / median(runs[f"bare_workers{threads}"]),
                              worker_events[threads] / median(runs[f"workers{threads}"]))
                    for threads in thread_counts},
        "p50_ms": percentile(lat, 50) * 1000, "p99_ms": percentile(lat, 99) * 1000,
        "bare_p50_ms": percentile(bare_lat, 50) * 1000,
        "bare_p99_ms": percentile(bare_lat, 99) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=4000)
    parser.add_argument("--kafka-events", type=int, default=20000)
    parser.add_argument("--threads", type=int, default=8,
                        help="concurrent workers sharing one log (Kafka also runs 32)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s = bench_sqlite(Path(tmp), args.events, args.threads, rounds=5)
    sqlite_ratio = s["ours_eps"] / s["bare_eps"]
    print(f"sqlite bare fsync'd insert      {s['bare_eps']:10.0f} events/s")
    print(f"sqlite effectlog worker cycles  {s['ours_eps']:10.0f} events/s "
          f"({sqlite_ratio:.2f}x bare; target >= 0.5)")
    print(f"sqlite full cycle vs 4 inserts  {s['cycle_ratio']:10.2f}x (target <= 1.5; "
          "perform makes 2 commits per cycle)")
    print(f"sqlite durable dispatch latency p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms")
    print(f"sqlite {args.threads} threads, one log       {s['concurrent_eps']:10.0f} events/s")
    line = (f"append: sqlite {sqlite_ratio:.2f}x bare ({s['ours_eps']:.0f} vs "
            f"{s['bare_eps']:.0f} events/s), full cycle {s['cycle_ratio']:.2f}x four inserts")
    with kafka_bootstrap() as bootstrap:
        if bootstrap is not None:
            counts = tuple(sorted({args.threads, 32}))
            k = bench_kafka(bootstrap, args.kafka_events, counts)
            print("kafka rows below: raw appends, and workers with a bench-only own-writes view "
                  "(no read-back); the worker path users run is bench/kafka_worker.py")
            batch_ratio = k["batch_eps"] / k["bare_eps"]
            print(f"kafka bare producer, pipelined  {k['bare_eps']:10.0f} events/s")
            print(f"kafka effectlog append_many     {k['batch_eps']:10.0f} events/s "
                  f"({batch_ratio:.2f}x bare; target >= 0.5)")
            line += (f"; kafka append_many {batch_ratio:.2f}x bare ({k['batch_eps']:.0f} vs "
                     f"{k['bare_eps']:.0f} events/s)")
            for threads, (bare_eps, ours_eps) in k["workers"].items():
                print(f"kafka {threads:2d} threads, one producer: bare durable writers "
                      f"{bare_eps:7.0f} events/s, effectlog workers {ours_eps:7.0f} events/s "
                      f"({ours_eps / bare_eps:.2f}x)")
                line += (f", {threads} workers {ours_eps / bare_eps:.2f}x "
                         f"({ours_eps:.0f} vs {bare_eps:.0f} events/s)")
            print(f"kafka durable dispatch latency p50 {k['dispatch_p50_ms']:.2f} ms, "
                  f"p99 {k['dispatch_p99_ms']:.2f} ms (Worker.dispatch, own-writes view)")
            print(f"kafka durable append latency p50 {k['p50_ms']:.2f} ms, p99 {k['p99_ms']:.2f} ms"
                  f" (bare produce + delivery p50 {k['bare_p50_ms']:.2f} ms, "
                  f"p99 {k['bare_p99_ms']:.2f} ms)")
    print(line)


if __name__ == "__main__":
    main()
