"""``Worker.perform`` on Apache Kafka through a ``serve`` instance, against the floor.

The floor of one perform is what any correct worker must wait for: two sequential acks=all
produce round trips (the dispatch before the call, the outcome after it) and one end-offsets
request (to know the key's state is current), made with bare confluent-kafka. effectlog's
perform asks the judge of ``serve`` for the key as it stands (``POST /v1/judge``, no wait),
appends CREATE+RESERVE+DISPATCH in one ordered produce, asks the judge for its verdict on
exactly those events (answered once serve has applied them), calls the provider (a no-op
here) only on a positive verdict on its DISPATCH, appends RECORD and waits for the verdict on
it. Throughput with 1, 8 and 32 threads sharing one log and one judge client (questions from
threads meeting in flight go out together) is compared with bare threads producing the same
records in the same pattern, on topics of their own, once before and once after effectlog's
phase (the mean of the two). The run's topics are deleted at the end, so a shared broker does
not collect them.

Usage: python bench/kafka_worker.py [--samples N] [--effects N]
The last line gives perform's p50 as a ratio to the floor, and 32 threads' throughput as a
ratio to the bare writers, with the absolute figures.
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from _common import broker_pid, cpu_seconds, kafka_bootstrap, percentile, run_topics, threaded
from confluent_kafka import OFFSET_END, Consumer, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.judge.client import ClusterJudge
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings, murmur2_partition
from effectlog.log.kafka.producer import producer_config
from effectlog.log.kafka.reader import reader_config
from effectlog.worker import Worker
from tests.cluster_support import Serve, wait_until

VALUE = bytes(420)


class Bare:
    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.producer = Producer(producer_config(settings))
        self.offsets = Consumer(reader_config(settings))
        self.name = settings.topic(EVENTS)
        self._stop = threading.Event()
        self._poller = threading.Thread(target=self._poll, daemon=True)
        self._poller.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.05)

    def produce(self, key: str, count: int) -> None:
        done = threading.Semaphore(0)
        partition = murmur2_partition(key.encode(), self.settings.partitions)
        for _ in range(count):
            self.producer.produce(self.name, VALUE, key.encode(), partition=partition,
                                  on_delivery=lambda err, msg: done.release())
        for _ in range(count):
            done.acquire()

    def floor(self, key: str) -> None:
        partition = murmur2_partition(key.encode(), self.settings.partitions)
        self.offsets.offsets_for_times([TP(self.name, partition, OFFSET_END)], timeout=10)
        self.produce(key, 1)
        self.produce(key, 1)

    def close(self) -> None:
        self._stop.set()
        self._poller.join()
        self.producer.flush(10)
        self.offsets.close()


def bench_append(url: str, server: str, bare: Bare, keys: int = 2500) -> tuple[float, float]:
    """``effectlog append --server`` of 4 transitions per key (10,000 lines for 2,500 keys) as
    a user runs it (a process reading stdin, every line judged), against bare pipelined
    produces of as many records."""
    import json

    run = uuid.uuid4().hex[:6]
    lines = []
    for k in range(keys):
        base = {"operation_id": f"ap-{run}-{k}", "kind": "email.send", "target": f"mailto:{k}",
                "worker_id": "cli"}
        lines += [json.dumps({**base, "transition": t, **extra}) + "\n" for t, extra in (
            ("create", {"payload": {"k": k}}), ("reserve", {}), ("dispatch", {}),
            ("record", {"outcome": {"status": "succeeded", "result": {"k": k}}}))]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "append",
                           "--server", server],
                          input="".join(lines), capture_output=True, text=True, timeout=600)
    ours = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    start = time.perf_counter()
    for k in range(keys):
        bare.producer.produce(bare.name, VALUE, f"bare-ap-{run}-{k}".encode())
        bare.producer.produce(bare.name, VALUE, f"bare-ap-{run}-{k}".encode())
        bare.producer.produce(bare.name, VALUE, f"bare-ap-{run}-{k}".encode())
        bare.producer.produce(bare.name, VALUE, f"bare-ap-{run}-{k}".encode())
    bare.producer.flush(60)
    return len(lines) / ours, len(lines) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=1000,
                        help="floor and perform pairs run before sampling (a fresh broker's "
                             "JVM and a fresh serve are slower for their first thousand)")
    parser.add_argument("--effects", type=int, default=4800, help="per thread count")
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as tmp:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        prefix = f"kw{uuid.uuid4().hex[:8]}"
        url = f"kafka://{bootstrap}?prefix={prefix}"
        # bare writers use topics of their own (same partitions): serve, the key tail and the
        # log cleaner never see their records while effectlog is measured
        bare_url = f"kafka://{bootstrap}?prefix={prefix}bare"
        with run_topics(url), run_topics(bare_url):
            rows, appended, bare_appended, floor, ours = measure(
                args, url, KafkaSettings.from_url(bare_url), Path(tmp), broker_pid(bootstrap))
    report(rows, appended, bare_appended, floor, ours)


#: threads, effectlog's effects/s, the bare writers' effects/s, and CPU ms per effect:
#: effectlog's (this process, serve, broker), the bare writers' (this process, broker), and
#: the share of questions to the judge sent with others
Row = tuple[int, float, float, tuple[float, float, float], tuple[float, float], float]


def cpu_now(*pids: int | None) -> list[float]:
    """CPU seconds so far of this process and of ``pids`` (0 for an unknown one)."""
    own = os.times()
    return [own.user + own.system, *(cpu_seconds(pid) for pid in pids)]


def measure(args: argparse.Namespace, url: str, bare_settings: KafkaSettings, tmp: Path,
            broker: int | None) -> tuple[list[Row], float, float, list[float], list[float]]:
    """The floor and perform samples, the thread rows and the append figures of one run."""
    node = Serve(tmp, "bench", url, tmp / "provider.db")
    log = open_log(url)
    bare = Bare(bare_settings)
    try:
        wait_until(lambda: len(node.serving()) == bare_settings.partitions, 90, "serve is up")
        run = uuid.uuid4().hex[:6]
        worker = Worker(log, "bench", server=node.url)  # as a user writes it
        n, warm = args.samples, args.warmup
        floor, ours = [], []
        for i in range(n + warm):
            key = f"agent:floor-{run}-{i}:k:t"
            t0 = time.perf_counter()
            bare.floor(key)
            t1 = time.perf_counter()
            worker.perform(f"one-{run}-{i}", "email.send", f"mailto:u{i}", {"i": i},
                           lambda call: None)
            t2 = time.perf_counter()
            if i >= warm:
                floor.append((t1 - t0) * 1000)
                ours.append((t2 - t1) * 1000)
        rows = []
        for threads in (1, 8, 32):
            per = max(1, args.effects // threads)
            judge = ClusterJudge(node.url)  # one per process, shared by its workers
            workers = [Worker(log, f"bench-{threads}-{t}", judge=judge) for t in range(threads)]
            before = bare_phase(bare, threads, per, f"{run}a")
            cpu0 = cpu_now(node.process.pid, broker)
            ours_s = threaded(threads, functools.partial(perform_phase, workers, per,
                                                         f"t{threads}-{run}"))
            cpu1 = cpu_now(node.process.pid, broker)
            # bare writers before and after effectlog's phase: the mean of the two
            bare_s = (before + bare_phase(bare, threads, per, f"{run}b")) / 2
            cpu2 = cpu_now(node.process.pid, broker)
            effects = per * threads
            ours_cpu = tuple((b - a) / effects * 1000 for a, b in zip(cpu0, cpu1, strict=True))
            bare_cpu = tuple((b - a) / effects * 1000 for a, b in zip(cpu1, cpu2, strict=True))
            rows.append((threads, effects / ours_s, effects / bare_s,
                         (ours_cpu[0], ours_cpu[1], ours_cpu[2]), (bare_cpu[0], bare_cpu[2]),
                         judge.batched / (3 * effects)))
            judge.close()
        appended, bare_appended = bench_append(url, node.url, bare)
    finally:
        bare.close()
        log.close()
        node.stop()
    return rows, appended, bare_appended, floor, ours


def perform_phase(workers: list[Worker], per: int, run: str, t: int) -> None:
    """Thread ``t``'s share of a threaded phase: ``per`` performs with a no-op provider."""
    for i in range(per):
        workers[t].perform(f"{run}-{t}-{i}", "email.send", f"mailto:{t}-{i}", {"i": i},
                           lambda call: None)


