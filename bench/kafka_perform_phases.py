"""Where one Kafka ``Worker.perform`` spends its time, and what asking early would save.

``bench/kafka_worker.py`` gives perform's p50 against its floor; this script splits it into
the worker's requests: the key as it stands (a question to the judge, no wait), the ordered
produce of CREATE+RESERVE+DISPATCH, the verdict on them, the produce of RECORD and the
verdict on it.

A separate phase asks each verdict a second time at once, which no longer waits for serve to
apply anything: the difference is how long serve takes, after the delivery report, to fetch
and apply the record and answer. A last phase measures the upper bound of one idea for the
target (p50 within 2.5x the floor): sending each verdict question *while* the produce is in
flight, so the judge waits on the record as the broker writes it. A real worker cannot name
the offsets before the delivery report; here the bench is the only writer of its topics, so it
predicts them, and a question whose prediction missed is asked again (counted). This is a
measurement, not a mode of the worker: an answer is still only taken for the offsets the
delivery report named.

Usage: python bench/kafka_perform_phases.py [--samples N]
The last line gives perform's p50 and the early-question p50 as ratios to the floor (one
ListOffsets plus two acks=all produces, bare, measured in the same run), with the absolute
figures.
"""

from __future__ import annotations

import argparse
import json
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

from effectlog.codec import event_codec
from effectlog.judge.client import PATH, ClusterJudge
from effectlog.judge.query import Answer, Query, Written
from effectlog.judge.wire import parse_answer, query_json
from effectlog.log import EVENTS, open_log
from effectlog.log.base import EventLog
from effectlog.log.kafka import KafkaSettings, murmur2_partition
from effectlog.log.kafka.producer import producer_config
from effectlog.log.kafka.reader import reader_config
from effectlog.worker import Worker
from effectlog.worker.requests import Append, Ask, Request
from effectlog.worker.sync import answer_log
from tests.cluster_support import Serve, wait_until


class PhasedWorker(Worker):
    """A worker timing each request it answers; with ``early``, a verdict question is sent
    before the produce it is about (offsets predicted) and read after its delivery report."""

    def __init__(self, log: EventLog, server: str, partitions: int, *, early: bool = False,
                 again: bool = False) -> None:
        self.server = server
        self.early = early
        self.again = again
        self.partitions = partitions
        self.times: dict[str, list[float]] = defaultdict(list)
        self.missed = 0
        self.next_offset = dict(log.end_offsets(EVENTS))
        self._stash: dict[Query, Answer] = {}
        self._codec = event_codec()
        self._client = ClusterJudge(server)
        super().__init__(log, "phases", judge=self._client)

    def _answer(self, request: Request[Any]) -> Any:
        start = time.perf_counter()
        if isinstance(request, Append):
            name = f"produce of {len(request.data)}"
            reply = self._append_early(request) if self.early else answer_log(self.log, request)
            self.next_offset[reply[0].partition] = reply[-1].offset + 1
        elif isinstance(request, Ask) and request.query.written:
            name = "verdict"
            reply = self._stash.pop(request.query, None)
            if reply is None:
                reply = super()._answer(request)
                if self.again:
                    verdict_s = time.perf_counter() - start
                    self._time("verdict asked again at once", super()._answer, request)
                    start = time.perf_counter() - verdict_s
        else:
            name = "the key as it stands" if isinstance(request, Ask) else type(request).__name__
            reply = super()._answer(request)
        self.times[name].append((time.perf_counter() - start) * 1000)
        return reply

    def _time(self, name: str, fn: Any, request: Request[Any]) -> None:
        start = time.perf_counter()
        fn(request)
        self.times[name].append((time.perf_counter() - start) * 1000)

    def _append_early(self, request: Append) -> Any:
        partition = murmur2_partition(request.key.encode(), self.partitions)
        first = self.next_offset.get(partition, 0)
        ids = [self._codec.decode(d)["event_id"] for d in request.data]
        query = Query(request.key, written=tuple(Written(first + i, e) for i, e in enumerate(ids)))
        body = json.dumps({"judge": self._client.fingerprint, "timeout_ms": 10_000,
                           "queries": [query_json(query)]}).encode()
        produced: list[Any] = []
        status, data, _ = self._client._http.request(
            self.server, PATH, body, connect_timeout_s=2, read_timeout_s=15,
            during=lambda: produced.append(answer_log(self.log, request)))
        positions = produced[0]
        if status == 200 and positions[0].offset == first:
            answers = [parse_answer(a) for a in json.loads(data)["answers"]]
            if answers:
                self._stash[query] = answers[0]
        else:
            self.missed += 1
        return positions


