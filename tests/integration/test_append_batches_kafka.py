"""``effectlog append`` on Kafka works in batches and gives the line-by-line results."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.kafka


def transitions(keys: int, seed: int = 5) -> list[dict[str, object]]:
    """create, reserve, dispatch, record per key, the keys' lines interleaved."""
    rng = random.Random(seed)
    per_key = []
    for k in range(keys):
        base = {"operation_id": f"b-{k}", "kind": "email.send", "target": f"mailto:{k}@x",
                "worker_id": f"w{k % 3}"}
        per_key.append([{**base, "transition": "create", "payload": {"k": k}},
                        {**base, "transition": "reserve"}, {**base, "transition": "dispatch"},
                        {**base, "transition": "record",
                         "outcome": {"status": "succeeded", "result": {"id": k}}}])
    lines = []
    while any(per_key):
        queue = rng.choice([q for q in per_key if q])
        lines.append(queue.pop(0))
    return lines


def append(url: str, lines: list[dict[str, object]]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "append"],
                          input="".join(json.dumps(x) + "\n" for x in lines),
                          capture_output=True, text=True, timeout=300)


def shape(out: str) -> list[tuple[object, ...]]:
    rows = [json.loads(line) for line in out.splitlines()]
    return [(r["idempotency_key"], r["transition"], r["state"], r["fencing_epoch"], r["existing"])
            for r in rows]


def test_batched_append_gives_the_results_of_line_by_line(kafka_url: str, tmp_path: Path) -> None:
    lines = transitions(700)  # 2,800 lines: more than one batch
    lines.insert(1500, {**lines[0], "payload": {"k": "other"}})  # a payload mismatch
    on_kafka = append(kafka_url, lines)
    on_sqlite = append(f"sqlite:///{tmp_path}/log.db", lines)
    assert on_kafka.returncode == on_sqlite.returncode == 3, (on_kafka.stderr, on_sqlite.stderr)
    assert on_kafka.stderr == on_sqlite.stderr  # the same one-line error
    assert "line 1501" in on_kafka.stderr
    assert shape(on_kafka.stdout) == shape(on_sqlite.stdout)
    assert len(shape(on_kafka.stdout)) == 1500
