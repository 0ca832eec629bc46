"""Bounded state on Apache Kafka: settled effects expire after a retention of seconds.

``serve --expire-after`` tombstones settled effects; the projector removes them (stats:
held and expired), a key used again is a new effect (the provider is called again), open
effects stay; ``expire --server --archive`` writes an archive first; and after real
compaction a rebuild from the changelog equals a replay made before it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import fastavro
import pytest

from effectlog.judge.client import ClusterJudge
from effectlog.log import EVENTS, open_log
from effectlog.worker import Worker
from tests.cluster_support import Serve, answer, wait_until
from tests.integration.test_kafka_restore import (
    PARTITIONS,
    compact,
    compacted_url,
    published_everything,
)
from tests.restore_support import digests, opened, replayed

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
KIND = "email.send"


def stats(member: Serve) -> dict[str, Any]:
    status, body = answer(member.url + "/v1/stats")
    assert status == 200, body
    assert isinstance(body, dict)
    return body


@pytest.fixture
def worker(kafka_url: str, tmp_path: Path) -> Iterator[tuple[Worker, Serve, list[str]]]:
    member = Serve(tmp_path, "x", kafka_url, None, None, "--expire-after", "2s")
    log = open_log(kafka_url)
    judge = ClusterJudge(member.url, wait_s=10, retry_for_s=10)
    try:
        wait_until(lambda: len(member.serving()) == 6, 60, "serve serves every partition")
        yield Worker(log, "w1", judge=judge), member, []
    finally:
        judge.close()
        log.close()
        member.stop()


def perform(worker: Worker, calls: list[str], op: str) -> Any:
    def call(ctx: Any) -> dict[str, str]:
        calls.append(op)
        return {"sent": op}

    return worker.perform(op, KIND, f"mailto:{op}@example.com", {"to": op}, call)


def test_serve_expires_settled_effects_and_a_key_used_again_is_a_new_effect(
        worker: tuple[Worker, Serve, list[str]]) -> None:
    writer, member, calls = worker
    for n in range(6):
        perform(writer, calls, f"done-{n}")
    open_key = writer.create("open-1", KIND, "mailto:open@example.com", {"to": "open"})
    writer.reserve(open_key.idempotency_key)
    wait_until(lambda: stats(member)["expired"] == 6, 60, "the settled effects expire")
    figures = stats(member)
    assert figures["held"] == 1 and figures["states"]["RESERVED"] == 1, figures
    assert writer.get(open_key.idempotency_key) is not None  # an open effect is never expired
    assert writer.get("agent:done-0:email.send:mailto:done-0@example.com") is None
    perform(writer, calls, "done-0")  # its own memory of the outcome: no second call
    assert calls.count("done-0") == 1
    other = Worker(writer.log, "w2", judge=writer.judge)
    perform(other, calls, "done-0")  # a new effect under the old key
    assert calls.count("done-0") == 2
    cli = [sys.executable, "-m", "effectlog.cli.main", "--log", writer.log.url]
    shown = subprocess.run([*cli, "history", "agent:done-0:email.send:mailto:done-0@example.com",
                            "--json"], capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    transitions = [r["event"]["transition"] if "event" in r else "EXPIRE" for r in rows]
    assert transitions == ["CREATE", "RESERVE", "DISPATCH", "RECORD", "EXPIRE",
                           "CREATE", "RESERVE", "DISPATCH", "RECORD"], rows
    audit = subprocess.run([*cli, "replay", "--out", "/dev/null", "--json"],
                           capture_output=True, text=True, timeout=120)
    summary = json.loads(audit.stdout)
    assert audit.returncode == 0 and summary["expiries"] >= 6, audit.stderr


def test_expire_archives_first_then_removes_and_restores_equal_a_replay(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    url = compacted_url(kafka_bootstrap)
    member = Serve(tmp_path, "a", url, None)
    calls: list[str] = []
    log = open_log(url)
    judge = ClusterJudge(member.url, wait_s=10, retry_for_s=10)
    try:
        wait_until(lambda: len(member.serving()) == PARTITIONS, 60, "a serves")
        writer = Worker(log, "w1", judge=judge)
        for n in range(8):
            perform(writer, calls, f"old-{n}")
        writer.reserve(writer.create("still-open", KIND, "mailto:o@example.com", {})
                       .idempotency_key)
        wait_until(lambda: stats(member)["states"]["SUCCEEDED"] == 8, 30, "projected")
        cli = [sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
               str(tmp_path / "none")]
        archive = tmp_path / "expired.avro"
        done = subprocess.run([*cli, "expire", "--older-than", "0s", "--server", member.url,
                               "--archive", str(archive), "--json"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["keys"] == 8 and report["archived_records"] == 32
        with archive.open("rb") as handle:
            archived = [cast(dict[str, Any], r) for r in fastavro.reader(handle)]
        assert {str(r["key"]) for r in archived} == set(report["expired"])
        assert archive.stat().st_mode & 0o777 == 0o600
        wait_until(lambda: stats(member)["expired"] == 8, 30, "the projector removed them")
        assert stats(member)["held"] == 1
        replayed(url, tmp_path / "replay")  # before compaction, every record
        compact(url)
        wait_until(lambda: published_everything(url), 30, "a published its state")
    finally:
        judge.close()
        log.close()
        member.stop()
    with opened(url) as check:
        left = sum(1 for p in range(PARTITIONS) for r in check.scan(EVENTS, p)
                   if r.key.startswith("agent:old-") and r.value)
    assert left == 0, "compaction removed every record of the expired keys before a tombstone"
    rebuilt = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url,
                              "--state", str(member.state_dir), "rebuild", "--quiet"],
                             capture_output=True, text=True, timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr
    truth = replayed(url, tmp_path / "replay")  # that replay, resumed past compaction
    assert digests(member.state_dir, list(range(PARTITIONS))) == truth


def test_a_second_tombstone_of_an_expired_effect_leaves_the_key_used_again_alone(
        kafka_url: str, tmp_path: Path) -> None:
    """Two expirers picked the same effect: the first tombstone expires it, the key is used
    again, then the second tombstone lands. It names the effect it expires (a record header:
    Kafka has no compare-and-append), so the projector rejects it: the new effect stays."""
    member = Serve(tmp_path, "x", kafka_url, None)
    log = open_log(kafka_url)
    judge = ClusterJudge(member.url, wait_s=10, retry_for_s=10)
    calls: list[str] = []
    key = "agent:again:email.send:mailto:again@example.com"
    try:
        wait_until(lambda: len(member.serving()) == 6, 60, "serve serves every partition")
        perform(Worker(log, "w1", judge=judge), calls, "again")
        first = Worker(log, "w1", judge=judge).get(key)
        assert first is not None
        assert list(log.expire([(key, first.event_id)])) == [key]
        wait_until(lambda: stats(member)["expired"] == 1, 30, "the first tombstone applied")
        perform(Worker(log, "w2", judge=judge), calls, "again")  # a new effect
        second = Worker(log, "w3", judge=judge).get(key)
        assert second is not None and second.event_id != first.event_id
        late = log.expire([(key, first.event_id)])  # the other expirer's tombstone
        wait_until(lambda: stats(member)["rejected_total"] >= 1, 30, "the late tombstone judged")
        figures = stats(member)
        assert figures["rejected"] == {"expires_another": 1}, figures
        assert figures["expired"] == 1 and figures["held"] == 1, figures
        assert Worker(log, "w4", judge=judge).get(key) == second
        perform(Worker(log, "w5", judge=judge), calls, "again")  # a retry: the settled outcome
        assert calls == ["again", "again"]
        [record] = log.read(EVENTS, late[key].partition, late[key].offset, 1)
        assert record.value == b"" and record.expires == first.event_id
    finally:
        judge.close()
        log.close()
        member.stop()
