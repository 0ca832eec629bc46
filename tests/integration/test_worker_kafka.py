"""Workers on Apache Kafka read state through the projection cluster: no partition scan, and
fencing exactly as on SQLite (one provider call per effect, stale epochs refused)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.providers.fake import FakeProvider
from effectlog.errors import Fenced
from effectlog.log import EventLog, open_log
from effectlog.model import State
from effectlog.worker import Worker
from tests.cluster_support import Serve, wait_until

pytestmark = pytest.mark.kafka

RACER = """
import json, sys, time
from consumers.providers.fake import FakeProvider
from effectlog.errors import EffectlogError
from effectlog.log import open_log
from effectlog.worker import Worker
url, server, provider_path, name, start_at = sys.argv[1:6]
provider = FakeProvider(provider_path)
worker = Worker(open_log(url), name, server=server)
def send(call):
    time.sleep(0.5)  # a slow provider: the other racer arrives while the key is in flight
    return provider.execute(call.event.target, call.payload_hash, call.key, call.fencing_epoch,
                            call.payload)
time.sleep(max(0.0, float(start_at) - time.time()))
try:
    result = worker.perform("race-1", "payment.charge", "acct:9", {"amount": 5}, send)
    print(json.dumps({"ok": True, "result": result}))
except EffectlogError as exc:
    print(json.dumps({"ok": False, "type": type(exc).__name__, "error": str(exc)}))
"""


@pytest.fixture
def serve(kafka_url: str, tmp_path: Path) -> Iterator[Serve]:
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    node = Serve(tmp_path, "s0", kafka_url, provider)
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "one member serves all partitions")
        yield node
    finally:
        node.stop()


@pytest.fixture
def log(kafka_url: str) -> Iterator[EventLog]:
    log = open_log(kafka_url)
    yield log
    log.close()


def test_a_worker_reads_its_state_through_serve(log: EventLog, serve: Serve) -> None:
    worker = Worker(log, "w1", server=serve.url)
    calls: list[int] = []

    def send(call: object) -> dict[str, int]:
        calls.append(1)
        return {"sent": 1}

    assert worker.perform("k1", "email.send", "mailto:a@example.com", {"s": 1}, send) == {"sent": 1}
    again = Worker(log, "w2", server=serve.url)
    assert again.perform("k1", "email.send", "mailto:a@example.com", {"s": 1}, send) == {"sent": 1}
    assert calls == [1]
    current = again.get("agent:k1:email.send:mailto:a@example.com")
    assert current is not None and current.state is State.SUCCEEDED


def test_two_worker_processes_racing_for_one_key_make_one_provider_call(
        kafka_url: str, serve: Serve, tmp_path: Path) -> None:
    provider = tmp_path / "race-provider.db"
    FakeProvider(provider).close()
    start_at = str(time.time() + 3.0)
    racers = [subprocess.Popen([sys.executable, "-c", RACER, kafka_url, serve.url, str(provider),
                                f"racer-{n}", start_at], stdout=subprocess.PIPE, text=True)
              for n in range(2)]
    outcomes = [json.loads(p.communicate(timeout=90)[0].strip().splitlines()[-1]) for p in racers]
    winners = [o for o in outcomes if o["ok"]]
    losers = [o for o in outcomes if not o["ok"]]
    # One wins; the other gets what it gets on SQLite: the key in flight (or its claim
    # lost), or, had it come after the recording, the recorded result itself.
    assert winners and all(w["result"] == winners[0]["result"] for w in winners), outcomes
    assert all(o["type"] in ("EffectInDoubt", "Fenced") for o in losers), outcomes
    fake = FakeProvider(provider)
    try:
        assert fake.executions("agent:race-1:payment.charge:acct:9") == 1
    finally:
        fake.close()


def test_a_paused_worker_resuming_with_an_old_epoch_is_refused(log: EventLog,
                                                               serve: Serve) -> None:
    paused = Worker(log, "w1", server=serve.url)
    with pytest.raises(Fenced), paused.effect("k-pause", "ticket.create", "jira:OPS", {"t": 1}) as call:
        assert call.fencing_epoch == 1
        # meanwhile a replacement takes the key over with the next epoch ...
        replacement = Worker(log, "w1-replacement", server=serve.url)
        claimed = replacement.claim(call.key)
        assert claimed.fencing_epoch == 2
        call.succeeded({"ticket": "OPS-1"})  # ... so the paused worker's record is refused
    current = Worker(log, "reader", server=serve.url).get("agent:k-pause:ticket.create:jira:OPS")
    assert current is not None and current.fencing_epoch == 2
    assert current.state is State.DISPATCHED


def test_a_worker_on_kafka_without_a_server_is_refused_not_scanning(
        kafka_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from effectlog.errors import InvalidInput

    monkeypatch.delenv("EFFECTLOG_SERVER", raising=False)
    log = open_log(kafka_url)
    try:
        with pytest.raises(InvalidInput, match="EFFECTLOG_SERVER"):
            Worker(log, "w1")
        monkeypatch.setenv("EFFECTLOG_SERVER", "http://127.0.0.1:1")
        assert type(Worker(log, "w1").judge).__name__ == "ClusterJudge"
    finally:
        log.close()