def bare_phase(bare: Bare, threads: int, per: int, run: str) -> float:
    """Seconds for ``threads`` bare writers to produce ``per`` effects' records each, in the
    pattern of a perform (3 records, wait, 1 record, wait)."""
    def writer(t: int) -> None:
        for i in range(per):
            bare.produce(f"agent:bare{threads}-{run}-{t}-{i}:k:t", 3)
            bare.produce(f"agent:bare{threads}-{run}-{t}-{i}:k:t", 1)

    return threaded(threads, writer)


def report(rows: list[Row], appended: float, bare_appended: float, floor: list[float],
           ours: list[float]) -> None:
    p50, floor50 = percentile(ours, 50), percentile(floor, 50)
    print(f"floor (2 produce round trips + 1 ListOffsets, bare): p50 {floor50:.2f} ms, "
          f"p99 {percentile(floor, 99):.2f} ms")
    print(f"Worker.perform through serve (1 thread):              p50 {p50:.2f} ms, "
          f"p99 {percentile(ours, 99):.2f} ms ({p50 / floor50:.2f}x the floor; target <= 2.5x)")
    for threads, effects_s, bare_s, (mine, serve, broker), (bare_own, bare_broker), shared \
            in rows:
        print(f"{threads:2d} threads: effectlog {effects_s:7.0f} effects/s, bare writers of the same "
              f"records {bare_s:7.0f}/s ({effects_s / bare_s:.2f}x)")
        known = f"broker {broker:.2f}" if broker else "broker unknown"
        print(f"    CPU ms per effect: worker process {mine:.2f}, serve {serve:.2f}, {known}; "
              f"bare writers {bare_own:.2f}"
              + (f", broker {bare_broker:.2f}" if bare_broker else "")
              + f"; {shared:.0%} of questions to the judge shared a request")
    print(f"effectlog append, 10,000 lines over 2,500 keys: {appended:.0f} lines/s (target >= 1,000; "
          f"bare pipelined produce of as many records {bare_appended:.0f}/s, "
          f"{appended / bare_appended:.2f}x)")
    t32 = rows[-1]
    print(f"kafka_worker: perform p50 {p50 / floor50:.2f}x floor ({p50:.2f} vs {floor50:.2f} ms); "
          f"32 threads {t32[1] / t32[2]:.2f}x bare ({t32[1]:.0f} vs {t32[2]:.0f} effects/s)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
