from __future__ import annotations

import json
from pathlib import Path

import fastavro
import pytest

from effectlog.codec import (
    MARKER,
    Codec,
    command_codec,
    event_codec,
    load_schema_text,
    schema_fingerprint,
)
from effectlog.errors import CodecError
from effectlog.machine import advance, new_effect
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State, Transition

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _event() -> EffectEvent:
    created = new_effect("op-1", "payment.charge", "acct:42", {"amount": 1200}, "w1")
    reserved = advance(created, Transition.RESERVE, "w1")
    return advance(reserved, Transition.DISPATCH, "w1")


def test_single_object_encoding_has_marker_and_fingerprint() -> None:
    data = event_codec().encode(_event().to_record())
    assert data[:2] == MARKER
    assert data[2:10] == schema_fingerprint(load_schema_text("effect_event.v2.avsc"))


def test_event_round_trips_exactly() -> None:
    event = _event()
    assert EffectEvent.from_record(event_codec().decode(event_codec().encode(event.to_record()))) == event


def test_outcome_and_approval_round_trip() -> None:
    event = _event()
    event = advance(event, Transition.UNKNOWN, "w1", error="timeout")
    event = advance(event, Transition.APPROVE, "ops",
                    approval=Approval(Decision.RETRY, "alice", "checked the bank"))
    decoded = EffectEvent.from_record(event_codec().decode(event_codec().encode(event.to_record())))
    assert decoded.approval == event.approval and decoded.state is State.RESERVED
    recorded = advance(_event(), Transition.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"id": 7}))
    back = EffectEvent.from_record(event_codec().decode(event_codec().encode(recorded.to_record())))
    assert back.outcome == Outcome(State.SUCCEEDED, {"id": 7})


def test_schemas_are_parsed_once() -> None:
    assert event_codec() is event_codec() and command_codec() is command_codec()


def test_record_written_with_v1_schema_is_read_by_current_reader() -> None:
    v1 = json.loads((FIXTURES / "effect_event.v1.avsc").read_text())
    old = Codec(v1)
    record = {k: v for k, v in _event().to_record().items()
              if k not in ("event_id", "payload_ref", "approval")}
    data = old.encode(record)
    reader = Codec(load_schema_text("effect_event.v2.avsc"), older=[v1])
    decoded = reader.decode(data)
    assert decoded["payload_ref"] is None and decoded["approval"] is None
    event = EffectEvent.from_record(decoded)
    assert event.state is State.DISPATCHED and event.event_id.startswith("v1:")


def test_unknown_writer_schema_is_a_codec_error() -> None:
    v1 = json.loads((FIXTURES / "effect_event.v1.avsc").read_text())
    record = {k: v for k, v in _event().to_record().items()
              if k not in ("event_id", "payload_ref", "approval")}
    with pytest.raises(CodecError, match="fingerprint"):
        event_codec().decode(Codec(v1).encode(record))


@pytest.mark.parametrize("data", [b"", b"\xc3", b"{\"json\": true}", b"\xc3\x01abc",
                                  b"\x00" * 40])
def test_foreign_bytes_are_codec_errors(data: bytes) -> None:
    with pytest.raises(CodecError):
        event_codec().decode(data)


def test_truncated_record_is_a_codec_error() -> None:
    data = event_codec().encode(_event().to_record())
    for cut in (11, len(data) // 2, len(data) - 1):
        with pytest.raises(CodecError):
            event_codec().decode(data[:cut])


def test_trailing_garbage_is_a_codec_error() -> None:
    data = event_codec().encode(_event().to_record())
    with pytest.raises(CodecError, match="trailing"):
        event_codec().decode(data + b"\x00")


def test_record_that_does_not_fit_the_schema_is_refused_on_encode() -> None:
    with pytest.raises(CodecError):
        event_codec().encode({"idempotency_key": 1})


def test_shipped_schemas_parse_with_fastavro() -> None:
    for name in ("effect_event.v2.avsc", "reconciliation_command.v1.avsc"):
        assert fastavro.parse_schema(load_schema_text(name))["type"] == "record"
