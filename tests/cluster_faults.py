"""Helpers of the cluster fault tests: the node leading a partition in use, nodes killed or
paused and brought back, and the checks made once the cluster is whole again.

The checks are the broker fault tests' (:mod:`tests.broker_faults`), from sources independent
of effectlog's bookkeeping: the log read to its end, the fake provider's per-key call counter
(``dedupe=0``: it counts every call it receives), serve's health and a clean rebuild.
"""

from __future__ import annotations

import collections
import contextlib
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from consumers.providers.fake import FakeProvider
from effectlog.codec import event_codec
from effectlog.errors import CodecError
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings, create_topics
from tests.broker_faults import (
    EFFECTLOG,
    TIMEOUT_S,
    Feeder,
    Run,
    equals_clean_rebuild,
    lag_is_zero,
)
from tests.cluster_support import Serve, answer, wait_until
from tools.kafka.cluster import KafkaCluster

#: Three partitions on three nodes: each node leads one, so every node is a leader in use.
PARTITIONS = 3
#: The longest a perform may take while nodes are away: the sum of its waits, each
#: TIMEOUT_S-bounded (see tests/integration/test_broker_faults_kafka.py).
PERFORM_BOUND_S = 8 * TIMEOUT_S
#: How long a failed-over partition may take to have a leader again: the controller fences a
#: silent node after broker.session.timeout.ms (3 s in the fixture), then elects at once.
FAILOVER_BOUND_S = 20.0
#: How long a node may take to start again and catch up until every replica is in sync.
REJOIN_BOUND_S = 90.0
#: A cap on the jobs of one test (the feeder stops taking new ones when the test drains it).
JOBS = 400


def cluster_url(cluster: KafkaCluster) -> tuple[str, KafkaSettings]:
    """A log URL on topics of its own on ``cluster`` (created: replication 3, two in sync)."""
    url = (f"kafka://{cluster.bootstrap}?prefix=c{uuid.uuid4().hex[:10]}"
           f"&partitions={PARTITIONS}&timeout_s={TIMEOUT_S:g}")
    settings = KafkaSettings.from_url(url)
    report = create_topics(settings, strict=True)
    assert report.durability.replication == 3 and report.durability.min_insync == 2, report
    return url, settings


def topics(settings: KafkaSettings) -> list[str]:
    return [settings.topic(t) for t in ("events", "commands")]


def leader_of(cluster: KafkaCluster, settings: KafkaSettings, partition: int = 0) -> int:
    """The node leading ``partition`` of the events topic."""
    leader = cluster.leaders(settings.topic(EVENTS))[partition]
    assert leader > 0, f"events partition {partition} has no leader"
    return leader


def target(cluster: KafkaCluster, settings: KafkaSettings, *,
           coordinator: bool) -> tuple[int, int]:
    """(node, events partition it leads): the node coordinating serve's consumer group, or
    one that does not, so that between them the tests take both roles down."""
    serving = cluster.coordinator(f"{settings.prefix}.serve")
    leaders = cluster.leaders(settings.topic(EVENTS))
    for partition, leader in sorted(leaders.items()):
        if (leader == serving) == coordinator:
            return leader, partition
    raise AssertionError(f"no events partition led {'by' if coordinator else 'outside'} the "
                         f"coordinator {serving}: leaders {leaders}")


def wait_led_elsewhere(cluster: KafkaCluster, settings: KafkaSettings, partition: int,
                       old: int) -> tuple[int, float]:
    """(the new leader of ``partition``, seconds until it had one other than ``old``)."""
    found: list[int] = []

    def moved() -> bool:
        with contextlib.suppress(Exception):  # metadata from a node going down may fail
            leader = cluster.leaders(settings.topic(EVENTS), timeout=2.0)[partition]
            if leader > 0 and leader != old:
                found.append(leader)
                return True
        return False

    took = wait_until(moved, FAILOVER_BOUND_S, f"events partition {partition} led by "
                      f"another node than {old}")
    return found[-1], took


@contextlib.contextmanager
def nodes_away(cluster: KafkaCluster, nodes: list[int], fault: str) -> Iterator[None]:
    """SIGKILL (``kill``) or SIGSTOP (``pause``) ``nodes``; on leaving, whatever happened
    inside, start them again on their ports and data (or SIGCONT them)."""
    for node in nodes:
        if fault == "kill":
            cluster.node(node).kill()
        else:
            cluster.node(node).pause()
    try:
        yield
    finally:
        for node in nodes:
            if fault == "kill":
                cluster.node(node).restart()
            else:
                cluster.node(node).resume()


def wait_in_sync(cluster: KafkaCluster, settings: KafkaSettings) -> float:
    """Seconds until every node is back and every replica of the topics is in sync."""
    return wait_until(lambda: len(cluster.live_brokers()) == len(cluster.nodes)
                      and cluster.fully_replicated(topics(settings)),
                      REJOIN_BOUND_S, "every replica back in sync")


