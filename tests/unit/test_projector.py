"""The projector: exactly-once apply, rejections with reasons, counters, offsets and lag."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import advance, fold, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from effectlog.view import decode_events
from projections import open_reader
from projections.projector import Progress, Projector, ProjectorSettings, project
from projections.rocksdb.digest import projection_digest
from projections.rocksdb.writer import RocksPartitionWriter
from tests import projector_workload as workload


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return open_log(f"sqlite:///{tmp_path}/log.db")


def append(log: EventLog, *events: EffectEvent | bytes, key: str | None = None) -> None:
    codec = event_codec()
    for event in events:
        if isinstance(event, bytes):
            log.append(EVENTS, key or "agent:x:k:t", event)
        else:
            log.append(EVENTS, event.idempotency_key, codec.encode(event.to_record()))


def reasons(state: Path) -> dict[str, int]:
    with open_reader(state) as reader:
        return {k.split(":", 1)[1]: v for k, v in reader.counts().items()
                if k.startswith("rejected:")}


@pytest.mark.parametrize("reason", ["stale_epoch", "foreign_owner", "unclaimed_epoch",
                                    "payload_mismatch", "duplicate", "illegal_transition",
                                    "undecodable"])
def test_each_bad_event_is_rejected_with_its_reason(log: EventLog, tmp_path: Path,
                                                   reason: str) -> None:
    samples = workload.rejected_samples(1)
    good = [e for e, r in samples[:3] if isinstance(e, EffectEvent)]
    bad = next(e for e, r in samples if r == reason)
    append(log, *good, bad, key="agent:bad1:payment.charge:acct-1")
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        rejection = reader.rejected_at(log.read(EVENTS, 0, 3, 1)[0].position)
        assert rejection is not None and rejection.reason == reason
        assert rejection.raw == log.read(EVENTS, 0, 3, 1)[0].value
        current = reader.get(good[-1].idempotency_key)
    assert current == good[-1]  # the refused event changed nothing
    assert reasons(tmp_path / "state") == {reason: 1}


def test_stale_epoch_is_rejected(log: EventLog, tmp_path: Path) -> None:
    create = new_effect("op1", "email.send", "mailto:a@x", {"a": 1}, "w1")
    first = advance(create, T.RESERVE, "w1")
    takeover = advance(first, T.CLAIM, "w2")
    late = advance(first, T.DISPATCH, "w1")  # the paused pre-takeover worker wakes up
    append(log, create, first, takeover, late)
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        assert reader.get(create.idempotency_key) == takeover
        assert [r.reason for r in reader.rejected()] == ["stale_epoch"]


def test_key_that_differs_from_the_event_is_rejected(log: EventLog, tmp_path: Path) -> None:
    create = new_effect("op1", "email.send", "mailto:a@x", {"a": 1}, "w1")
    log.append(EVENTS, "agent:other:email.send:b", event_codec().encode(create.to_record()))
    project(log, tmp_path / "state")
    assert reasons(tmp_path / "state") == {"key_mismatch": 1}


def test_projection_equals_the_fold_of_every_key(log: EventLog, tmp_path: Path) -> None:
    items, expected = workload.build(200, bad_every=20)
    workload.write(log, items)
    progress = project(log, tmp_path / "state", ProjectorSettings(batch_size=97))
    assert progress.records == len(items) and progress.total_lag == 0
    assert reasons(tmp_path / "state") == dict(expected)
    keys = {k for k, _ in items}
    with open_reader(tmp_path / "state") as reader:
        for key in keys:
            folded, _ = fold(decode_events(log, key))
            assert reader.get(key) == folded
        counts = Counter(e.state.value for e in map(reader.get, keys) if e is not None)
        assert {f"state:{s}": n for s, n in counts.items()} == {
            k: v for k, v in reader.counts().items() if k.startswith("state:")}


def test_batch_boundaries_and_cache_size_do_not_change_the_result(log: EventLog,
                                                                   tmp_path: Path) -> None:
    items, _ = workload.build(150, bad_every=10)
    workload.write(log, items)
    digests = set()
    for name, batch, cache in (("a", 1, 1), ("b", 7, 0), ("c", 5000, 100_000)):
        project(log, tmp_path / name, ProjectorSettings(batch_size=batch, cache_size=cache))
        digests.add(projection_digest(tmp_path / name))
    assert len(digests) == 1


def test_several_events_of_one_key_in_one_batch_chain(log: EventLog, tmp_path: Path) -> None:
    events = workload.lifecycle(1)
    append(log, *events)
    progress = project(log, tmp_path / "state", ProjectorSettings(batch_size=100))
    assert (progress.accepted, progress.rejected) == (4, 0)
    with open_reader(tmp_path / "state") as reader:
        assert reader.get(events[0].idempotency_key) == events[-1]
        assert {k: v for k, v in reader.counts().items() if k.startswith("state:")} == {
            "state:SUCCEEDED": 1}


def test_resumes_from_stored_offsets_without_reapplying(log: EventLog, tmp_path: Path) -> None:
    items, _ = workload.build(100, bad_every=10)
    workload.write(log, items[:150])
    project(log, tmp_path / "state", ProjectorSettings(batch_size=40))
    workload.write(log, items[150:])
    with Projector(log, tmp_path / "state") as projector:
        assert projector.next_offsets() == {0: 150}
        assert projector.lag() == {0: len(items) - 150}
        progress = projector.run(once=True)
    assert progress.records == len(items) - 150
    project(log, tmp_path / "clean")
    assert projection_digest(tmp_path / "state") == projection_digest(tmp_path / "clean")


def test_records_below_the_stored_offset_are_skipped(log: EventLog, tmp_path: Path) -> None:
    events = workload.lifecycle(2)
    append(log, *events)
    records = log.read(EVENTS, 0, 0, 10)
    writer = RocksPartitionWriter(tmp_path / "p", 0)
    try:
        assert writer.apply(records).accepted == 4
        again = writer.apply(records)  # a re-delivered batch
        assert (again.records, writer.next_offset) == (0, 4)
        assert writer.counts["state:SUCCEEDED"] == 1 and writer.counts["metric:attempts"] == 1
    finally:
        writer.close()


def test_lag_is_reported_before_and_while_catching_up(log: EventLog, tmp_path: Path) -> None:
    items, _ = workload.build(50, bad_every=1000)
    workload.write(log, items)
    seen: list[int] = []

    def record(progress: Progress) -> None:
        seen.append(progress.total_lag)

    with Projector(log, tmp_path / "state", ProjectorSettings(batch_size=50)) as projector:
        projector.run(once=True, on_progress=record)
    assert seen[0] == len(items)  # reported before the first batch
    assert seen == sorted(seen, reverse=True) and seen[-1] == 0
    assert len(set(seen)) >= len(items) // 50


def test_index_follows_the_state(log: EventLog, tmp_path: Path) -> None:
    create, reserve, dispatch, record = workload.lifecycle(3)
    append(log, create, reserve, dispatch)
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        assert [e.event_id for e in reader.scan_state(State.DISPATCHED)] == [dispatch.event_id]
    append(log, record)
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        assert list(reader.scan_state(State.DISPATCHED)) == []
        assert [e.event_id for e in reader.scan_state(State.SUCCEEDED)] == [record.event_id]


def test_scan_state_is_oldest_first_and_touches_only_matching_entries(
        log: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The index orders effects by the log's own time of their last record (the SQLite
    log's insertion time here), never by the writer's clock (``occurred_at``)."""
    import effectlog.log.sqlite as sqlite_log

    codec = event_codec()
    for i in range(300):  # 100 DISPATCHED (every third) logged at 1000 + i, the rest RESERVED
        create = new_effect(f"s{i}", "email.send", "t", {"i": i}, "w")
        reserve = advance(create, T.RESERVE, "w")
        chain = [create, reserve] + ([advance(reserve, T.DISPATCH, "w")] if i % 3 == 0 else [])
        # the writer's clock says something else entirely: it plays no part
        items = [(e.idempotency_key, codec.encode({**e.to_record(), "occurred_at": 99_000 - i}))
                 for e in chain]
        monkeypatch.setattr(sqlite_log.time, "time", lambda i=i: (1000 + i) / 1000)
        log.append_many(EVENTS, items)
    monkeypatch.undo()
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        old = [s["operation_id"] for s in reader.scan_state_json("DISPATCHED",
                                                                 older_than_ms=1000 + 150)]
        assert old == [f"s{i}" for i in range(0, 150, 3)]
        assert reader.index_steps == len(old)  # a range scan: no other entry was visited
        reader.index_steps = 0
        assert len(list(reader.scan_state(State.RESERVED, limit=5))) == 5
        assert reader.index_steps <= 6


