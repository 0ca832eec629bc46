"""The log commands against a real Kafka-protocol broker, and against none."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.cluster_support import Serve, wait_until

pytestmark = pytest.mark.kafka

LINE = {"operation_id": "op-1", "kind": "payment.charge", "target": "acct:42", "worker_id": "w1"}
KEY = "agent:op-1:payment.charge:acct:42"


def run(url: str, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, *args],
                          input=stdin, capture_output=True, text=True, timeout=120)


def lines(*transitions: dict[str, object]) -> str:
    return "".join(json.dumps({**LINE, **t}) + "\n" for t in transitions)


def test_append_and_history_on_kafka(kafka_url: str, tmp_path: Path) -> None:
    judge = Serve(tmp_path, "judge", kafka_url, None)
    try:
        wait_until(lambda: len(judge.serving()) == 6, 60, "serve serves every partition")
        _append_and_history(kafka_url, judge.url)
    finally:
        judge.stop()


def _append_and_history(kafka_url: str, server: str) -> None:
    done = run(kafka_url, "append", "--server", server, stdin=lines(
        {"transition": "create", "payload": {"amount": 1200}}, {"transition": "reserve"},
        {"transition": "dispatch"}, {"transition": "unknown", "error": "gateway timeout"}))
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert [o["state"] for o in out] == ["CREATED", "RESERVED", "DISPATCHED", "UNKNOWN"]
    assert len({o["position"]["partition"] for o in out}) == 1
    rows = [json.loads(x) for x in run(kafka_url, "history", KEY, "--json").stdout.splitlines()]
    assert [r["event"]["state"] for r in rows] == ["CREATED", "RESERVED", "DISPATCHED", "UNKNOWN"]
    mismatch = run(kafka_url, "append", "--server", server,
                   stdin=lines({"transition": "create", "payload": {"amount": 9}}))
    assert mismatch.returncode == 3


def test_topics_create_is_idempotent_and_reports(kafka_bootstrap: str) -> None:
    url = f"kafka://{kafka_bootstrap}?prefix=cli{uuid.uuid4().hex[:8]}"
    first = run(url, "topics", "create", "--json")
    second = run(url, "topics", "create", "--json")
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert any("created" in line for line in json.loads(first.stdout)["topics"])
    assert all("exists" in line for line in json.loads(second.stdout)["topics"])


def test_topics_create_refuses_a_sqlite_log() -> None:
    done = run("sqlite:///x.db", "topics", "create")
    assert done.returncode == 2 and "Kafka" in done.stderr


@pytest.mark.parametrize("args", [("append",), ("history", KEY), ("topics", "create")])
def test_unreachable_broker_exits_4_in_bounded_time(args: tuple[str, ...]) -> None:
    start = time.monotonic()
    done = run("kafka://127.0.0.1:1?timeout_s=2", *args,
               stdin=lines({"transition": "create", "payload": {}}))
    assert done.returncode == 4, done.stderr
    assert time.monotonic() - start < 30
    assert done.stderr.startswith("error:") and not done.stdout
