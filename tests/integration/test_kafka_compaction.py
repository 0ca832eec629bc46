"""Real log compaction on Apache Kafka: the cleaner removes superseded transitions, and the
projection rebuilt from what is left holds exactly the same current states."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from effectlog.keys import make_key
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.log.kafka import KafkaSettings, create_topics
from effectlog.worker import Worker
from projections.compaction_guard import CompactionGap
from projections.projector import ProjectorSettings, project
from projections.rebuild import rebuild
from projections.rocksdb.digest import current_states_digest
from tests.judges import scribe

pytestmark = pytest.mark.kafka

#: Topic configs that make the cleaner run within seconds (see shared KAFKA.md): small
#: segments by time, any dirty ratio, no compaction lag, tombstones kept only briefly.
FAST_COMPACTION = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
                   "min.compaction.lag.ms": "0", "delete.retention.ms": "100"}
KEYS = 24


def compact_fast(settings: KafkaSettings) -> None:
    """Switch the events topic to small segments and an eager cleaner (from now on)."""
    admin = AdminClient(settings.client_config())
    resource = ConfigResource(ResourceType.TOPIC, settings.topic(EVENTS), incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in FAST_COMPACTION.items()])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def many_transitions(worker: Worker, n: int) -> list[str]:
    """Nine transitions per key: a dispatch in doubt, approved for a retry, then recorded."""
    keys = []
    for i in range(n):
        created = worker.create(f"cmp-{i}", "payment.charge", f"acct:{i}", {"amount": i})
        key = created.idempotency_key
        worker.reserve(key)
        worker.dispatch(key)
        worker.unknown(key, "gateway timeout")
        worker.await_approval(key, "payment in doubt")
        worker.approve(key, "retry", by="ops@example.com", reason="provider says not charged")
        worker.dispatch(key)
        worker.record(key, "succeeded", {"charge": f"ch-{i}"})
        keys.append(key)
    return keys


def sealers(log: EventLog) -> list[str]:
    """One operation id whose key lands on each partition."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < log.partitions(EVENTS):
        op = f"seal-{n}-{uuid.uuid4().hex[:6]}"
        found.setdefault(log.partition_for(EVENTS, make_key(op, "noop", "seal")), op)
        n += 1
    return list(found.values())


def records_on(log: EventLog) -> int:
    return sum(1 for p in range(log.partitions(EVENTS)) for _ in log.scan(EVENTS, p))


def wait_until_compacted(log: EventLog, written: int, within_s: float = 60.0) -> int:
    """Poll the record count until the cleaner has removed superseded records."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        left = records_on(log)
        if left <= written // 2:
            return left
        time.sleep(0.5)
    raise AssertionError(f"the log cleaner did not compact {written} records within {within_s}s")


def test_rebuild_from_the_compacted_topic_gives_the_same_current_states(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    url = (f"kafka://{kafka_bootstrap}?prefix=cmp{uuid.uuid4().hex[:10]}"
           "&min_compaction_lag_ms=0&partitions=3")
    settings = KafkaSettings.from_url(url)
    create_topics(settings)
    log = open_log(url)
    try:
        worker = scribe(log, "w1")
        keys = many_transitions(worker, KEYS)
        state = tmp_path / "state"
        project(log, state)  # the projection built before compaction
        before = current_states_digest(state)
        compact_fast(settings)  # the reconciliation window has passed, say
        time.sleep(0.3)  # past segment.ms: the next record rolls the segment ...
        sealer = scribe(log, "w2")
        for op in sealers(log):  # ... so seal every partition's segment with one record
            sealer.create(op, "noop", "seal", {})
        written = KEYS * 8 + 3
        left = wait_until_compacted(log, written)
        assert left < written
        project(log, state)  # the sealers, applied incrementally
        before_with_sealers = current_states_digest(state)
        assert before_with_sealers != before
        # nothing was ever published to the changelog, and with a compaction lag of 0 every
        # gap may be compaction: a rebuild stops at the first, unless told to go on
        with pytest.raises(CompactionGap, match="compaction may have removed accepted events"):
            rebuild(log, state)
        rebuild(log, state, ProjectorSettings(accept_compaction_gaps=True))
        assert current_states_digest(state) == before_with_sealers
        # history of a compacted key says that its earlier transitions are gone (the
        # cleaner works partition by partition: take the first key it has compacted)
        compacted = next(k for k in keys if log.read_key(EVENTS, k)[0].value
                         and len(log.read_key(EVENTS, k)) < 8)
        done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url,
                               "history", compacted, "--json"],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in done.stdout.splitlines()]
        assert rows[0]["event"]["transition"] != "CREATE"
        assert rows[0]["compacted_before"] is True
        assert rows[-1]["event"]["state"] == "SUCCEEDED"
        text = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url,
                               "history", compacted], capture_output=True, text=True, timeout=60)
        assert "compacted away" in text.stdout
    finally:
        log.close()


def test_topics_create_refuses_a_compaction_lag_shorter_than_the_reconciliation_window(
        kafka_bootstrap: str) -> None:
    url = f"kafka://{kafka_bootstrap}?prefix=lag{uuid.uuid4().hex[:10]}&min_compaction_lag_ms=60000"
    base = [sys.executable, "-m", "effectlog.cli.main", "--log", url, "topics", "create"]
    refused = subprocess.run([*base, "--window", "1h"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 3
    assert "shorter than the reconciliation window" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    settings = KafkaSettings.from_url(url)
    topics = AdminClient(settings.client_config()).list_topics(timeout=10).topics
    assert settings.topic(EVENTS) not in topics  # nothing was created
    forced = subprocess.run([*base, "--window", "1h", "--allow-short-lag"], capture_output=True,
                            text=True, timeout=60)
    assert forced.returncode == 0, forced.stderr
    assert "warning" in forced.stderr and "shorter than the reconciliation window" in forced.stderr
    fine = subprocess.run([*base, "--window", "30s"], capture_output=True, text=True, timeout=60)
    assert fine.returncode == 0 and "exists" in fine.stdout
