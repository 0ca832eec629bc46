"""The demo's job queue: a job its worker gave back (the log unreachable) waits before it is
delivered again, so an outage is waited out instead of burning every delivery at once."""

from __future__ import annotations

import itertools
import sys
import tempfile
import time
from typing import Any

import pytest

from effectlog.cli.demo import pool
from effectlog.cli.demo.pool import WorkerPool
from effectlog.cli.demo.workload import Job

#: A worker that gives back every delivery before the fourth, then acknowledges.
GIVES_BACK = """
import json, sys
for line in sys.stdin:
    job = json.loads(line)
    print(json.dumps({"ack": job["delivery"] >= 4, "status": "error"}), flush=True)
"""


def run(jobs: list[Job]) -> tuple[pool.QueueStats, list[float]]:
    """The jobs through one such worker: the queue's figures and when each reply came."""
    replies: list[float] = []

    def on_reply(job: Job, reply: dict[str, Any]) -> None:
        replies.append(time.monotonic())

    with tempfile.TemporaryFile() as stderr:
        stats = WorkerPool(jobs, 1, lambda name: [sys.executable, "-c", GIVES_BACK], stderr,
                           on_reply=on_reply).run()
    return stats, replies


def test_a_job_given_back_is_delivered_again_after_a_growing_delay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "RETRY_BASE_S", 0.1)
    stats, replies = run([Job("op1", "email.send", "mailto:a@example.com", {})])
    assert stats.acked == 1 and stats.deliveries == 4 and stats.dead_lettered == 0
    gaps = [later - earlier for earlier, later in itertools.pairwise(replies)]
    # at least 0.1, 0.2 and 0.4 s between deliveries 1-2, 2-3 and 3-4
    assert [gap >= 0.1 * 2 ** n for n, gap in enumerate(gaps)] == [True, True, True]


def test_a_job_given_back_every_time_is_dead_lettered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool, "RETRY_BASE_S", 0.001)
    monkeypatch.setattr(pool, "MAX_DELIVERIES", 3)
    stats, replies = run([Job("op1", "email.send", "mailto:a@example.com", {})])
    assert stats.dead_lettered == 1 and stats.acked == 0 and len(replies) == 3