def succeeded_between(feeder: Feeder, start: float, end: float) -> int:
    """Performs that succeeded and finished within [start, end]."""
    return sum(1 for r in feeder.replies
               if start <= r.finished_at <= end and r.body["status"] == "succeeded")


def provider_spec(provider: Path) -> str:
    """The fake provider that performs every call it receives (and counts it)."""
    return f"fake:///{provider}?dedupe=0"


def start_serve(tmp: Path, url: str, provider: Path) -> Serve:
    FakeProvider(provider, dedupe=False).close()
    return Serve(tmp, "s", url, None, None, "--provider", provider_spec(provider))


def start_feeder(url: str, provider: Path, serve: Serve) -> Feeder:
    """Two worker processes fed jobs until the test drains them (so the load spans the
    fault), at most :data:`JOBS`."""
    return Feeder(url, provider, serve.url, provider_options="?dedupe=0", limit=JOBS,
                  pause_s=0.1)


def during(feeder: Feeder, start: float, end: float) -> dict[str, int]:
    """How the deliveries that finished within [start, end] ended, by status."""
    return dict(collections.Counter(r.body["status"] for r in feeder.replies
                                    if start <= r.finished_at <= end))


def append_one(log_url: str, op: str, timeout_s: float = 60.0) -> Run:
    """``effectlog append`` of one CREATE line, timed."""
    line = (f'{{"operation_id": "{op}", "kind": "email.send", "target": "mailto:{op}@example.com",'
            f' "payload": {{"op": "{op}"}}, "transition": "create", "worker_id": "cli"}}\n')
    started = time.monotonic()
    done = subprocess.run([str(EFFECTLOG), "--log", log_url, "append"], input=line,
                          capture_output=True, text=True, timeout=timeout_s)
    return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def duplicated_event_ids(log_url: str) -> list[str]:
    """Event ids the events topic holds more than once (a producer retry written twice)."""
    codec = event_codec()
    seen: collections.Counter[str] = collections.Counter()
    with open_log(log_url, create=False) as log:
        for partition, end in log.end_offsets(EVENTS).items():
            offset = 0
            while offset < end:
                records = log.read(EVENTS, partition, offset, 1000)
                if not records:
                    break
                for record in records:
                    with contextlib.suppress(CodecError):
                        seen[str(codec.decode(record.value)["event_id"])] += 1
                offset = records[-1].offset + 1
    return [event for event, n in seen.items() if n > 1]


def _state(serve: Serve, key: str) -> str | None:
    status, body = answer(f"{serve.url}/v1/effects/{key}?fresh=1")
    return str(body["state"]) if status == 200 else None


@dataclass
class Settled:
    """What the checks found, for the test's printout."""

    jobs: int
    deliveries: int
    acknowledged: int
    drained_s: float
    settled_s: float  # until recovery had settled every effect
    lag_s: float  # until serve's lag was 0 after that


def check_after_fault(feeder: Feeder, serve: Serve, url: str, provider: Path) -> Settled:
    """Once the cluster is whole: every job acknowledged once, every acknowledged event in the
    log and none twice, recovery settled every effect, the provider called once per key,
    serve's lag back to 0."""
    from tests.broker_faults import logged_event_ids

    started = time.monotonic()
    feeder.drain(120)
    drained = time.monotonic() - started
    acknowledged = feeder.acknowledged_events()
    assert acknowledged - logged_event_ids(url) == set(), "acknowledged events lost"
    assert duplicated_event_ids(url) == [], "an event written twice"
    keys = [feeder.key(op) for op in feeder.ops]
    settled = wait_until(lambda: all(_state(serve, k) == "SUCCEEDED" for k in keys), 90,
                         "recovery settled every effect")
    fake = FakeProvider(provider, dedupe=False)
    try:
        calls = {k: fake.calls(k) for k in keys}
    finally:
        fake.close()
    assert set(calls.values()) == {1}, {k: n for k, n in calls.items() if n != 1}
    lag = wait_until(lambda: lag_is_zero(serve, PARTITIONS), 60, "lag back to 0")
    return Settled(len(feeder.ops), len(feeder.replies), len(acknowledged), drained, settled,
                   lag)


def stop_and_compare(feeder: Feeder | None, serve: Serve, url: str, tmp: Path) -> None:
    """Stop the workers and serve (cleanly, without a traceback), then compare serve's
    projection with a clean rebuild of the log."""
    started = time.monotonic()
    worker_errors = feeder.stop() if feeder is not None else ""
    serve_errors = serve.stop()
    print(f"workers and serve stopped in {time.monotonic() - started:.1f}s")
    assert "Traceback" not in worker_errors, worker_errors[-3000:]
    assert "Traceback" not in serve_errors, serve_errors[-3000:]
    assert serve.process.returncode == 0, serve_errors[-2000:]
    started = time.monotonic()
    equals_clean_rebuild(url, serve.state_dir, tmp / "clean")
    print(f"compared with a clean rebuild in {time.monotonic() - started:.1f}s")
