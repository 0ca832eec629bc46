"""The first ``Worker.perform`` of a process on Apache Kafka, against the same process's next ones.

A worker process that opens the log and a :class:`~effectlog.worker.Worker` and performs at
once should not pay, on its first call, for what opening could have done: connecting to the
broker, reading the topic's metadata and acquiring the idempotent producer id. Each sample is
a fresh process (``--threads`` threads, each performing ``--calls`` effects one after
another) against one ``effectlog serve``; it reports the time to open, every thread's first
perform and the later ones. Anything the process printed on stderr (librdkafka's own lines
included) is counted.

Usage: python bench/first_call.py [--samples N] [--threads N] [--calls N]
The last line gives the first perform's p50 as a ratio to the later ones' p50 (the raw
baseline: the same call once everything is warm), with the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import ROOT, kafka_bootstrap, percentile

from effectlog.log.kafka import KafkaSettings, create_topics
from tests.cluster_support import Serve, wait_until

CHILD = r"""
import json, sys, threading, time
started = time.perf_counter()
from effectlog.log import open_log
from effectlog.worker import Worker
log_url, server, threads, calls = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
log = open_log(log_url)
worker = Worker(log, "bench-first", server=server)
opened = time.perf_counter() - started
firsts, laters = [], []
lock = threading.Lock()

def run(t):
    for n in range(calls):
        began = time.perf_counter()
        worker.perform(f"first-{t}-{n}-{started}", "email.send", "mailto:a@example.com",
                       {"n": n}, lambda call: {"ok": True})
        took = time.perf_counter() - began
        with lock:
            (firsts if n == 0 else laters).append(took)

pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
for t in pool: t.start()
for t in pool: t.join()
worker.close(); log.close()
print(json.dumps({"opened": opened, "firsts": firsts, "laters": laters}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--calls", type=int, default=6)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as tmp:
        if bootstrap is None:
            print("no Kafka broker: nothing measured")
            return
        url = f"kafka://{bootstrap}?prefix=first{uuid.uuid4().hex[:8]}&partitions=3"
        create_topics(KafkaSettings.from_url(url))
        serve = Serve(Path(tmp), "a", url, None)
        try:
            wait_until(lambda: serve.serving() == [0, 1, 2], 90, "serve did not serve")
            opened, firsts, laters, noise = [], [], [], []
            for _ in range(args.samples):
                done = subprocess.run([sys.executable, "-c", CHILD, url, serve.url,
                                       str(args.threads), str(args.calls)], cwd=ROOT,
                                      capture_output=True, text=True, timeout=120, check=True)
                figures = json.loads(done.stdout.strip().splitlines()[-1])
                opened.append(figures["opened"])
                firsts += figures["firsts"]
                laters += figures["laters"]
                noise += done.stderr.splitlines()
        finally:
            serve.stop()
    ms = 1000
    first50, later50 = percentile(firsts, 50) * ms, percentile(laters, 50) * ms
    print(f"open p50 {percentile(opened, 50) * ms:.1f} ms; first perform p50 {first50:.1f} ms, "
          f"max {max(firsts) * ms:.1f} ms; later p50 {later50:.1f} ms; stderr lines {noise}")
    print(f"first/later p50 ratio: {first50 / later50:.2f}x ({args.samples} processes x "
          f"{args.threads} threads, {time.strftime('%Y-%m-%d')})")


if __name__ == "__main__":
    main()