def floor_samples(settings: KafkaSettings, samples: int) -> list[float]:
    """ListOffsets plus two acks=all produces of one record, bare confluent-kafka (ms)."""
    producer = Producer(producer_config(settings))
    offsets = Consumer(reader_config(settings))
    name, out = settings.topic(EVENTS), []
    try:
        for i in range(samples + 20):
            key = f"floor-{i}".encode()
            partition = murmur2_partition(key, settings.partitions)
            start = time.perf_counter()
            offsets.offsets_for_times([TP(name, partition, OFFSET_END)], timeout=10)
            for _ in range(2):
                done = threading.Event()

                def delivered(err: object, msg: object, done: threading.Event = done) -> None:
                    done.set()

                producer.produce(name, bytes(420), key, partition=partition,
                                 on_delivery=delivered)
                while not done.is_set():
                    producer.poll(0.01)
            if i >= 20:
                out.append((time.perf_counter() - start) * 1000)
    finally:
        producer.flush(10)
        offsets.close()
    return out


def run_phase(worker: PhasedWorker, samples: int, run: str) -> list[float]:
    totals = []
    for i in range(samples + 20):
        start = time.perf_counter()
        worker.perform(f"{run}-{i}", "email.send", f"mailto:{i}", {"i": i}, lambda call: None)
        if i >= 20:
            totals.append((time.perf_counter() - start) * 1000)
        elif i == 19:
            worker.times.clear()
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=400)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as tmp:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        prefix = f"kp{uuid.uuid4().hex[:8]}"
        url, bare_url = f"kafka://{bootstrap}?prefix={prefix}", f"kafka://{bootstrap}?prefix={prefix}b"
        settings = KafkaSettings.from_url(url)
        with run_topics(url), run_topics(bare_url):
            node = Serve(Path(tmp), "phases", url, Path(tmp) / "provider.db")
            log = open_log(url)
            try:
                wait_until(lambda: len(node.serving()) == settings.partitions, 90, "serve is up")
                floor = floor_samples(KafkaSettings.from_url(bare_url), args.samples)
                plain = PhasedWorker(log, node.url, settings.partitions)
                ours = run_phase(plain, args.samples, f"plain-{prefix}")
                again = PhasedWorker(log, node.url, settings.partitions, again=True)
                run_phase(again, args.samples, f"again-{prefix}")
                plain.times["verdict asked again at once"] = \
                    again.times["verdict asked again at once"]
                early = PhasedWorker(log, node.url, settings.partitions, early=True)
                asked_early = run_phase(early, args.samples, f"early-{prefix}")
            finally:
                log.close()
                node.stop()
    report(floor, ours, plain, asked_early, early)


def report(floor: list[float], ours: list[float], plain: PhasedWorker,
           asked_early: list[float], early: PhasedWorker) -> None:
    floor50, ours50, early50 = (percentile(s, 50) for s in (floor, ours, asked_early))
    print(f"floor (ListOffsets + 2 produces, bare): p50 {floor50:.2f} ms")
    print(f"perform: p50 {ours50:.2f} ms; per request (p50, count per perform):")
    performs = len(ours)
    for name, samples in plain.times.items():
        print(f"    {name:32s} {percentile(samples, 50):5.2f} ms  x{len(samples) / performs:.0f}")
    print(f"perform asking each verdict during its produce: p50 {early50:.2f} ms "
          f"({early.missed} predictions missed); per request:")
    for name, samples in early.times.items():
        print(f"    {name:32s} {percentile(samples, 50):5.2f} ms  x{len(samples) / performs:.0f}")
    print(f"kafka_perform_phases: perform p50 {ours50 / floor50:.2f}x floor ({ours50:.2f} vs "
          f"{floor50:.2f} ms); verdicts asked during the produce {early50 / floor50:.2f}x "
          f"({early50:.2f} ms)")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
