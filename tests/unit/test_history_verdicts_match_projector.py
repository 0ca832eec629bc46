"""``history`` and ``replay`` give a key's records the projector's verdicts on a log that keeps
every record: a stray first record that is not a CREATE is rejected (``missing_create``) and
is no baseline, so the key's genuine CREATE..RECORD that follow are accepted, as
:func:`effectlog.machine.fold` (the projector's rules) accepts them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.audit import Replay, ReplayFilter
from effectlog.codec import event_codec
from effectlog.history import judge_records
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import advance, fold, new_effect
from effectlog.model import EffectEvent, Transition
from effectlog.view import decode_events
from effectlog.worker import Worker

OP, KIND, TARGET, PAYLOAD = "op-1", "email.send", "mailto:a@x", {"s": 1}


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    yield log
    log.close()


def stray(log: EventLog, *transitions: Transition) -> str:
    """Append a foreign writer's events of the key, unconditionally, without its CREATE."""
    event = new_effect(OP, KIND, TARGET, PAYLOAD, "stray")
    for transition in (Transition.RESERVE, *transitions):
        event = advance(event, transition, "stray")
        log.append(EVENTS, event.idempotency_key, event_codec().encode(event.to_record()))
    return event.idempotency_key


def projector_rejected(log: EventLog, key: str) -> list[int]:
    """The positions (in the key's records) that the projector's fold rejects."""
    events = decode_events(log, key, log.read_key(EVENTS, key))
    rejected = {id(e) for e, _ in fold(events)[1]}
    return [i for i, e in enumerate(events) if isinstance(e, EffectEvent) and id(e) in rejected]


@pytest.mark.parametrize("transitions", [(), (Transition.DISPATCH,),
                                         (Transition.DISPATCH, Transition.UNKNOWN)])
def test_history_rejects_only_the_stray_records_as_the_projector(
        log: EventLog, transitions: tuple[Transition, ...]) -> None:
    key = stray(log, *transitions)
    strays = 1 + len(transitions)
    assert Worker(log, "w1").perform(OP, KIND, TARGET, PAYLOAD, lambda call: {"ok": 1}) == {"ok": 1}
    assert projector_rejected(log, key) == list(range(strays))
    rows = judge_records(log.read_key(EVENTS, key), compacted=False)
    verdicts = [row["verdict"].split(":")[0] for row in rows]
    assert verdicts == ["rejected (missing_create)"] * strays + ["accepted"] * 4


def test_replay_flags_only_the_stray_records(log: EventLog) -> None:
    key = stray(log, Transition.DISPATCH)
    Worker(log, "w1").perform(OP, KIND, TARGET, PAYLOAD, lambda call: {"ok": 1})
    run = Replay(log, ReplayFilter(key=key))
    flagged = [item.record.offset for item in run if item.violation is not None]
    assert flagged == [r.offset for r in log.read_key(EVENTS, key)[:2]]
    assert run.summary.to_json()["violations"] == 2


def test_a_time_window_still_takes_its_first_record_as_the_baseline(log: EventLog) -> None:
    key = stray(log, Transition.DISPATCH)
    rows = judge_records(log.read_key(EVENTS, key), compacted=True)
    assert [row["verdict"] for row in rows] == ["accepted (baseline)", "accepted"]
