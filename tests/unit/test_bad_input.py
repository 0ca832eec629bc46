"""Bad input is refused before anything reaches the log; bad bytes on the log harm no reader."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.audit import Replay
from effectlog.codec import event_codec
from effectlog.errors import CodecError, InvalidInput, PayloadMismatch
from effectlog.keys import MAX_KEY_BYTES, make_key, validate_key
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import new_effect
from effectlog.model import State, Transition
from effectlog.view import LogView
from effectlog.worker import EffectInDoubt, Worker

KIND, TARGET = "email.send", "mailto:a@example.com"
KEY = f"agent:op-1:{KIND}:{TARGET}"
CONTROL = ["\x00", "\n", "\r", "\t", "\x1b", "\x7f", "\u200b", "\u2028", "\u202e"]


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return open_log(f"sqlite:///{tmp_path}/log.db")


def written(log: EventLog) -> int:
    return sum(log.end_offsets(EVENTS).values())


# -- keys, kinds, targets, operation ids ------------------------------------------------------

@pytest.mark.parametrize("key", ["", "agent:op:k:" + "x" * (MAX_KEY_BYTES - 10),
                                 "agent:op:k:" + "€" * 200])
def test_empty_and_over_512_byte_keys_are_invalid(key: str) -> None:
    with pytest.raises(InvalidInput):
        validate_key(key)


@pytest.mark.parametrize("char", CONTROL)
@pytest.mark.parametrize("field", ["operation_id", "kind", "target"])
def test_control_characters_are_refused_in_every_key_part(field: str, char: str) -> None:
    parts = {"operation_id": "op-1", "kind": KIND, "target": TARGET}
    parts[field] = parts[field][:3] + char + parts[field][3:]
    with pytest.raises(InvalidInput):
        make_key(**parts)


@pytest.mark.parametrize(("field", "value"), [
    ("operation_id", ""), ("operation_id", "op:1"), ("operation_id", "op 1"),
    ("kind", ""), ("kind", "Email.Send"), ("kind", "1email"), ("target", ""),
    ("target", " mailto:a@example.com"), ("target", "x" * (MAX_KEY_BYTES + 1)),
])
def test_malformed_key_parts_are_refused(field: str, value: str) -> None:
    parts = {"operation_id": "op-1", "kind": KIND, "target": TARGET, field: value}
    with pytest.raises(InvalidInput):
        make_key(**parts)


@pytest.mark.parametrize(("field", "value"), [
    ("operation_id", "op\n1"), ("kind", "email\x00send"), ("target", "mailto:a@x\u2028"),
    ("target", "x" * 600),
])
def test_worker_refuses_bad_key_parts_before_writing(log: EventLog, field: str, value: str) -> None:
    parts = {"operation_id": "op-1", "kind": KIND, "target": TARGET, field: value}
    with pytest.raises(InvalidInput):
        Worker(log, "w1").create(parts["operation_id"], parts["kind"], parts["target"], {"a": 1})
    assert written(log) == 0


@pytest.mark.parametrize("payload", [float("inf"), {"when": object()}, b"raw bytes"])
def test_non_json_payload_is_refused_before_writing(log: EventLog, payload: object) -> None:
    with pytest.raises(InvalidInput):
        Worker(log, "w1").create("op-1", KIND, TARGET, payload)
    assert written(log) == 0


@pytest.mark.parametrize("result", [float("nan"), {"ms": float("inf")}, [float("-inf")],
                                    {"at": object()}])
def test_a_result_json_has_no_form_for_is_refused_before_writing(log: EventLog,
                                                                  result: object) -> None:
    """NaN and Infinity are no JSON: stored, they broke every strict reader of the result
    (the query API's clients, the Java interop reader)."""
    worker = Worker(log, "w1")
    key = worker.create("op-1", KIND, TARGET, {"to": TARGET}).idempotency_key
    worker.reserve(key)
    worker.dispatch(key)
    before = written(log)
    with pytest.raises(InvalidInput, match=r"outcome\.result is not JSON"):
        worker.record(key, "succeeded", result)
    assert written(log) == before


def test_a_call_answering_nan_leaves_its_effect_unknown_not_recorded(log: EventLog) -> None:
    """The call happened; what it answered cannot be recorded: UNKNOWN with the reason, the
    error raised, and the next delivery does not call again."""
    worker, calls = Worker(log, "w1"), []

    def call(effect: object) -> float:
        calls.append(effect)
        return float("nan")

    with pytest.raises(InvalidInput, match=r"outcome\.result is not JSON"):
        worker.perform("op-1", KIND, TARGET, {"to": TARGET}, call)
    effect = worker.get(KEY)
    assert effect is not None and effect.state is State.UNKNOWN
    assert effect.error is not None and "not JSON" in effect.error
    with pytest.raises(EffectInDoubt):
        worker.perform("op-1", KIND, TARGET, {"to": TARGET}, call)
    assert len(calls) == 1


def test_empty_worker_id_is_refused() -> None:
    with pytest.raises(InvalidInput):
        new_effect("op-1", KIND, TARGET, {"a": 1}, "")


# -- transition names ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["dispatch", " DISPATCH ", "Await_Approval"])
def test_transition_names_parse_case_insensitively(name: str) -> None:
    assert Transition.parse(name) in Transition


@pytest.mark.parametrize("name", ["", "launch", "dispatched", "CREATED", "re-serve", "create;drop"])
def test_unknown_transition_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        Transition.parse(name)


def test_cli_append_refuses_unknown_transition_and_control_characters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    base = {"operation_id": "op-1", "kind": KIND, "target": TARGET, "worker_id": "w1",
            "payload": {"a": 1}}
    for line in ({**base, "transition": "launch"}, {**base, "transition": "create",
                                                     "kind": "email\u0007send"}):
        proc = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "append"],
                              input=json.dumps(line) + "\n", capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
    assert written(open_log(url)) == 0


