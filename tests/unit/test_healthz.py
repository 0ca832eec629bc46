"""``/healthz`` (alive) answers within its bound while the log's end offsets do not come (a
broker outage, here a SQLite log whose end-offset read is held): still alive (200, a liveness
probe must not restart serve for an outage it rides out), with the reason and the last known
figures; one read is shared by the probes that arrive meanwhile; once the log answers again
so do the figures. A loop that died is 503. ``/readyz`` (serving) answers at once, 503 with
why until every partition held is restored. The real broker outage is in
``tests/integration/test_broker_faults_kafka.py``; a group's assignment in
``tests/integration/test_cluster_recovery_kafka.py``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from consumers.node.node import Node, NodeSettings
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.worker import Worker

pytestmark = pytest.mark.timeout(60)
CLIENT_TIMEOUT_S = 3.0  # what a probe waits for (Kubernetes' default is 1 s)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    log_url = f"sqlite:///{tmp_path}/log.db"
    with open_log(log_url) as log:
        Worker(log, "w1").create("op1", "email.send", "mailto:a@example.com", {})
    running = Node(log_url, NodeSettings(state_dir=tmp_path / "state", http_port=0,
                                         observe_every_s=3600)).start()
    deadline = time.monotonic() + 30
    while running.gate.status(0) != "serving":
        assert time.monotonic() < deadline, "the node did not start serving"
        time.sleep(0.02)
    yield running
    assert running.stop(30) == []
    running.close()


def _probe(url: str) -> tuple[int, dict[str, object], float]:
    http = urllib3.PoolManager(retries=False, timeout=CLIENT_TIMEOUT_S)
    started = time.monotonic()
    reply = http.request("GET", url + "/healthz")
    return reply.status, json.loads(reply.data), time.monotonic() - started


def test_healthz_answers_alive_with_the_last_figures_while_the_log_does_not_answer(
        node: Node) -> None:
    status, healthy, _ = _probe(node.url)
    assert status == 200 and healthy["projector_lag"] == 0
    assert healthy["log_end_offsets"] == {"0": 1}

    api_log = node.logs["api"]
    release, reads = threading.Event(), []
    real_end_offsets = api_log.end_offsets

    def held(topic: str) -> dict[int, int]:  # a broker that does not answer, until released
        reads.append(topic)
        release.wait(20)
        return real_end_offsets(topic)

    api_log.end_offsets = held  # type: ignore[method-assign]
    try:
        replies: list[tuple[int, dict[str, object], float]] = []
        probes = [threading.Thread(target=lambda: replies.append(_probe(node.url)))
                  for _ in range(3)]
        for probe in probes:
            probe.start()
        for probe in probes:
            probe.join(2 * CLIENT_TIMEOUT_S)
        assert len(replies) == 3  # each answered within the client's timeout
        for status, body, took in replies:
            assert status == 200 and took < CLIENT_TIMEOUT_S, (status, took)
            assert body["ok"] is True and body["projector_lag"] is None
            assert body["log_error"] == ("the log did not answer within 0.8s; "
                                         "projector lag unknown")
            last = body["last_known"]
            assert isinstance(last, dict) and last["log_end_offsets"] == {"0": 1}
            assert last["projector_lag"] == 0 and isinstance(last["age_s"], float)
            assert body["partitions"] == {"0": "serving"}
        assert reads == [EVENTS]  # the probes shared one read
    finally:
        release.set()
        api_log.end_offsets = real_end_offsets  # type: ignore[method-assign]
    status, healthy, _ = _probe(node.url)
    assert status == 200 and healthy["projector_lag"] == 0 and "log_error" not in healthy


def test_healthz_reports_a_log_that_refuses_with_its_reason(node: Node) -> None:
    from effectlog.errors import BackendUnavailable

    def refused(topic: str) -> dict[int, int]:
        raise BackendUnavailable("kafka broker 127.0.0.1:9 unreachable: no end offsets")

    assert _probe(node.url)[0] == 200
    node.logs["api"].end_offsets = refused  # type: ignore[method-assign]
    status, body, _ = _probe(node.url)
    assert status == 200 and body["ok"] is True
    assert body["log_error"] == ("kafka broker 127.0.0.1:9 unreachable: no end offsets; "
                                 "projector lag unknown")
    last = body["last_known"]
    assert isinstance(last, dict) and last["log_end_offsets"] == {"0": 1}


def test_metrics_answer_with_the_last_figures_while_the_log_does_not_answer(
        node: Node) -> None:
    http = urllib3.PoolManager(retries=False, timeout=CLIENT_TIMEOUT_S)
    assert http.request("GET", node.url + "/metrics").status == 200
    work_log = node.logs["work"]
    release, reads = threading.Event(), []
    real_end_offsets = work_log.end_offsets

    def held(topic: str) -> dict[int, int]:
        reads.append(topic)
        release.wait(20)
        return real_end_offsets(topic)

    work_log.end_offsets = held  # type: ignore[method-assign]
    try:
        for _ in range(2):  # the second scrape shares the first one's refresh
            started = time.monotonic()
            reply = http.request("GET", node.url + "/metrics")
            assert reply.status == 200 and time.monotonic() - started < CLIENT_TIMEOUT_S
            assert b"effectlog_projector_lag" in reply.data
        assert len(reads) == 1
    finally:
        release.set()
        work_log.end_offsets = real_end_offsets  # type: ignore[method-assign]


def _ready(url: str) -> tuple[int, dict[str, object]]:
    http = urllib3.PoolManager(retries=False, timeout=CLIENT_TIMEOUT_S)
    reply = http.request("GET", url + "/readyz")
    return reply.status, json.loads(reply.data)


def test_readyz_is_ready_once_every_partition_held_is_restored(node: Node) -> None:
    status, body = _ready(node.url)
    assert (status, body["ready"], body["partitions"]) == (200, True, {"0": "serving"}), body
    node.gate.assigned(1, 0, 1200)  # as the group would hand it a partition to restore
    status, body = _ready(node.url)
    assert status == 503 and body["ready"] is False, body
    assert body["why"] == "restoring partition(s) 1 (1200 records left)"
    assert body["restoring"] == {"1": 1200}
    node.gate.applied(1, 1200)
    assert _ready(node.url)[0] == 200
    node.gate.revoked(1)


def test_healthz_and_readyz_say_503_once_a_loop_died(node: Node) -> None:
    node.failures.append(("recovery", RuntimeError("boom")))
    try:
        status, body, _ = _probe(node.url)
        assert status == 503 and body["ok"] is False and body["failed_loops"] == ["recovery"]
        status, ready = _ready(node.url)
        assert status == 503 and ready["why"] == "the recovery loop(s) stopped"
    finally:
        node.failures.clear()


def test_readiness_waits_for_the_groups_first_assignment() -> None:
    from consumers.node.readiness import readiness

    def left(partition: int) -> int:
        return 7

    waiting = readiness(joined=False, group="effects.serve", held={}, restore_left=left,
                        failed=[])
    assert waiting == (False, {"partitions": {}, "why": "waiting for group effects.serve to "
                                                        "assign this member its partitions"})
    ready, body = readiness(joined=True, group="g", held={}, restore_left=left, failed=[])
    assert ready and "no partition" in str(body["note"])


def test_a_long_restore_logs_its_progress(caplog: pytest.LogCaptureFixture) -> None:
    from consumers.node.gate import PartitionGate

    gate = PartitionGate(progress_every_s=0.0)  # every batch: a long restore says where it is
    with caplog.at_level("INFO", logger="consumers.node.gate"):
        gate.assigned(3, 0, 100)
        gate.applied(3, 40)
        gate.applied(3, 100)
        gate.applied(3, 120)  # serving: no more progress lines
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "partition 3 restoring: 100 records to apply (offset 0 to 100)"
    assert lines[1].startswith("partition 3 restoring: 40 of 100 records applied (40%), ")
    assert lines[1].endswith("s left")
    assert lines[2].startswith("partition 3 serving: restored 100 records in ")
    assert len(lines) == 3
