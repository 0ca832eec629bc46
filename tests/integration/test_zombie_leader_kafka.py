"""effectlog's Kafka clients leave a paused (SIGSTOPped) partition leader for the node that
took its partitions over, while it is still paused.

A paused broker keeps its connections open and answers nothing, so no client gets the error
that would make librdkafka ask for the leaders again: before the fix, end offsets kept timing
out on the zombie for as long as it was paused (a minute and more), and ``serve`` could not
take partitions back meanwhile. Now a request unanswered within ``timeout_s`` drops its
connection (``socket.timeout.ms``) and a failed read asks for the leaders again.

The node paused is also the active controller, the harder case: the brokers' requests to it
hang too. Once that failed a run: each failed append replaced the producer, the new one asked
a broker for a producer id, and that broker, out of ids, waited 30 s for the paused
controller to give it more. Now a failed delivery keeps the producer
(``tests/unit/test_kafka_producer_failures.py``) and the cluster's brokers give up on a
silent controller after 5 s (``controller.socket.timeout.ms``).
"""

from __future__ import annotations

import time
import uuid

import pytest

from effectlog.errors import BackendUnavailable
from effectlog.log import EVENTS
from effectlog.log.kafka import KafkaLog, KafkaSettings, create_topics
from effectlog.log.kafka.partitioner import murmur2_partition
from tests.cluster_faults import wait_led_elsewhere
from tests.kafka_broker import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]
TIMEOUT_S = 3.0
PARTITIONS = 3
#: The quorum elects another controller, which fences the paused node (3 s in the fixture)
#: and elects new leaders; a call or two may still fail on the zombie (TIMEOUT_S each) before
#: the next asks the new leader, and a machine running other tests beside it stretches each
#: step (12 s was once too short).
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


def _key_of(partition: int) -> str:
    """A key the producer sends to ``partition``."""
    return next(key for key in (f"agent:z:k:{i}" for i in range(10_000))
                if murmur2_partition(key.encode(), PARTITIONS) == partition)


def test_reads_and_appends_follow_the_new_leader_while_the_old_one_is_paused(
        kafka_cluster: KafkaCluster) -> None:
    url = (f"kafka://{kafka_cluster.bootstrap}?prefix=z{uuid.uuid4().hex[:10]}"
           f"&partitions={PARTITIONS}&timeout_s={TIMEOUT_S:g}")
    settings = KafkaSettings.from_url(url)
    create_topics(settings)
    controller = kafka_cluster.active_controller()
    leaders = kafka_cluster.leaders(settings.topic(EVENTS))
    # the partition the controller leads (three partitions on three nodes: mostly one each)
    partition = next((p for p, node in sorted(leaders.items()) if node == controller), 0)
    leader, key = leaders[partition], _key_of(partition)
    log = KafkaLog.from_url(url)
    try:
        first = log.append(EVENTS, key, b"before")
        assert first.partition == partition
        assert log.partition_end(EVENTS, partition) == first.offset + 1
        zombie = kafka_cluster.node(leader)
        zombie.pause()
        try:
            paused = time.monotonic()
            ends = _first_success(lambda: log.end_offsets(EVENTS), WITHIN_S)
            appended = _first_success(lambda: log.append(EVENTS, key, b"during"), WITHIN_S)
            read = _first_success(lambda: log.read(EVENTS, partition, 0, 10), WITHIN_S)
            new, _ = wait_led_elsewhere(kafka_cluster, settings, partition, leader)
            assert zombie.process is not None and zombie.process.poll() is None
            print(f"node {leader} paused (the active controller: {leader == controller}); "
                  f"led by {new}; end offsets after {ends:.1f}s, an append {appended:.1f}s "
                  f"later, a read {read:.1f}s later")
            assert time.monotonic() - paused < 3 * WITHIN_S
        finally:
            zombie.resume()
        values = [r.value for r in log.read(EVENTS, partition, 0, 10)]
        assert values[0] == b"before" and values[-1] == b"during", values
    finally:
        log.close()
