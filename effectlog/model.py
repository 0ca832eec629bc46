"""The effect event: one transition plus the full state snapshot of its key (pure, no I/O)."""

from __future__ import annotations

import itertools
import json
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from effectlog.errors import InvalidInput


class State(StrEnum):
    """Where an effect stands after its latest accepted transition."""

    CREATED = "CREATED"
    RESERVED = "RESERVED"
    DISPATCHED = "DISPATCHED"
    UNKNOWN = "UNKNOWN"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.ABANDONED})
STUCK = frozenset({State.RESERVED, State.DISPATCHED, State.UNKNOWN})


class Transition(StrEnum):
    """The event names; each appended event is exactly one of these."""

    CREATE = "CREATE"
    RESERVE = "RESERVE"
    CLAIM = "CLAIM"
    DISPATCH = "DISPATCH"
    RECORD = "RECORD"
    UNKNOWN = "UNKNOWN"
    AWAIT_APPROVAL = "AWAIT_APPROVAL"
    APPROVE = "APPROVE"

    @classmethod
    def parse(cls, name: str) -> Transition:
        """Accept ``dispatch`` or ``DISPATCH``; raise ValueError for anything else."""
        return cls(name.strip().upper())


class Decision(StrEnum):
    RETRY = "RETRY"
    ABANDON = "ABANDON"


def now_ms() -> int:
    return int(time.time() * 1000)


