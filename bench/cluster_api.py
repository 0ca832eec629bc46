"""The query API of a two-member cluster on Kafka: GET latency, read-your-writes, failover.

Two ``effectlog serve`` processes share a six-partition events topic holding N effects.

1. ``GET /v1/effects/{key}`` p50/p99, answered by the partition's owner (local) and by the
   other member (forwarded); floor: a bare aiohttp server answering the same bytes, same
   client (urllib3, keep-alive).
2. Read-your-writes: a durable append, then ``GET ?min_offset=<its offset>`` at the owner;
   the GET's time is the wait for the projection. Floor: a bare consumer, long-polling the
   partition, receiving a record produced by a bare producer (produce to receipt).
3. Failover: SIGKILL one member; time until every key answers 200 from the survivor. Floor:
   the group session timeout (a dead member is noticed no sooner).

Usage: python bench/cluster_api.py [--effects N] [--samples N]   (EFFECTLOG_BENCH_KAFKA for a
broker of your own; otherwise Apache Kafka is started from the Maven jars, see tools/kafka)
The last line gives local and forwarded GET p50 as ratios to the bare server, and the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import urllib3
from _common import ROOT, kafka_bootstrap, percentile
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as TP

from effectlog.codec import event_codec
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.log.kafka import KafkaSettings, create_topics
from effectlog.machine import new_effect
from tools.kafka.broker import free_port

SESSION_S = 6
BARE_SERVER = """
import sys
from aiohttp import web
body = open(sys.argv[2], "rb").read()
async def answer(request):
    return web.Response(body=body, content_type="application/json")
app = web.Application()
app.router.add_get("/v1/effects/{key:.+}", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""
HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=15))


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def wait_for(url: str, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if HTTP.request("GET", url).status in (200, 404):
                return
        except urllib3.exceptions.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def timed_get(url: str) -> tuple[float, int, dict[str, str]]:
    started = time.perf_counter()
    response = HTTP.request("GET", url)
    return time.perf_counter() - started, response.status, dict(response.headers)


def serve(url: str, work: Path, name: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
         str(work / f"state-{name}"), "serve", "--http", f"127.0.0.1:{port}",
         "--session-timeout", f"{SESSION_S}s", "--no-recovery"], cwd=ROOT, stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=(work / f"{name}.err").open("w"))
    return proc, f"http://127.0.0.1:{port}"


def owners(members: list[str]) -> dict[int, str]:
    found = {}
    for member in members:
        health = json.loads(HTTP.request("GET", member + "/healthz").data)
        found.update({int(p): member for p, s in health["partitions"].items() if s == "serving"})
    return found


