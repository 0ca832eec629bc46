"""`effectlog replay` over a multi-partition Kafka events topic (real broker)."""

from __future__ import annotations

import io
import uuid
from collections.abc import Iterator
from dataclasses import replace

import fastavro
import pytest
from click.testing import CliRunner

from effectlog.audit import Replay
from effectlog.cli.main import cli
from effectlog.codec import event_codec
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import advance, new_effect
from effectlog.model import Outcome, State, Transition

pytestmark = pytest.mark.kafka
KIND = "email.send"


@pytest.fixture
def log(kafka_url: str) -> Iterator[EventLog]:
    log = open_log(kafka_url)
    yield log
    log.close()


def fill(log: EventLog, keys: int) -> tuple[dict[str, list[str]], tuple[int, int]]:
    """Full histories for ``keys`` effects (appended raw, fast) and one stale-epoch event;
    returns event ids per key and the (partition, offset) of the bad event."""
    ids: dict[str, list[str]] = {}
    codec = event_codec()
    last = None
    for n in range(keys):
        created = new_effect(f"op-{n}", KIND, f"mailto:{n}@example.com", {"n": n}, "w1")
        reserved = advance(created, Transition.RESERVE, "w1")
        dispatched = advance(reserved, Transition.DISPATCH, "w1")
        recorded = advance(dispatched, Transition.RECORD, "w1",
                           outcome=Outcome(State.SUCCEEDED, {"n": n}))
        events = [created, reserved, dispatched, recorded]
        log.append_many(EVENTS, [(e.idempotency_key, codec.encode(e.to_record())) for e in events])
        ids[created.idempotency_key] = [e.event_id for e in events]
        last = reserved
    assert last is not None
    # A paused pre-claim writer's dispatch at epoch 0, after the key reached epoch 1.
    stale = replace(last, transition=Transition.DISPATCH, state=State.DISPATCHED,
                    fencing_epoch=0, attempt=1, event_id=uuid.uuid4().hex)
    pos = log.append(EVENTS, stale.idempotency_key, codec.encode(stale.to_record()))
    return ids, (pos.partition, pos.offset)


def test_replay_covers_every_partition_in_per_key_order(log: EventLog) -> None:
    ids, bad = fill(log, 12)
    seen: list[int] = []
    run = Replay(log, progress=seen.append)
    items = list(run)
    assert len(items) == 12 * 4 + 1
    # progress counts offsets: the records plus the commit markers of multi-event appends
    # (each a Kafka transaction), so it ends exactly at the total, above the record count
    assert sum(seen) == run.total() >= len(items)
    assert len({i.record.partition for i in items}) > 1
    per_key: dict[str, list[str]] = {}
    for item in items:
        assert item.event is not None
        per_key.setdefault(item.record.key, []).append(item.event.event_id)
    assert {k: v[:4] for k, v in per_key.items()} == ids
    assert [(v.position.partition, v.position.offset, v.reason)
            for v in run.summary.violations] == [(*bad, "epoch_regression")]


def test_cli_avro_archive_of_a_kafka_log_reads_back(kafka_url: str, log: EventLog) -> None:
    ids, bad = fill(log, 5)
    result = CliRunner().invoke(cli, ["--log", kafka_url, "replay", "--format", "avro"],
                                catch_exceptions=False)
    assert result.exit_code == 3
    records = list(fastavro.reader(io.BytesIO(result.stdout_bytes)))
    assert len(records) == 5 * 4 + 1
    flagged = [(r["partition"], r["offset"]) for r in records if r["violation"]]
    assert flagged == [bad]
    one = next(iter(ids))
    only = CliRunner().invoke(cli, ["--log", kafka_url, "replay", "--key", one, "--json"])
    assert only.exit_code == 0 and only.stdout.count("\n") == 4