class _EventIds:
    """Event ids unique by construction: a random 64-bit prefix per process (drawn again in
    a forked child) and a counter. Cheaper than ``uuid4``, and unlike ``os.urandom`` per id
    it never gives up the GIL, which a process with many worker threads pays for."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()


_IDS = _EventIds()
os.register_at_fork(after_in_child=_IDS.reset)


def new_event_id() -> str:
    """A fresh event id: 32 hex digits (the shape of a uuid4 hex)."""
    return f"{_IDS.prefix}{next(_IDS.counter):016x}"


#: Who learned an outcome, as ``Outcome.source`` says it: the worker from its own provider
#: call, the reconciler from a provider lookup, or the reconciler from its own re-dispatch.
WORKER, LOOKUP, REDISPATCH = "worker", "lookup", "redispatch"
_RECORDED_BY = {WORKER: "worker", LOOKUP: "reconciler: lookup",
                REDISPATCH: "reconciler: re-dispatch"}


def recorded_by(source: str | None) -> str:
    """How history, ``get`` and the console name an outcome's source (``worker``,
    ``reconciler: lookup``, ``reconciler: re-dispatch``; another value as it is)."""
    return _RECORDED_BY.get(source or WORKER, str(source))


@dataclass(frozen=True, slots=True)
class Outcome:
    """A recorded provider result; ``source`` says who learned it (:data:`WORKER`,
    :data:`LOOKUP` or :data:`REDISPATCH`, see :func:`recorded_by`)."""

    status: State  # SUCCEEDED or FAILED
    result: Any = None
    source: str = WORKER

    def to_record(self) -> dict[str, Any]:
        try:
            result = json.dumps(self.result, sort_keys=True, separators=(",", ":"),
                                allow_nan=False)
        except RecursionError:
            raise InvalidInput("outcome.result is nested too deeply") from None
        except (TypeError, ValueError) as exc:  # NaN, Infinity, a value JSON has no form for
            raise InvalidInput(f"outcome.result is not JSON: {exc}") from None
        return {"status": self.status.value, "result_json": result, "source": self.source}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Outcome:
        return cls(State(rec["status"]), json.loads(rec["result_json"]), rec.get("source", "worker"))


@dataclass(frozen=True, slots=True)
class Approval:
    """A human or policy decision on an effect awaiting approval."""

    decision: Decision
    by: str
    reason: str
    at: int = field(default_factory=now_ms)


@dataclass(frozen=True, slots=True)
class EffectEvent:
    """One transition of one effect and the key's full snapshot after it."""

    idempotency_key: str
    operation_id: str
    kind: str
    target: str
    payload_hash: str
    transition: Transition
    state: State
    fencing_epoch: int
    worker_id: str
    attempt: int
    created_at: int
    occurred_at: int
    payload: bytes | None = None
    payload_ref: str | None = None
    outcome: Outcome | None = None
    error: str | None = None
    approval: Approval | None = None
    event_id: str = field(default_factory=new_event_id)

    def next(self, transition: Transition, state: State, *, fencing_epoch: int | None = None,
             worker_id: str | None = None, attempt: int | None = None,
             outcome: Outcome | None = None, error: str | None = None,
             approval: Approval | None = None) -> EffectEvent:
        """The following event of the same key: new id and time, payload bytes dropped.

        Epoch, worker, attempt, outcome and approval carry over unless given; error does not.
        """
        return EffectEvent(
            self.idempotency_key, self.operation_id, self.kind, self.target, self.payload_hash,
            transition, state, self.fencing_epoch if fencing_epoch is None else fencing_epoch,
            worker_id or self.worker_id, self.attempt if attempt is None else attempt,
            self.created_at, now_ms(), None, self.payload_ref, outcome or self.outcome, error,
            approval or self.approval, new_event_id())

    def to_record(self) -> dict[str, Any]:
        """The Avro record dict of this event."""
        approval = self.approval
        return {
            "event_id": self.event_id, "idempotency_key": self.idempotency_key,
            "operation_id": self.operation_id, "kind": self.kind, "target": self.target,
            "payload_hash": self.payload_hash, "payload": self.payload,
            "payload_ref": self.payload_ref, "transition": self.transition.value,
            "state": self.state.value, "fencing_epoch": self.fencing_epoch,
            "worker_id": self.worker_id, "attempt": self.attempt,
            "created_at": self.created_at, "occurred_at": self.occurred_at,
            "outcome": self.outcome.to_record() if self.outcome else None,
            "error": self.error,
            "approval": None if approval is None else {
                "decision": approval.decision.value, "by": approval.by,
                "reason": approval.reason, "at": approval.at},
        }

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> EffectEvent:
        """Build from a decoded Avro record (timestamps may arrive as datetimes)."""
        approval = rec.get("approval")
        outcome = rec.get("outcome")
        return cls(
            idempotency_key=rec["idempotency_key"], operation_id=rec["operation_id"],
            kind=rec["kind"], target=rec["target"], payload_hash=rec["payload_hash"],
            transition=Transition(rec["transition"]), state=State(rec["state"]),
            fencing_epoch=int(rec["fencing_epoch"]), worker_id=rec["worker_id"],
            attempt=int(rec["attempt"]), created_at=_ms(rec["created_at"]),
            occurred_at=_ms(rec["occurred_at"]), payload=rec.get("payload"),
            payload_ref=rec.get("payload_ref"),
            outcome=Outcome.from_record(outcome) if outcome else None,
            error=rec.get("error"),
            approval=Approval(Decision(approval["decision"]), approval["by"], approval["reason"],
                              _ms(approval["at"])) if approval else None,
            event_id=rec.get("event_id") or f"v1:{rec['idempotency_key']}:{_ms(rec['occurred_at'])}",
        )

    @classmethod
    def from_json(cls, view: dict[str, Any]) -> EffectEvent:
        """Build from :meth:`to_json`'s shape (what ``get --json`` and the query API show);
        the payload is re-encoded canonically (its hash is in ``payload_hash``)."""
        rec = dict(view)
        payload = rec.get("payload")
        rec["payload"] = None if payload is None else json.dumps(
            payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        outcome = rec.get("outcome")
        if outcome is not None:
            rec["outcome"] = {"status": outcome["status"], "source": outcome.get("source", "worker"),
                              "result_json": json.dumps(outcome.get("result"), sort_keys=True,
                                                        separators=(",", ":"))}
        return cls.from_record(rec)

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view (payload bytes shown as text when they are UTF-8 JSON)."""
        out = self.to_record()
        if self.payload is not None:
            out["payload"] = json.loads(self.payload.decode("utf-8"))
        if self.outcome is not None:
            out["outcome"] = {"status": self.outcome.status.value, "result": self.outcome.result,
                              "source": self.outcome.source}
        return out


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _ms(value: int | datetime) -> int:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return (value - _EPOCH) // timedelta(milliseconds=1)
    return int(value)