def test_rejected_are_listed_in_log_order(log: EventLog, tmp_path: Path) -> None:
    items, expected = workload.build(40, bad_every=10)
    workload.write(log, items)
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        rejected = list(reader.rejected())
        assert len(rejected) == sum(expected.values())
        offsets = [r.position.offset for r in rejected]
        assert offsets == sorted(offsets)
        assert len(list(reader.rejected(limit=3))) == 3
        assert reader.rejected_at(rejected[0].position) == rejected[0]
        accepted = next(r for r in log.read(EVENTS, 0, 0, 100) if r.offset not in offsets)
        assert reader.rejected_at(accepted.position) is None


def test_a_second_projector_on_the_same_projection_is_refused(log: EventLog,
                                                             tmp_path: Path) -> None:
    with Projector(log, tmp_path / "state"), pytest.raises(BackendUnavailable, match="locked"):
        Projector(log, tmp_path / "state").open()


def test_record_outcome_and_payload_survive_the_snapshot(log: EventLog, tmp_path: Path) -> None:
    create = new_effect("op9", "email.send", "mailto:z@x", {"body": "héllo"}, "w1")
    reserve = advance(create, T.RESERVE, "w1")
    record = advance(reserve, T.RECORD, "w1", outcome=Outcome(State.FAILED, {"code": 550}))
    append(log, create)
    project(log, tmp_path / "a")
    with open_reader(tmp_path / "a") as reader:
        assert reader.get(create.idempotency_key) == create
        shown = reader.get_json(create.idempotency_key)
        assert shown is not None and shown["payload"] == {"body": "héllo"}
    append(log, reserve, record)
    project(log, tmp_path / "a")
    with open_reader(tmp_path / "a") as reader:
        assert reader.get(create.idempotency_key) == record
        assert reader.counts()["state:FAILED"] == 1
        assert reader.counts()["metric:recorded:failed"] == 1
        assert "metric:confirmed_effects" not in reader.counts()


