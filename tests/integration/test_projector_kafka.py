"""The projector on a real Kafka-protocol broker: one RocksDB per partition, merged reads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import fold
from effectlog.model import State
from effectlog.view import decode_events
from projections import open_reader
from projections.projector import Progress, Projector, ProjectorSettings, project
from projections.rocksdb import layout
from tests import projector_workload as workload

pytestmark = pytest.mark.kafka


@pytest.fixture
def log(kafka_url: str) -> Iterator[EventLog]:
    log = open_log(kafka_url)
    yield log
    log.close()


def test_each_partition_has_its_own_database_and_offset(log: EventLog, tmp_path: Path) -> None:
    items, expected = workload.build(300, bad_every=30)
    workload.write(log, items)
    ends = log.end_offsets(EVENTS)
    lags: list[dict[int, int]] = []

    def watch(progress: Progress) -> None:
        lags.append(progress.lag)

    with Projector(log, tmp_path / "state", ProjectorSettings(batch_size=64)) as projector:
        projector.run(once=True, on_progress=watch)
    assert lags[0] == ends and set(lags[-1].values()) == {0}  # per-partition lag, then none
    generation = layout.current_generation(tmp_path / "state")
    assert layout.partitions_in(generation) == sorted(ends) and len(ends) > 1
    with open_reader(tmp_path / "state") as reader:
        assert reader.next_offsets() == ends
        rejected = {k.split(":", 1)[1]: v for k, v in reader.counts().items()
                    if k.startswith("rejected:")}
        assert rejected == dict(expected)
        for key in ("agent:op7:email.send:mailto:u7@example.com", "agent:bad30:payment.charge:acct-30"):
            current = reader.get(key)
            assert current is not None and current == fold(decode_events(log, key))[0]
        succeeded = [e.occurred_at for e in reader.scan_state(State.SUCCEEDED)]
        assert len(succeeded) == 300 and succeeded == sorted(succeeded)  # merged oldest-first
        positions = [(r.position.partition, r.position.offset) for r in reader.rejected()]
        assert len(positions) == sum(expected.values()) and positions == sorted(positions)
        assert all(reader.rejected_at(r.position) == r for r in reader.rejected(limit=5))


def test_stats_shows_lag_per_partition(log: EventLog, kafka_url: str, tmp_path: Path) -> None:
    items, _ = workload.build(40, bad_every=1000)
    workload.write(log, items[:100])
    project(log, tmp_path / "state")
    workload.write(log, items[100:])
    env = {**os.environ, "EFFECTLOG_LOG": kafka_url, "EFFECTLOG_STATE": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "stats", "--json"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    stats = json.loads(done.stdout)
    ends = log.end_offsets(EVENTS)
    assert stats["end_offsets"] == {str(p): n for p, n in ends.items()}
    assert sum(stats["lag"].values()) == len(items) - 100
    assert all(stats["lag"][p] == ends[int(p)] - stats["next_offsets"][p] for p in stats["lag"])


def test_stats_exits_4_when_kafka_is_unreachable(tmp_path: Path) -> None:
    project(open_log("memory://"), tmp_path / "s")  # a projection exists (else: exit 2)
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log",
                           "kafka://127.0.0.1:1?timeout_s=1", "--state", str(tmp_path / "s"),
                           "stats"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr


