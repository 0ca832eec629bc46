"""``/healthz`` answers within its bound while the log's end offsets do not come (a broker
outage, here a SQLite log whose end-offset read is held), with 503, the reason and the last
known figures; one read is shared by the probes that arrive meanwhile; once the log answers
again so does the health. The real broker outage is in
``tests/integration/test_broker_faults_kafka.py``."""

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


def test_healthz_answers_503_with_the_last_figures_while_the_log_does_not_answer(
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
            assert status == 503 and took < CLIENT_TIMEOUT_S, (status, took)
            assert body["ok"] is False and body["projector_lag"] is None
            assert body["error"] == ("the log did not answer within 0.8s; "
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
    assert status == 200 and healthy["projector_lag"] == 0 and "error" not in healthy


def test_healthz_reports_a_log_that_refuses_with_its_reason(node: Node) -> None:
    from effectlog.errors import BackendUnavailable

    def refused(topic: str) -> dict[int, int]:
        raise BackendUnavailable("kafka broker 127.0.0.1:9 unreachable: no end offsets")

    assert _probe(node.url)[0] == 200
    node.logs["api"].end_offsets = refused  # type: ignore[method-assign]
    status, body, _ = _probe(node.url)
    assert status == 503 and body["ok"] is False
    assert body["error"] == ("kafka broker 127.0.0.1:9 unreachable: no end offsets; "
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