def test_missing_projection_reads_as_empty(tmp_path: Path) -> None:
    with open_reader(tmp_path / "nothing") as reader:
        assert not reader.exists
        assert reader.get("agent:a:b:c") is None
        assert reader.next_offsets() == {} and reader.counts() == {}


def test_a_dead_decoder_process_is_replaced_by_inline_decoding(log: EventLog,
                                                               tmp_path: Path) -> None:
    items, _ = workload.build(1500, bad_every=100)
    workload.write(log, items)
    settings = ProjectorSettings(decoder="process", batch_size=500, process_decode_min=1)
    with Projector(log, tmp_path / "state", settings) as projector:
        source = projector.source(until=log.end_offsets(EVENTS))
        assert projector.step(source) == 500
        helpers = [p for p in Path("/proc").glob("[0-9]*/cmdline")
                   if b"projections.decoding" in _read(p) and _parent(p.parent) == os.getpid()]
        assert len(helpers) == 1
        os.kill(int(helpers[0].parent.name), signal.SIGKILL)
        progress = projector.run(once=True)
    assert progress.total_lag == 0
    project(log, tmp_path / "clean", ProjectorSettings(decoder="inline"))
    assert projection_digest(tmp_path / "state") == projection_digest(tmp_path / "clean")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _parent(proc: Path) -> int:
    return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
