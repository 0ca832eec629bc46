"""Failover of a two-member cluster holding N keys, with and without standby copies.

Two ``effectlog serve`` processes share a six-partition events topic of N keys (one
snapshot each, as the compacted topic holds them). One is SIGKILLed; three times are taken
from the kill, each for a sample of keys of the moved partitions asked of the survivor:
**reads** (``GET /v1/effects/KEY`` answered, a standby copy's stale answer included),
**verdicts** (the judge answers a fresh question about the key: only a partition's owner
does) and **served** (the survivor serves every partition). Without standbys the survivor
restores the moved partitions; with ``--standbys 1`` it already holds them, answers reads
from them at once and only promotes them. The floor is the group session timeout: a dead
member is noticed no sooner (``--session-timeout``, default 6 s: the lowest a broker with
Kafka's default ``group.min.session.timeout.ms`` accepts). Goals (issue 35): reads within
1 s, verdicts within 6 s.

Usage: python bench/cluster_failover.py [--keys N] [--session-timeout S]
(EFFECTLOG_BENCH_KAFKA for a broker of your own; otherwise Apache Kafka is started from
the Maven jars, see tools/kafka)
The last line gives each failover as a ratio to the session timeout, and the absolutes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import urllib3
from _common import ROOT, kafka_bootstrap
from confluent_kafka import Producer

from effectlog.codec import event_codec
from effectlog.judge.premises import worker_fingerprint
from effectlog.log.base import EVENTS
from effectlog.log.kafka import KafkaSettings, create_topics, murmur2_partition
from effectlog.machine import advance, new_effect
from effectlog.model import Transition as T
from tools.kafka.broker import free_port

SESSION_S = 6.0
HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=15))


def fill(settings: KafkaSettings, count: int) -> None:
    """``count`` distinct keys over every partition, each CREATEd and RESERVEd (a key's
    first record read is its first record ever: a lone RESERVE would be rejected), produced
    in large batches with the clients' murmur2 placement."""
    codec = event_codec()
    producer = Producer({**settings.client_config(), "linger.ms": 20, "acks": "all",
                         "partitioner": "murmur2_random", "enable.idempotence": True,
                         "batch.size": 1 << 20})
    topic = settings.topic(EVENTS)
    create = new_effect("op", "email.send", "mailto:u@example.com", {"n": 0}, "w1")
    templates = [(create.to_record(), "c"), (advance(create, T.RESERVE, "w1").to_record(), "r")]
    for i in range(count):
        for template, tag in templates:
            record = dict(template, idempotency_key=f"agent:op{i}:email.send:mailto:u{i}@example.com",
                          operation_id=f"op{i}", target=f"mailto:u{i}@example.com",
                          event_id=f"{tag}{i}")
            while True:
                try:
                    producer.produce(topic, codec.encode(record),
                                     record["idempotency_key"].encode())
                    break
                except BufferError:
                    producer.poll(0.05)
        producer.poll(0)
    producer.flush(60)


def health(url: str) -> dict[str, object]:
    try:
        found: dict[str, object] = json.loads(HTTP.request("GET", url + "/healthz").data)
        return found
    except (urllib3.exceptions.HTTPError, ValueError):
        return {}


def serving(url: str) -> list[int]:
    parts = health(url).get("partitions", {})
    assert isinstance(parts, dict)
    return sorted(int(p) for p, s in parts.items() if s == "serving")


