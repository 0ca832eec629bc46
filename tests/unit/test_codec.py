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


def test_fingerprint_of_null_is_the_spec_test_vector() -> None:
    # Avro specification, "Single-object encoding": the fingerprint of "null" and its bytes.
    fingerprint = schema_fingerprint("null")
    assert fingerprint == bytes([0x8A, 0x8F, 0x25, 0xCC, 0xE7, 0x24, 0xDD, 0x63])
    assert int.from_bytes(fingerprint, "little") == 7195948357588979594


def _legacy(data: bytes) -> bytes:
    """``data`` with its fingerprint byte-reversed, as earlier effectlog versions wrote it."""
    return data[:2] + data[2:10][::-1] + data[10:]


def test_records_are_written_in_the_spec_byte_order_and_are_not_legacy() -> None:
    codec = event_codec()
    data = codec.encode(_event().to_record())
    assert data[2:10] == codec.fingerprint and data[2:10] not in codec.legacy_fingerprints
    assert not codec.is_legacy(data)


def test_byte_reversed_fingerprint_is_still_read_and_flagged_legacy() -> None:
    event = _event()
    data = _legacy(event_codec().encode(event.to_record()))
    assert event_codec().is_legacy(data)
    assert EffectEvent.from_record(event_codec().decode(data)) == event


def test_legacy_command_is_still_read() -> None:
    record = {"command_id": "c1", "idempotency_key": "agent:op:k:t", "kind": "k", "target": "t",
              "observed_state": "UNKNOWN", "observed_epoch": 2, "observed_at": 5, "issued_at": 9,
              "attempt": 1, "reason": "stuck", "payload_ref": None}
    data = _legacy(command_codec().encode(record))
    assert command_codec().is_legacy(data)
    assert command_codec().decode(data)["observed_epoch"] == 2


def test_v1_record_in_the_legacy_order_is_resolved_to_the_current_schema() -> None:
    v1 = json.loads((FIXTURES / "effect_event.v1.avsc").read_text())
    record = {k: v for k, v in _event().to_record().items()
              if k not in ("event_id", "payload_ref", "approval")}
    reader = Codec(load_schema_text("effect_event.v2.avsc"), older=[v1])
    data = _legacy(Codec(v1).encode(record))
    assert reader.is_legacy(data)
    assert reader.decode(data)["approval"] is None


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
