"""Byte encodings of the projection's column families.

The state CF holds each key's snapshot as compact JSON (a positional list), so a reader
can print it without importing fastavro or building the model. Besides the event's fields a
snapshot keeps the log's own time of its record (``logged_at``: the broker's append time on
Kafka, the insertion time on SQLite) and the positions of the key's accepted events
(``accepted``: ``[offset, event_id]`` pairs, oldest first), so one read of one key says which
of its events the projector accepted. The state CF also holds the partition's applied offset
(:data:`APPLIED_KEY`), so one RocksDB snapshot of that family reads a key and how far the
projection reaches, consistently. Index keys sort by state, then ``logged_at`` (big-endian
ms), then key, so "DISPATCHED older than T" is one range. This module imports
:mod:`effectlog.model` only when a snapshot becomes an event.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from effectlog.model import EffectEvent

FORMAT = 2
_FORMATS = (1, 2)  # format 1 (no logged_at, no accepted list) is still read
#: The state CF's key of the partition's applied offset (idempotency keys never hold NUL).
APPLIED_KEY = b"\x00applied"
#: Accepted events remembered per key (the oldest are dropped beyond it).
MAX_ACCEPTED = 256
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")
_SEP = b"\x00"
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_dumps_ascii = json.JSONEncoder(separators=(",", ":")).encode


def _encoded(values: Any) -> bytes:
    """``values`` as UTF-8 JSON; escaped to ASCII when a string holds a lone surrogate (a
    record can carry one: JSON allows "\\ud800"), so no record on the log stops a projector."""
    text = _dumps(values)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _dumps_ascii(values).encode("ascii")


# -- state CF --------------------------------------------------------------------------------
# A snapshot is ``[FORMAT, *fields, logged_at, accepted]``: the event's plain-value fields
# (see projections.fastevent.Fields) with the payload bytes in base64.

_PAYLOAD_AT = 13  # index of the payload in a snapshot list
_FIELDS = 18
Accepted = tuple[tuple[int, str], ...]


class Stored(NamedTuple):
    """A decoded snapshot: the key's latest accepted event, the log time of its record, and
    the (offset, event id) of every accepted event of the key kept so far."""

    event: EffectEvent
    logged_at: int
    accepted: Accepted


def with_accepted(accepted: Accepted, offset: int, event_id: str) -> Accepted:
    """``accepted`` with one more accepted event (the oldest dropped past MAX_ACCEPTED)."""
    grown = (*accepted, (offset, event_id))
    return grown[-MAX_ACCEPTED:] if len(grown) > MAX_ACCEPTED else grown


def encode_snapshot(e: EffectEvent, logged_at: int | None = None,
                    accepted: Accepted = ()) -> bytes:
    """The snapshot of ``e`` as compact JSON bytes (deterministic for equal arguments);
    ``logged_at`` defaults to the event's own time."""
    outcome = e.outcome
    approval = e.approval
    return _encoded([
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
        e.occurred_at if logged_at is None else logged_at,
        [list(pair) for pair in accepted],
    ])


def snapshot_from_fields(fields: Sequence[Any], logged_at: int, accepted: Accepted) -> bytes:
    """:func:`encode_snapshot` of ``event_from_fields(fields)``, without building the event
    (the decoder process makes it while the projector judges another batch)."""
    payload = fields[_PAYLOAD_AT - 1]
    if payload is not None:
        fields = [*fields[:_PAYLOAD_AT - 1], base64.b64encode(payload).decode("ascii"),
                  *fields[_PAYLOAD_AT:]]
    return _encoded([FORMAT, *fields, logged_at, [list(pair) for pair in accepted]])


def decode_stored(raw: bytes) -> Stored:
    """The event, log time and accepted positions stored by :func:`encode_snapshot`."""
    from projections.fastevent import event_from_fields

    values = _load(raw)
    if values[_PAYLOAD_AT] is not None:
        values[_PAYLOAD_AT] = base64.b64decode(values[_PAYLOAD_AT])
    event = event_from_fields(values[1:_FIELDS + 1])
    if values[0] == 1:
        return Stored(event, event.occurred_at, ())
    return Stored(event, int(values[_FIELDS + 1]),
                  tuple((int(o), str(i)) for o, i in values[_FIELDS + 2]))


def decode_snapshot(raw: bytes) -> EffectEvent:
    """The event stored by :func:`encode_snapshot`."""
    return decode_stored(raw).event


def snapshot_json(raw: bytes) -> dict[str, Any]:
    """The JSON view of a stored snapshot, shaped like ``EffectEvent.to_json()``.

    Needs neither fastavro nor the model: this is what ``effectlog get --json`` prints, with
    ``logged_at``, the log's own time of the record (what "stuck for 5 minutes" is measured
    from). Payload bytes that are not UTF-8 JSON are shown as ``{"base64": ...}``.
    """
    values = _load(raw)
    (_, key, operation_id, kind, target, p_hash, transition, state, epoch, worker_id, attempt,
     created_at, occurred_at, payload, payload_ref, outcome, error, approval,
     event_id) = values[:_FIELDS + 1]
    logged_at = occurred_at if values[0] == 1 else values[_FIELDS + 1]
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
        "logged_at": logged_at,
    }


def _load(raw: bytes) -> list[Any]:
    values = json.loads(raw)
    if not isinstance(values, list) or not values or values[0] not in _FORMATS:
        raise ValueError(f"not a projection snapshot of format {FORMAT}")
    return values


# -- index CF --------------------------------------------------------------------------------

def index_prefix(state: str) -> bytes:
    """``STATE \\0``: where the index entries of ``state`` start; an entry is the prefix,
    the last-transition time (8 bytes, big-endian ms) and the key."""
    return state.encode("ascii") + _SEP


def index_entry(raw: bytes, key: bytes) -> bytes:
    """The index entry of a stored snapshot ``raw`` of ``key``: its state, log time, key."""
    values = _load(bytes(raw))
    logged_at = values[_PAYLOAD_AT - 1] if values[0] == 1 else values[_FIELDS + 1]  # format 1: occurred_at
    return index_prefix(str(values[7])) + _U64.pack(max(int(logged_at), 0)) + key


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
    head = _encoded({"partition": partition, "offset": offset, "key": key, "reason": reason,
                     "detail": detail[:2000], "at_ms": at_ms})
    return head + b"\n" + raw


def decode_rejection(value: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, raw bytes) of a stored rejection."""
    head, _, raw = value.partition(b"\n")
    return dict(json.loads(head)), raw
