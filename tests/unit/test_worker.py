from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import Fenced, IllegalTransition, InvalidInput, NotFound, PayloadMismatch
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.model import State, Transition
from effectlog.provider import ProviderFailed, ProviderTimeout
from effectlog.worker import EffectInDoubt, Worker

KIND, TARGET = "email.send", "mailto:a@example.com"


@pytest.fixture(params=["memory", "sqlite"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> EventLog:
    return open_log("memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/log.db")


def test_full_cycle_writes_one_event_per_transition(log: EventLog) -> None:
    worker = Worker(log, "w1")
    result = worker.perform("op-1", KIND, TARGET, {"s": "hi"}, lambda call: {"id": call.key})
    key = "agent:op-1:email.send:mailto:a@example.com"
    assert result == {"id": key}
    assert [e.transition for e in worker.history(key)] == [
        Transition.CREATE, Transition.RESERVE, Transition.DISPATCH, Transition.RECORD]
    assert worker.get(key).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_same_key_and_payload_returns_the_original_result_without_calling(log: EventLog) -> None:
    calls: list[int] = []

    def send(call: Any) -> dict[str, int]:
        calls.append(call.fencing_epoch)
        return {"n": len(calls)}

    worker = Worker(log, "w1")
    first = worker.perform("op-1", KIND, TARGET, {"s": 1}, send)
    second = Worker(log, "w2").perform("op-1", KIND, TARGET, {"s": 1}, send)
    assert first == second == {"n": 1} and calls == [1]


def test_same_key_with_another_payload_is_rejected(log: EventLog) -> None:
    worker = Worker(log, "w1")
    worker.create("op-1", KIND, TARGET, {"amount": 1})
    with pytest.raises(PayloadMismatch):
        worker.create("op-1", KIND, TARGET, {"amount": 2})
    assert len(log.read_key(EVENTS, "agent:op-1:email.send:mailto:a@example.com")) == 1


def test_provider_timeout_becomes_unknown_not_failed(log: EventLog) -> None:
    worker = Worker(log, "w1")

    def times_out(call: Any) -> None:
        raise ProviderTimeout("no answer in 5s")

    with pytest.raises(ProviderTimeout):
        worker.perform("op-2", KIND, TARGET, {}, times_out)
    event = worker.get("agent:op-2:email.send:mailto:a@example.com")
    assert event is not None and event.state is State.UNKNOWN and "no answer" in (event.error or "")


def test_definitive_provider_failure_is_recorded_failed(log: EventLog) -> None:
    worker = Worker(log, "w1")

    def refuses(call: Any) -> None:
        raise ProviderFailed("mailbox does not exist", {"code": 550})

    with pytest.raises(ProviderFailed):
        worker.perform("op-3", KIND, TARGET, {}, refuses)
    event = worker.get("agent:op-3:email.send:mailto:a@example.com")
    assert event is not None and event.state is State.FAILED
    assert event.outcome is not None and event.outcome.result == {"code": 550}


def test_effect_in_doubt_is_never_rerun(log: EventLog) -> None:
    worker = Worker(log, "w1")
    worker.create("op-4", KIND, TARGET, {})
    key = "agent:op-4:email.send:mailto:a@example.com"
    worker.reserve(key)
    worker.dispatch(key)  # then the worker "crashes"
    with pytest.raises(EffectInDoubt):
        Worker(log, "w2").perform("op-4", KIND, TARGET, {}, lambda call: pytest.fail("re-run"))


def test_reserved_effect_is_taken_over_with_a_new_epoch(log: EventLog) -> None:
    Worker(log, "w1").create("op-5", KIND, TARGET, {})
    key = "agent:op-5:email.send:mailto:a@example.com"
    Worker(log, "w1").reserve(key)
    epochs: list[int] = []
    Worker(log, "w2").perform("op-5", KIND, TARGET, {}, lambda c: epochs.append(c.fencing_epoch))
    assert epochs == [2]


def test_paused_worker_with_the_same_id_is_fenced_after_a_takeover(log: EventLog) -> None:
    paused = Worker(log, "w1")
    paused.create("op-6", KIND, TARGET, {})
    key = "agent:op-6:email.send:mailto:a@example.com"
    paused.reserve(key)
    replacement = Worker(log, "w1")  # the same worker id, restarted
    replacement.reserve(key)
    with pytest.raises(Fenced) as info:
        paused.dispatch(key)
    assert info.value.reason == "stale_epoch"


def test_block_that_records_nothing_leaves_the_effect_unknown(log: EventLog) -> None:
    worker = Worker(log, "w1")
    with worker.effect("op-7", KIND, TARGET, {}) as call:
        assert call.fencing_epoch == 1
    assert worker.get(call.key).state is State.UNKNOWN  # type: ignore[union-attr]


def test_context_manager_records_success(log: EventLog) -> None:
    worker = Worker(log, "w1")
    with worker.effect("op-8", KIND, TARGET, {"x": 1}) as call:
        call.succeeded({"message_id": "m-8"})
    again = Worker(log, "w1")
    with again.effect("op-8", KIND, TARGET, {"x": 1}) as call2:
        assert call2.done and call2.result == {"message_id": "m-8"}


def test_transitions_on_missing_keys_are_not_found(log: EventLog) -> None:
    with pytest.raises(NotFound):
        Worker(log, "w1").dispatch("agent:nope:email.send:t")


def test_illegal_transition_is_refused_before_reaching_the_log(log: EventLog) -> None:
    worker = Worker(log, "w1")
    worker.create("op-9", KIND, TARGET, {})
    key = "agent:op-9:email.send:mailto:a@example.com"
    with pytest.raises(IllegalTransition):
        worker.dispatch(key)
    assert len(log.read_key(EVENTS, key)) == 1


def test_oversized_payload_needs_a_reference(log: EventLog) -> None:
    worker = Worker(log, "w1", max_payload_bytes=100)
    with pytest.raises(InvalidInput, match="payload_ref"):
        worker.create("op-10", KIND, TARGET, {"blob": "x" * 200})
    event = worker.create("op-10", KIND, TARGET, {"blob": "x" * 200}, payload_ref="vault://p/10")
    assert event.payload is None and event.payload_ref == "vault://p/10"


def test_concurrent_claims_have_exactly_one_winner(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    Worker(open_log(url), "w0").create("op-11", KIND, TARGET, {})
    key = "agent:op-11:email.send:mailto:a@example.com"
    Worker(open_log(url), "w0").reserve(key)
    a, b = Worker(open_log(url), "a"), Worker(open_log(url), "b")
    # Both read epoch 1, both try to claim epoch 2: the log order picks one.
    from effectlog.machine import advance

    current = a.get(key)
    assert current is not None
    first = advance(current, Transition.CLAIM, "a")
    second = advance(current, Transition.CLAIM, "b")
    a.write(first)
    with pytest.raises(Fenced):
        b.write(second)
    assert a.get(key).worker_id == "a"  # type: ignore[union-attr]


def test_simultaneous_creates_of_one_key_both_get_the_original(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    a, b = Worker(open_log(url), "a"), Worker(open_log(url), "b")
    key = "agent:op-12:email.send:mailto:a@example.com"
    assert a.get(key) is None and b.get(key) is None  # both saw no effect yet
    first = a.create("op-12", KIND, TARGET, {"n": 1})
    # b still believes the key is new (its read above): its append must lose
    second = b.create("op-12", KIND, TARGET, {"n": 1})
    assert second.event_id == first.event_id
    assert len(open_log(url).read_key(EVENTS, key)) == 1
    with pytest.raises(PayloadMismatch):
        b.create("op-12", KIND, TARGET, {"n": 2})


class CountingLog:
    """Wraps a log and counts the durable appends (commits) made through it."""

    def __init__(self, log: EventLog) -> None:
        self.inner, self.appends = log, 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in ("append", "append_many", "append_after"):
            def counted(*args: Any) -> Any:
                self.appends += 1
                return attr(*args)
            return counted
        return attr


def test_perform_writes_create_reserve_and_dispatch_as_one_append(log: EventLog) -> None:
    counting = CountingLog(log)
    worker = Worker(counting, "w1")  # type: ignore[arg-type]
    seen: list[State] = []

    def send(call: Any) -> str:
        seen.append(worker.get(call.key).state)  # type: ignore[union-attr]
        return "ok"

    worker.perform("op-20", KIND, TARGET, {"n": 1}, send)
    assert seen == [State.DISPATCHED]  # durable and accepted before the call
    assert counting.appends == 2  # create+reserve+dispatch, then record
    events = worker.history("agent:op-20:email.send:mailto:a@example.com")
    assert [(e.transition, e.fencing_epoch, e.attempt) for e in events] == [
        (Transition.CREATE, 0, 0), (Transition.RESERVE, 1, 0), (Transition.DISPATCH, 1, 1),
        (Transition.RECORD, 1, 1)]


def test_perform_that_loses_the_create_race_judges_against_the_winner(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    a, b = Worker(open_log(url), "a"), Worker(open_log(url), "b")
    key = "agent:op-21:email.send:mailto:a@example.com"
    calls: list[str] = []
    assert b.get(key) is None  # b believes the key is new: its three-event append loses
    a.create("op-21", KIND, TARGET, {"n": 1})
    assert b.perform("op-21", KIND, TARGET, {"n": 1}, lambda c: calls.append(c.key)) is None
    assert calls == [key]
    events = open_log(url).read_key(EVENTS, key)
    assert len(events) == 4  # a's CREATE, then b's RESERVE, DISPATCH and RECORD only
    assert b.get(key).state is State.SUCCEEDED  # type: ignore[union-attr]

    # a finished effect: the recorded result, no second call
    assert b.perform("op-21", KIND, TARGET, {"n": 1}, lambda c: calls.append(c.key)) is None
    assert calls == [key]
    with pytest.raises(PayloadMismatch):
        b.perform("op-21", KIND, TARGET, {"n": 2}, lambda c: calls.append(c.key))
    assert len(open_log(url).read_key(EVENTS, key)) == 4 and calls == [key]


def test_perform_takes_over_a_key_left_reserved_by_a_dead_worker(log: EventLog) -> None:
    dead = Worker(log, "dead")
    dead.create("op-22", KIND, TARGET, {})
    key = "agent:op-22:email.send:mailto:a@example.com"
    dead.reserve(key)
    assert Worker(log, "next").perform("op-22", KIND, TARGET, {}, lambda c: c.fencing_epoch) == 2
    assert [e.transition for e in dead.history(key)][-3:] == [
        Transition.CLAIM, Transition.DISPATCH, Transition.RECORD]
