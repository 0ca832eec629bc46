"""effectlog's Kafka clients leave a paused (SIGSTOPped) partition leader for the node that
took its partitions over, while it is still paused.

A paused broker keeps its connections open and answers nothing, so no client gets the error
that would make librdkafka ask for the leaders again: before the fix, end offsets kept timing
out on the zombie for as long as it was paused (a minute and more), and ``serve`` could not
take partitions back meanwhile. Now a request unanswered within ``timeout_s`` drops its
connection (``socket.timeout.ms``) and a failed read asks for the leaders again.
"""

from __future__ import annotations

import time
import uuid

import pytest

from effectlog.errors import BackendUnavailable
from effectlog.log import EVENTS
from effectlog.log.kafka import KafkaLog, KafkaSettings, create_topics
from tests.cluster_faults import wait_led_elsewhere
from tests.kafka_broker import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]
TIMEOUT_S = 3.0
#: The controller fences the paused node (3 s in the fixture) and elects; a call or two may
#: still fail on the zombie (TIMEOUT_S each) before the next asks the new leader, and a
#: machine running other tests beside it stretches each step (12 s was once too short).
WITHIN_S = 3.0 + 5 * TIMEOUT_S


def _first_success(call: object, within_s: float) -> float:
    """Seconds until ``call()`` succeeded; AssertionError after ``within_s``."""
    started = time.monotonic()
    failures = []
    while time.monotonic() - started < within_s:
        try:
            call()  # type: ignore[operator]
            return time.monotonic() - started
        except BackendUnavailable as exc:
            failures.append(str(exc)[-80:])
        time.sleep(0.2)
    raise AssertionError(f"still failing after {within_s}s: {failures[-3:]}")


def test_reads_and_appends_follow_the_new_leader_while_the_old_one_is_paused(
        kafka_cluster: KafkaCluster) -> None:
    url = (f"kafka://{kafka_cluster.bootstrap}?prefix=z{uuid.uuid4().hex[:10]}&partitions=1"
           f"&timeout_s={TIMEOUT_S:g}")
    settings = KafkaSettings.from_url(url)
    create_topics(settings)
    log = KafkaLog.from_url(url)
    try:
        first = log.append(EVENTS, "agent:z:k:t", b"before")
        assert log.end_offsets(EVENTS) == {0: first.offset + 1}
        leader = kafka_cluster.leaders(settings.topic(EVENTS))[0]
        zombie = kafka_cluster.node(leader)
        zombie.pause()
        try:
            paused = time.monotonic()
            ends = _first_success(lambda: log.end_offsets(EVENTS), WITHIN_S)
            appended = _first_success(lambda: log.append(EVENTS, "agent:z:k:t", b"during"),
                                      WITHIN_S)
            read = _first_success(lambda: log.read(EVENTS, 0, 0, 10), WITHIN_S)
            new, _ = wait_led_elsewhere(kafka_cluster, settings, 0, leader)
            assert zombie.process is not None and zombie.process.poll() is None
            print(f"node {leader} paused; led by {new}; end offsets after {ends:.1f}s, an "
                  f"append {appended:.1f}s later, a read {read:.1f}s later")
            assert time.monotonic() - paused < 3 * WITHIN_S
        finally:
            zombie.resume()
        values = [r.value for r in log.read(EVENTS, 0, 0, 10)]
        assert values[0] == b"before" and values[-1] == b"during", values
    finally:
        log.close()
