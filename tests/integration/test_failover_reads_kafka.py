"""Failover a reader does not notice: a standby copy answers while the group moves a dead
member's partitions; verdicts wait for the new owner.

Two ``serve`` members with ``--standbys 1``; one is SIGKILLed. Until the group notices (its
session timeout), reads of the dead member's keys through the survivor are answered from
the survivor's standby copy, marked stale with its lag and equal to what the owner said; a
fresh read and a question to the judge are not (a standby never judges), and ``get
--server`` says so on stderr. Once the survivor owns the partitions, answers are its own.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.client import StateClient
from effectlog.judge.client import ClusterJudge
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings, murmur2_partition
from effectlog.worker import Worker
from tests.cluster_support import HTTP, Serve, answer, ask_judge, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
KIND = "email.send"


def standbys_warm(member: Serve, ends: dict[int, int]) -> bool:
    health = member.health() or {}
    copies = {int(p): n for p, n in (health.get("standbys") or {}).items()}
    owned = {int(p) for p, s in (health.get("partitions") or {}).items() if s == "serving"}
    return set(copies) == set(range(6)) - owned and all(
        n >= ends.get(p, 0) for p, n in copies.items())


def test_a_standby_answers_reads_of_a_dead_members_keys_until_the_group_moves_them(
        kafka_url: str, tmp_path: Path) -> None:
    a = Serve(tmp_path, "a", kafka_url, None, None, "--standbys", "1")
    b = Serve(tmp_path, "b", kafka_url, None, None, "--standbys", "1")
    log = open_log(kafka_url)
    judge = ClusterJudge(f"{a.url},{b.url}", wait_s=10, retry_for_s=20)
    try:
        wait_until(lambda: len(a.serving()) + len(b.serving()) == 6
                   and bool(a.serving()) and bool(b.serving()), 90, "both members serve")
        worker = Worker(log, "w1", judge=judge)
        keys = []
        for n in range(24):
            worker.perform(f"fo-{n}", KIND, f"mailto:{n}@example.com", {"n": n},
                           lambda ctx: {"ok": True})
            keys.append(f"agent:fo-{n}:{KIND}:mailto:{n}@example.com")
        ends = log.end_offsets(EVENTS)
        wait_until(lambda: standbys_warm(a, ends) and standbys_warm(b, ends), 60,
                   "each member's standby copies caught up")
        moved = set(a.serving())
        partitions = KafkaSettings.from_url(kafka_url).partitions
        theirs = [k for k in keys if murmur2_partition(k.encode(), partitions) in moved]
        before = {k: answer(f"{b.url}/v1/effects/{k}")[1] for k in theirs}
        assert theirs and all(v is not None for v in before.values())

        a.kill()
        stale = 0
        for key in theirs:  # right after the kill: the group has not noticed yet
            reply = HTTP.request("GET", f"{b.url}/v1/effects/{key}")
            assert reply.status == 200, reply.data
            stale += reply.headers.get("Effectlog-Stale") == "1"
            if reply.headers.get("Effectlog-Stale") == "1":
                assert int(reply.headers["Effectlog-Lag"]) >= 0
                assert reply.headers["Effectlog-Served-By"] == b.url
                assert reply.headers["Effectlog-Topic-Id"] == log.identity()
                assert reply.headers["Effectlog-Generation"]  # the copy's projection
            assert json.loads(reply.data) == before[key]
        assert stale > 0, "no read was answered by the standby copy"
        if not set(b.serving()) >= moved:  # still moving: the judge does not answer yet
            status, body = ask_judge(b.url, theirs[:1], timeout_ms=200)
            assert status == 200 and body["unanswered"], body
        shown = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url,
                                "get", theirs[0], "--server", b.url, "--json"],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        if not set(b.serving()) >= moved:
            assert "stale:" in shown.stderr and "standby copy" in shown.stderr

        waits: list[str] = []
        fresh = StateClient(b.url, timeout_s=5, retry_for_s=60, on_wait=waits.append)
        got = fresh.get(theirs[0], fresh=True)  # needs the owner: waits for the new one
        assert got.stale_lag is None and got.snapshot == before[theirs[0]]
        assert len(waits) <= 1
        wait_until(lambda: set(b.serving()) == set(range(6)), 60, "b owns every partition")
        reply = HTTP.request("GET", f"{b.url}/v1/effects/{theirs[0]}")
        assert reply.status == 200 and "Effectlog-Stale" not in reply.headers
    finally:
        judge.close()
        log.close()
        for member in (a, b):
            member.stop()
