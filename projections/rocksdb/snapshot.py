"""Byte encodings of the projection's column families.

The state CF holds each key's snapshot as compact JSON (a positional list), so a reader
can print it without importing fastavro or building the model. Index keys sort by state,
then last-transition time (big-endian ms), then key, so "DISPATCHED older than T" is one
range. This module imports :mod:`effectlog.model` only when a snapshot becomes an event.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from effectlog.model import EffectEvent

FORMAT = 1
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_SEP = b"\x00"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


# -- state CF --------------------------------------------------------------------------------
# A snapshot is ``[FORMAT, *fields]``: the event's plain-value fields (see
# projections.fastevent.Fields) with the payload bytes in base64.

_PAYLOAD_AT = 13  # index of the payload in a snapshot list


def encode_snapshot(e: EffectEvent) -> bytes:
    """The snapshot of ``e`` as compact JSON bytes (deterministic for equal events)."""
    outcome = e.outcome
    approval = e.approval
    return _dumps([
        FORMAT, e.idempotency_key, e.operation_id, e.kind, e.target, e.payload_hash,
        e.transition.value, e.state.value, e.fencing_epoch, e.worker_id, e.attempt,
        e.created_at, e.occurred_at,
        None if e.payload is None else base64.b64encode(e.payload).decode("ascii"),
        e.payload_ref,
        None if outcome is None else [outcome.status.value, outcome.result, outcome.source],
        e.error,
        None if approval is None else [
            approval.decision.value, approval.by, approval.reason, approval.at],
        e.event_id,
    ]).encode("utf-8")


def snapshot_from_fields(fields: Sequence[Any]) -> bytes:
    """:func:`encode_snapshot` of ``event_from_fields(fields)``, without building the event
    (the decoder process makes it while the projector judges another batch)."""
    payload = fields[_PAYLOAD_AT - 1]
    if payload is not None:
        fields = [*fields[:_PAYLOAD_AT - 1], base64.b64encode(payload).decode("ascii"),
                  *fields[_PAYLOAD_AT:]]
    return _dumps([FORMAT, *fields]).encode("utf-8")


def decode_snapshot(raw: bytes) -> EffectEvent:
    """The event stored by :func:`encode_snapshot`."""
    from projections.fastevent import event_from_fields

    values = _load(raw)
    if values[_PAYLOAD_AT] is not None:
        values[_PAYLOAD_AT] = base64.b64decode(values[_PAYLOAD_AT])
    return event_from_fields(values[1:])


def snapshot_json(raw: bytes) -> dict[str, Any]:
    """The JSON view of a stored snapshot, shaped like ``EffectEvent.to_json()``.

    Needs neither fastavro nor the model: this is what ``effectlog get --json`` prints.
    Payload bytes that are not UTF-8 JSON are shown as ``{"base64": ...}``.
    """
    (_, key, operation_id, kind, target, p_hash, transition, state, epoch, worker_id, attempt,
     created_at, occurred_at, payload, payload_ref, outcome, error, approval,
     event_id) = _load(raw)
    shown: Any = None
    if payload is not None:
        try:
            shown = json.loads(base64.b64decode(payload).decode("utf-8"))
        except ValueError:
            shown = {"base64": payload}
    return {
        "event_id": event_id, "idempotency_key": key, "operation_id": operation_id,
        "kind": kind, "target": target, "payload_hash": p_hash, "payload": shown,
        "payload_ref": payload_ref, "transition": transition, "state": state,
        "fencing_epoch": epoch, "worker_id": worker_id, "attempt": attempt,
        "created_at": created_at, "occurred_at": occurred_at,
        "outcome": None if outcome is None else {
            "status": outcome[0], "result": outcome[1], "source": outcome[2]},
        "error": error,
        "approval": None if approval is None else {
            "decision": approval[0], "by": approval[1], "reason": approval[2], "at": approval[3]},
    }


def _load(raw: bytes) -> list[Any]:
    values = json.loads(raw)
    if not isinstance(values, list) or not values or values[0] != FORMAT:
        raise ValueError(f"not a projection snapshot of format {FORMAT}")
    return values


# -- index CF --------------------------------------------------------------------------------

def index_prefix(state: str) -> bytes:
    """``STATE \\0``: where the index entries of ``state`` start; an entry is the prefix,
    the last-transition time (8 bytes, big-endian ms) and the key."""
    return state.encode("ascii") + _SEP


def index_range(state: str, before_ms: int | None) -> tuple[bytes, bytes]:
    """[lower, upper) of the index entries of ``state`` older than ``before_ms``."""
    prefix = state.encode("ascii") + _SEP
    upper = prefix + _U64.pack(max(before_ms, 0)) if before_ms is not None else \
        state.encode("ascii") + b"\x01"
    return prefix, upper


# -- offsets, counters, rejected -------------------------------------------------------------

def offset_key(partition: int) -> bytes:
    return _U32.pack(partition)


pack_u64: Callable[[int], bytes] = _U64.pack


def unpack_u64(raw: bytes) -> int:
    return int(_U64.unpack(raw)[0])


def pack_i64(value: int) -> bytes:
    return _I64.pack(value)


def unpack_i64(raw: bytes) -> int:
    return int(_I64.unpack(raw)[0])


def rejected_key(offset: int) -> bytes:
    return _U64.pack(offset)


def encode_rejection(partition: int, offset: int, key: str, reason: str, detail: str,
                     raw: bytes, at_ms: int) -> bytes:
    """A JSON header line, then the record's raw bytes unchanged."""
    head = _dumps({"partition": partition, "offset": offset, "key": key, "reason": reason,
                   "detail": detail[:2000], "at_ms": at_ms})
    return head.encode("utf-8") + b"\n" + raw


def decode_rejection(value: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, raw bytes) of a stored rejection."""
    head, _, raw = value.partition(b"\n")
    return dict(json.loads(head)), raw