def wait(condition: object, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {within_s}s")
        time.sleep(0.05)


def start(url: str, state: Path, group: str, standbys: int, err: Path,
          session_s: float) -> tuple[
        subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state", str(state),
         "serve", "--http", f"127.0.0.1:{port}", "--group", group,
         "--session-timeout", f"{session_s:g}s", "--standbys", str(standbys), "--no-recovery"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err.open("w"))
    return proc, f"http://127.0.0.1:{port}"


def readable(survivor: str, key: str) -> bool:
    return HTTP.request("GET", f"{survivor}/v1/effects/{key}").status == 200


def last_status(survivor: str, key: str) -> str:
    reply = HTTP.request("GET", f"{survivor}/v1/effects/{key}")
    return f"{reply.status} {reply.data[:200]!r}"


def judged(survivor: str, keys: list[str]) -> bool:
    """The judge (only an owner) answers a fresh question about every key."""
    body = json.dumps({"judge": worker_fingerprint(), "timeout_ms": 2000, "queries": [
        {"key": k, "written": [], "fresh": True} for k in keys]}).encode()
    reply = HTTP.request("POST", f"{survivor}/v1/judge", body=body,
                         headers={"Content-Type": "application/json"})
    if reply.status != 200:
        return False
    return not json.loads(reply.data).get("unanswered")


def failover(url: str, keys: int, standbys: int, work: Path,
             session_s: float) -> tuple[float, float, float]:
    """Seconds from SIGKILL of one member until the survivor answers reads of every key,
    verdicts on every key, and serves every partition."""
    group = f"failover-{uuid.uuid4().hex[:8]}"
    members = [start(url, work / f"state-{standbys}-{n}", group, standbys,
                     work / f"{standbys}-{n}.err", session_s) for n in ("a", "b")]
    urls = [u for _, u in members]
    try:
        wait(lambda: sorted(serving(urls[0]) + serving(urls[1])) == list(range(6))
             and all(serving(u) for u in urls), 600, "both members serving")
        if standbys:
            wait(lambda: all(len(health(u).get("standbys", {})) == 6 - len(serving(u))  # type: ignore[arg-type]
                             for u in urls), 600, "standbys warm")
        victim, survivor = members[0], urls[1]
        moved = serving(victim[1])
        sample = [k for k in (f"agent:op{i}:email.send:mailto:u{i}@example.com"
                              for i in range(0, keys, max(1, keys // 2000)))
                  if murmur2_partition(k.encode(), 6) in moved][:200]
        victim[0].send_signal(signal.SIGKILL)
        victim[0].wait()
        killed = time.monotonic()
        pending = list(sample)
        while pending:  # every key readable (a standby's stale answer counts)
            pending = [k for k in pending if not readable(survivor, k)]
            if pending and time.monotonic() - killed > 600:
                survivor_log = (work / f"{standbys}-b.err").read_text()[-3000:]
                raise SystemExit(f"{len(pending)} keys not readable within 600s (the last "
                                 f"answered {last_status(survivor, pending[0])}); the "
                                 f"survivor's log ends:\n{survivor_log}")
        reads = time.monotonic() - killed
        wait(lambda: judged(survivor, sample), 600, "verdicts on every key")
        verdicts = time.monotonic() - killed
        wait(lambda: serving(survivor) == list(range(6)), 600, "survivor serving all")
        return reads, verdicts, time.monotonic() - killed
    finally:
        for proc, _ in members:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--session-timeout", type=float, default=SESSION_S, metavar="S",
                        help="the members' --session-timeout in seconds (default 6; lower needs "
                             "a broker whose group.min.session.timeout.ms allows it)")
    args = parser.parse_args()
    session_s: float = args.session_timeout
    with kafka_bootstrap() as bootstrap:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        url = f"kafka://{bootstrap}?prefix=failover{uuid.uuid4().hex[:8]}&partitions=6"
        settings = KafkaSettings.from_url(url)
        create_topics(settings)
        fill(settings, args.keys)
        work = Path(tempfile.mkdtemp(prefix="effectlog-failover-"))
        try:
            cold = failover(url, args.keys, 0, work, session_s)
            warm = failover(url, args.keys, 1, work, session_s)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    for name, (reads, verdicts, served) in (("without standbys", cold),
                                             ("with --standbys 1", warm)):
        print(f"failover {name}, {args.keys} keys: reads {reads:.2f}s, verdicts "
              f"{verdicts:.2f}s, every partition served {served:.2f}s after the kill")
    print(f"verdicts/session = {cold[1] / session_s:.2f}x without standbys, "
          f"{warm[1] / session_s:.2f}x with; reads {warm[0]:.2f}s with standbys (goal 1 s), "
          f"verdicts {warm[1]:.2f}s (goal 6 s), {cold[0]:.2f}s/{cold[1]:.2f}s without; "
          f"session timeout {session_s:g}s")


if __name__ == "__main__":
    main()