def bare_latency(settings: KafkaSettings, samples: int) -> list[float]:
    """Produce (acks=all) to receipt by a consumer long-polling the partition."""
    topic = settings.topic(EVENTS)
    producer = Producer({**settings.client_config(), "linger.ms": 0, "acks": "all",
                         "enable.idempotence": True})
    consumer = Consumer({**settings.client_config(), "group.id": f"bare-{uuid.uuid4().hex}",
                         "fetch.wait.max.ms": 20, "fetch.min.bytes": 1,
                         "isolation.level": "read_committed", "socket.nagle.disable": True})
    consumer.assign([TP(topic, 0, -1)])  # the end
    consumer.poll(1.0)
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        producer.produce(topic, b"x", b"k", partition=0)
        producer.flush(10)
        while True:
            msg = consumer.poll(5.0)
            if msg is not None and msg.error() is None:
                break
        out.append(time.perf_counter() - started)
    consumer.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=600)
    parser.add_argument("--samples", type=int, default=400)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        url = f"kafka://{bootstrap}?prefix=api{uuid.uuid4().hex[:8]}&partitions=6"
        settings = KafkaSettings.from_url(url)
        create_topics(settings)
        log = open_log(url)
        codec = event_codec()
        keys = []
        for i in range(args.effects):
            event = new_effect(f"op{i}", "email.send", f"mailto:u{i}@example.com", {"n": i}, "w")
            keys.append(event.idempotency_key)
            log.append(EVENTS, event.idempotency_key, codec.encode(event.to_record()))
        work = Path(tempfile.mkdtemp(prefix="effectlog-api-"))
        procs = [serve(url, work, name) for name in ("a", "b")]
        bare_port = free_port()
        body = work / "body.json"
        bare_proc = None
        try:
            members = [u for _, u in procs]
            for member in members:
                wait_for(f"{member}/v1/effects/{keys[0]}")
            deadline = time.monotonic() + 60
            while len(owners(members)) < 6 or len(set(owners(members).values())) < 2:
                if time.monotonic() > deadline:
                    raise SystemExit("the two members did not share the partitions")
                time.sleep(0.2)
            placed = owners(members)
            body.write_bytes(HTTP.request("GET", f"{members[0]}/v1/effects/{keys[0]}").data)
            bare_proc = subprocess.Popen([sys.executable, "-c", BARE_SERVER, str(bare_port),
                                          str(body)], stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            wait_for(f"http://127.0.0.1:{bare_port}/v1/effects/k")

            local, forwarded, floor = [], [], []
            for n in range(args.samples):
                key = keys[n % len(keys)]
                owner = placed[log.partition_for(EVENTS, key)]
                other = next(m for m in members if m != owner)
                local.append(timed_get(f"{owner}/v1/effects/{key}")[0])
                forwarded.append(timed_get(f"{other}/v1/effects/{key}")[0])
                floor.append(timed_get(f"http://127.0.0.1:{bare_port}/v1/effects/{key}")[0])

            waits = []
            for n in range(args.samples // 2):
                event = new_effect(f"ryw{n}", "email.send", f"mailto:r{n}@example.com", {}, "w")
                key = event.idempotency_key
                owner = placed[log.partition_for(EVENTS, key)]
                offset = log.append(EVENTS, key, codec.encode(event.to_record())).offset
                took, status, _ = timed_get(f"{owner}/v1/effects/{key}?min_offset={offset}")
                assert status == 200, status
                waits.append(took)
            bare_e2e = bare_latency(settings, args.samples // 2)

            victim_proc = procs[0][0]
            survivor = procs[1][1]
            victim_proc.send_signal(signal.SIGKILL)
            victim_proc.wait()
            killed = time.monotonic()
            pending = list(keys)
            while pending:
                if time.monotonic() - killed > 120:
                    raise SystemExit("failover did not finish within 120 s")
                status = HTTP.request("GET", f"{survivor}/v1/effects/{pending[-1]}").status
                if status == 200:
                    pending.pop()
                else:
                    time.sleep(0.05)
            failover_s = time.monotonic() - killed
        finally:
            for proc, _ in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(60)
            if bare_proc is not None:
                bare_proc.send_signal(signal.SIGTERM)
                bare_proc.wait(10)
            log.close()
            if not os.environ.get("EFFECTLOG_BENCH_KEEP"):
                shutil.rmtree(work, ignore_errors=True)

    def p(samples: list[float], pct: float) -> float:
        return percentile(samples, pct)

    print(f"bare aiohttp GET: p50 {ms(p(floor, 50))}, p99 {ms(p(floor, 99))}")
    print(f"GET local: p50 {ms(p(local, 50))}, p99 {ms(p(local, 99))}")
    print(f"GET forwarded: p50 {ms(p(forwarded, 50))}, p99 {ms(p(forwarded, 99))}")
    print(f"read-your-writes GET ?min_offset after a durable append: p50 {ms(p(waits, 50))}, "
          f"p99 {ms(p(waits, 99))}; bare produce-to-consumer p50 {ms(p(bare_e2e, 50))}")
    print(f"failover (SIGKILL to all {len(keys)} keys answering): {failover_s:.1f}s with a "
          f"{SESSION_S}s session timeout")
    print(f"GET local/bare = {p(local, 50) / p(floor, 50):.2f}x, forwarded/bare = "
          f"{p(forwarded, 50) / p(floor, 50):.2f}x; GET local p50 {ms(p(local, 50))}, forwarded "
          f"p50 {ms(p(forwarded, 50))}; read-your-writes p50 {ms(p(waits, 50))} p99 "
          f"{ms(p(waits, 99))}; failover {failover_s:.1f}s (session {SESSION_S}s)")
    if os.environ.get("EFFECTLOG_BENCH_KEEP"):
        print(f"work directory: {work}")


if __name__ == "__main__":
    main()
