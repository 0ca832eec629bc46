"""Projection storage: encodings, fast event building, readers, generations and rebuild."""

from __future__ import annotations

import os
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog.codec import event_codec
from effectlog.log import EventLog, open_log
from effectlog.machine import advance, new_effect
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State
from effectlog.model import Transition as T
from projections import open_reader
from projections.fastevent import event_from_fields, event_from_record, fields_from_record
from projections.projector import Projector, ProjectorSettings, project
from projections.rebuild import rebuild
from projections.rocksdb import layout
from projections.rocksdb.digest import projection_digest
from projections.rocksdb.snapshot import (
    decode_snapshot,
    decode_stored,
    encode_snapshot,
    snapshot_from_fields,
    snapshot_json,
)
from tests import projector_workload as workload

text = st.text(st.characters(codec="utf-8"), max_size=20)
json_value = st.recursive(st.none() | st.booleans() | st.integers() | text,
                          lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(text, inner, max_size=3), max_leaves=8)


@st.composite
def events(draw: st.DrawFn) -> EffectEvent:
    payload = draw(json_value)
    ref = draw(st.none() | st.just("vault:secret/1"))
    event = new_effect(draw(st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True)), "email.send",
                       draw(st.from_regex(r"mailto:[a-z]{1,6}@x", fullmatch=True)), payload,
                       "w1", payload_ref=ref)
    event = replace(event, created_at=draw(st.integers(0, 2**41)),
                    occurred_at=draw(st.integers(0, 2**41)))
    if draw(st.booleans()):
        event = replace(event, transition=T.RECORD, state=State.SUCCEEDED, payload=None,
                        outcome=Outcome(State.SUCCEEDED, draw(json_value), "lookup"),
                        error=draw(st.none() | text))
    if draw(st.booleans()):
        event = replace(event, approval=Approval(Decision.ABANDON, "ops", draw(text),
                                                 draw(st.integers(0, 2**41))))
    return event


@settings(max_examples=150, deadline=None)
@given(events())
def test_fast_event_building_equals_the_model(event: EffectEvent) -> None:
    codec = event_codec()
    record = codec.decode(codec.encode(event.to_record()))
    assert event_from_record(record) == EffectEvent.from_record(record) == event
    fields = fields_from_record(record)
    assert event_from_fields(fields) == event
    accepted = ((7, event.event_id),)
    assert snapshot_from_fields(fields, 5, accepted) == encode_snapshot(
        event_from_fields(fields), 5, accepted)


@settings(max_examples=150, deadline=None)
@given(events())
def test_snapshot_round_trips_and_its_json_matches_to_json(event: EffectEvent) -> None:
    raw = encode_snapshot(event, 42, ((3, event.event_id),))
    assert decode_snapshot(raw) == event
    assert decode_stored(raw) == (event, 42, ((3, event.event_id),))
    assert snapshot_json(raw) == {**event.to_json(), "logged_at": 42}


def test_naive_and_aware_datetimes_convert_like_the_model() -> None:
    record = event_codec().decode(event_codec().encode(workload.lifecycle(1)[0].to_record()))
    for stamp in (datetime(2024, 2, 29, 23, 59, 59, 999000), datetime(1969, 12, 31, 23, 0, 0, 1000),
                  datetime(2030, 1, 1, tzinfo=UTC)):
        rec = {**record, "created_at": stamp, "occurred_at": stamp}
        assert event_from_record(rec) == EffectEvent.from_record(rec)


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    items, _ = workload.build(60, bad_every=20)
    workload.write(log, items)
    return log


def test_state_dir_is_a_symlink_to_a_generation(log: EventLog, tmp_path: Path) -> None:
    project(log, tmp_path / "state")
    assert (tmp_path / "state").is_symlink()
    generation = layout.current_generation(tmp_path / "state")
    assert generation is not None and generation.name.startswith("state.gen-")
    assert layout.partitions_in(generation) == [0]


def test_rebuild_swaps_in_atomically_and_the_old_projection_stays_readable(
        log: EventLog, tmp_path: Path) -> None:
    state = tmp_path / "state"
    project(log, state)
    before = projection_digest(state)
    old_reader = open_reader(state)
    old_generation = layout.current_generation(state)
    key = "agent:op1:email.send:mailto:u1@example.com"
    new = rebuild(log, state)
    assert new is not None and new == layout.current_generation(state) != old_generation
    assert old_reader.get(key) is not None  # opened before the swap: still serves
    old_reader.close()
    assert old_generation is not None and old_generation.exists()  # kept one round
    assert projection_digest(state) == before
    assert not list(tmp_path.glob("state.new-*"))
    rebuild(log, state)
    assert not old_generation.exists()  # the generation before the previous one is pruned


def test_a_stopped_rebuild_leaves_the_projection_alone(log: EventLog, tmp_path: Path) -> None:
    import threading

    state = tmp_path / "state"
    project(log, state)
    generation = layout.current_generation(state)
    stop = threading.Event()
    stop.set()
    assert rebuild(log, state, stop=stop) is None
    assert layout.current_generation(state) == generation
    assert not list(tmp_path.glob("state.new-*"))


def test_running_projector_follows_a_rebuild(log: EventLog, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Projector(log, state, ProjectorSettings(batch_size=10)) as projector:
        projector.run(once=True)
        rebuild(log, state)
        more = new_effect("late", "email.send", "mailto:l@x", {}, "w1")
        log.append("events", more.idempotency_key, event_codec().encode(more.to_record()))
        projector.run(once=True)
    with open_reader(state) as reader:
        assert reader.get(more.idempotency_key) == more


def test_secondary_reader_sees_progress_after_refresh(log: EventLog, tmp_path: Path) -> None:
    state = tmp_path / "state"
    with Projector(log, state) as projector:
        projector.run(once=True)
        reader = open_reader(state, "secondary")
        try:
            seen = reader.next_offsets()[0]
            create, reserve = workload.lifecycle(99)[:2]
            for event in (create, reserve):
                log.append("events", event.idempotency_key, event_codec().encode(event.to_record()))
            projector.run(once=True)
            assert reader.next_offsets()[0] == seen  # not yet caught up
            reader.refresh()
            assert reader.next_offsets()[0] == seen + 2
            assert reader.get(create.idempotency_key) == reserve
        finally:
            reader.close()


def test_legacy_plain_directory_is_read_and_replaced_by_a_rebuild(log: EventLog,
                                                                   tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    project(log, plain / "x")  # builds plain/x -> plain/x.gen-...; move it to a plain dir
    generation = layout.current_generation(plain / "x")
    assert generation is not None
    os.rename(generation, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        assert reader.exists
    rebuild(log, tmp_path / "state")
    assert (tmp_path / "state").is_symlink()
    with open_reader(tmp_path / "state") as reader:
        assert reader.get("agent:op1:email.send:mailto:u1@example.com") is not None


def test_claims_by_a_second_worker_move_ownership(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    create = new_effect("o", "email.send", "mailto:a@x", {}, "w1")
    reserve = advance(create, T.RESERVE, "w1")
    claim = advance(reserve, T.CLAIM, "w2")
    for event in (create, reserve, claim):
        log.append("events", event.idempotency_key, event_codec().encode(event.to_record()))
    project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        current = reader.get(create.idempotency_key)
    assert current is not None and (current.worker_id, current.fencing_epoch) == ("w2", 2)