# -- payload identity under one key -------------------------------------------------------------

def test_payload_mismatch_under_one_key_writes_nothing(log: EventLog) -> None:
    worker = Worker(log, "w1")
    worker.create("op-1", KIND, TARGET, {"amount": 10})
    before = written(log)
    with pytest.raises(PayloadMismatch):
        worker.create("op-1", KIND, TARGET, {"amount": 11})
    with pytest.raises(PayloadMismatch):
        Worker(log, "w2").perform("op-1", KIND, TARGET, {"amount": 12}, lambda call: None)
    assert written(log) == before
    assert worker.get(KEY).payload_hash == new_effect(  # type: ignore[union-attr]
        "op-1", KIND, TARGET, {"amount": 10}, "w1").payload_hash


# -- bad bytes on the log -----------------------------------------------------------------------

def valid_bytes() -> bytes:
    return event_codec().encode(new_effect("op-1", KIND, TARGET, {"a": 1}, "w1").to_record())


@pytest.mark.parametrize("data", [
    b"", b"\xc3", b"\xc3\x01", b'{"idempotency_key": "agent:op-1:k:t"}', b"\x00" * 64,
    b"\xc3\x01" + b"\xff" * 8 + b"body",
])
def test_foreign_bytes_are_codec_errors(data: bytes) -> None:
    with pytest.raises(CodecError):
        event_codec().decode(data)


@pytest.mark.parametrize("cut", [11, 40, -1])
def test_truncated_records_are_codec_errors(cut: int) -> None:
    with pytest.raises(CodecError):
        event_codec().decode(valid_bytes()[:cut])


def test_log_view_skips_garbage_and_keeps_the_last_good_snapshot(log: EventLog) -> None:
    worker = Worker(log, "w1")
    worker.create("op-1", KIND, TARGET, {"a": 1})
    reserved = worker.reserve(KEY)
    log.append(EVENTS, KEY, valid_bytes()[:-3])
    log.append(EVENTS, KEY, b"\x89PNG\r\n\x1a\n")
    assert LogView(log).current(KEY) == reserved
    assert [e.transition for e in worker.history(KEY)] == [Transition.CREATE, Transition.RESERVE]
    worker.dispatch(KEY)  # the worker carries on past the garbage
    assert LogView(log).current(KEY).state.value == "DISPATCHED"  # type: ignore[union-attr]


def test_replay_reports_each_undecodable_record_and_keeps_going(log: EventLog) -> None:
    worker = Worker(log, "w1")
    worker.create("op-1", KIND, TARGET, {"a": 1})
    truncated = log.append(EVENTS, KEY, valid_bytes()[:-3]).offset
    foreign = log.append(EVENTS, KEY, b"hello").offset
    worker.reserve(KEY)
    run = Replay(log)
    items = list(run)
    bad = [(i.record.offset, i.violation.reason) for i in items if i.event is None and i.violation]
    assert bad == [(truncated, "undecodable"), (foreign, "undecodable")]
    assert [i.event.transition for i in items if i.event] == [Transition.CREATE, Transition.RESERVE]
    assert run.summary.undecodable == 2 and run.summary.violation_count == 2
