"""The effect state machine: one table of legal transitions, fencing and binding checks.

Pure functions shared by the writer (refuses before appending) and the projector (rejects
what still reaches the log), so both judge an event the same way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from effectlog.errors import (
    Conflict,
    ExpiresAnother,
    Fenced,
    IllegalTransition,
    InvalidInput,
    NotSettled,
    PayloadMismatch,
)
from effectlog.keys import MAX_FENCING_EPOCH, canonical_payload, make_key
from effectlog.log.base import PURGED
from effectlog.model import (
    Approval,
    Decision,
    EffectEvent,
    Outcome,
    State,
    Transition,
    now_ms,
)

S, T = State, Transition

#: The version of the rules below. Raise it with any change that could judge a record of an
#: existing log differently: a judge (``effectlog serve``) refuses to judge the writes of a
#: writer whose rules version differs (see :mod:`effectlog.judge.premises`).
RULES_VERSION = 2  # 2: one DISPATCH per claim (a DISPATCH from DISPATCHED/UNKNOWN needs a
#                     CLAIM); epochs up to MAX_FENCING_EPOCH (a claim above it would overflow)
_RECORDED = frozenset({S.SUCCEEDED, S.FAILED})

#: (state before, transition) -> states allowed after. ``None`` is "no event yet".
LEGAL: dict[tuple[State | None, Transition], frozenset[State]] = {
    (None, T.CREATE): frozenset({S.CREATED}),
    (S.CREATED, T.RESERVE): frozenset({S.RESERVED}),
    (S.RESERVED, T.CLAIM): frozenset({S.RESERVED}),
    (S.DISPATCHED, T.CLAIM): frozenset({S.DISPATCHED}),
    (S.UNKNOWN, T.CLAIM): frozenset({S.UNKNOWN}),
    (S.AWAITING_APPROVAL, T.CLAIM): frozenset({S.AWAITING_APPROVAL}),
    (S.RESERVED, T.DISPATCH): frozenset({S.DISPATCHED}),
    (S.DISPATCHED, T.DISPATCH): frozenset({S.DISPATCHED}),
    (S.UNKNOWN, T.DISPATCH): frozenset({S.DISPATCHED}),
    (S.RESERVED, T.RECORD): _RECORDED,
    (S.DISPATCHED, T.RECORD): _RECORDED,
    (S.UNKNOWN, T.RECORD): _RECORDED,
    (S.AWAITING_APPROVAL, T.RECORD): _RECORDED,
    (S.DISPATCHED, T.UNKNOWN): frozenset({S.UNKNOWN}),
    (S.UNKNOWN, T.AWAIT_APPROVAL): frozenset({S.AWAITING_APPROVAL}),
    (S.UNKNOWN, T.APPROVE): frozenset({S.RESERVED, S.ABANDONED}),
    (S.AWAITING_APPROVAL, T.APPROVE): frozenset({S.RESERVED, S.ABANDONED}),
}

#: States no transition leaves: the effect is over, and may expire (see :func:`check_expiry`).
SETTLED = frozenset({S.SUCCEEDED, S.FAILED, S.ABANDONED})

#: Transitions that take a new fencing epoch (and with it, ownership of the key).
CLAIMING = frozenset({T.RESERVE, T.CLAIM, T.APPROVE})

DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024


def legal_next_states(state: State | None, transition: Transition) -> frozenset[State]:
    """States ``transition`` may lead to from ``state``; empty when it is illegal."""
    return LEGAL.get((state, transition), frozenset())


def check(current: EffectEvent | None, event: EffectEvent) -> None:
    """Raise a :class:`Conflict` subclass if ``event`` may not follow ``current``."""
    check_binding(current, event)
    before = current.state if current else None
    allowed = legal_next_states(before, event.transition)
    if event.state not in allowed:
        name = before.value if before else "nothing"
        raise IllegalTransition(
            f"{event.transition.value} from {name} to {event.state.value} is not allowed "
            f"for {event.idempotency_key}")
    _check_details(current, event)
    _check_epoch(current, event)


def check_expiry(current: EffectEvent | None, key: str, of: str | None = None) -> None:
    """Raise :class:`NotSettled` unless ``current`` may expire: an expiry (a tombstone on
    the log) removes a settled key, whose state no transition can change, so the key used
    again is a new effect. An open or unknown key is never removed. A purge mark
    (``of`` is :data:`~effectlog.log.base.PURGED`) removes whatever the key holds: the records
    of it a reader may have applied were deleted after their tombstone was accepted, and a
    full replay has the key absent there. A tombstone naming the
    effect it expires (``of``: the event id of its last accepted event) removes that effect
    only: :class:`ExpiresAnother` when the key holds another one (two expirers raced, the
    key was used again between their tombstones)."""
    if of == PURGED:
        return  # every earlier record of the key is gone: nothing of it is left here
    if current is None:
        raise NotSettled(f"expiry of {key}: no such effect")
    if current.state not in SETTLED:
        raise NotSettled(f"expiry of {key}: it is {current.state.value}, not settled")
    if of is not None and current.event_id != of:
        raise ExpiresAnother(f"expiry of {key}: it expires the effect whose last event is {of}, "
                             f"but the key holds another (last event {current.event_id}): "
                             "it expired and was used again since")


def check_binding(current: EffectEvent | None, event: EffectEvent) -> None:
    """The key matches its operation, kind and target, and (with ``current``) the original
    payload; a repeated event id is a duplicate delivery."""
    if current is None or event.idempotency_key != current.idempotency_key:
        expected = make_key(event.operation_id, event.kind, event.target)
        if event.idempotency_key != expected:
            raise PayloadMismatch(f"key {event.idempotency_key!r} does not match its "
                                  f"operation, kind and target ({expected!r})")
    if current is None:
        return
    for name in ("operation_id", "kind", "target", "payload_hash"):
        if getattr(current, name) != getattr(event, name):
            raise PayloadMismatch(f"{name} differs from the original under key "
                                  f"{event.idempotency_key}")
    if current.event_id == event.event_id:
        raise Conflict(f"duplicate delivery of event {event.event_id}")


def _check_details(current: EffectEvent | None, event: EffectEvent) -> None:
    if event.transition is T.CREATE:
        if event.fencing_epoch != 0 or event.attempt != 0:
            raise IllegalTransition("a create event starts at epoch 0 and attempt 0")
        if event.payload is not None and payload_hash_of_bytes(event.payload) != event.payload_hash:
            raise PayloadMismatch("payload bytes do not match payload_hash")
        return
    assert current is not None
    if event.created_at != current.created_at or event.payload_ref != current.payload_ref:
        raise IllegalTransition("created_at and payload_ref are fixed at creation")
    step = 1 if event.transition is T.DISPATCH else 0
    if event.attempt != current.attempt + step:
        raise IllegalTransition(f"attempt {event.attempt} does not follow {current.attempt}")
    if event.transition is T.DISPATCH and current.state is not S.RESERVED \
            and current.transition is not T.CLAIM:
        # one DISPATCH per claim: whoever dispatches again (after a crash, a timeout, an
        # UNKNOWN) claims the key first, so the provider sees a new fencing epoch
        raise IllegalTransition(
            f"a second dispatch of epoch {current.fencing_epoch} of {event.idempotency_key} "
            f"(it is {current.state.value}): dispatching again needs a claim first")
    if event.transition is T.RECORD and (event.outcome is None
                                         or event.outcome.status is not event.state):
        raise IllegalTransition("a record event needs an outcome matching its state")
    if event.transition is T.APPROVE:
        if event.approval is None:
            raise IllegalTransition("an approve event needs a decision")
        wanted = S.RESERVED if event.approval.decision is Decision.RETRY else S.ABANDONED
        if event.state is not wanted:
            raise IllegalTransition(f"decision {event.approval.decision.value} leads to {wanted.value}")


def _check_epoch(current: EffectEvent | None, event: EffectEvent) -> None:
    if event.fencing_epoch > MAX_FENCING_EPOCH:
        raise IllegalTransition(f"epoch {event.fencing_epoch} of {event.idempotency_key} is "
                                f"above the highest one, {MAX_FENCING_EPOCH}")
    if current is None:
        return
    if event.transition in CLAIMING:
        if event.fencing_epoch <= current.fencing_epoch:
            raise Fenced(f"epoch {event.fencing_epoch} is not above the current epoch "
                         f"{current.fencing_epoch} of {event.idempotency_key}", "stale_epoch")
        return
    if event.fencing_epoch < current.fencing_epoch:
        raise Fenced(f"epoch {event.fencing_epoch} is stale: {event.idempotency_key} is at "
                     f"epoch {current.fencing_epoch}", "stale_epoch")
    if event.fencing_epoch > current.fencing_epoch:
        raise Fenced(f"epoch {event.fencing_epoch} was never claimed for "
                     f"{event.idempotency_key}", "unclaimed_epoch")
    if event.worker_id != current.worker_id:
        raise Fenced(f"epoch {event.fencing_epoch} of {event.idempotency_key} is owned by "
                     f"{current.worker_id}, not {event.worker_id}", "foreign_owner")


def payload_hash_of_bytes(data: bytes) -> str:
    """sha256 hex of payload bytes already in canonical form."""
    return hashlib.sha256(data).hexdigest()


def fold(events: Iterable[EffectEvent | Expiry]) -> tuple[EffectEvent | None,
                                                         list[tuple[EffectEvent | Expiry, Conflict]]]:
    """Apply events in log order: the accepted snapshot and the rejected events with why.
    An :class:`Expiry` (a tombstone) removes a settled key."""
    current: EffectEvent | None = None
    rejected: list[tuple[EffectEvent | Expiry, Conflict]] = []
    for event in events:
        try:
            if isinstance(event, Expiry):
                check_expiry(current, event.key, event.of)
                current = None
                continue
            check(current, event)
        except Conflict as exc:
            rejected.append((event, exc))
            continue
        current = event
    return current, rejected


@dataclass(frozen=True, slots=True)
class Expiry:
    """A tombstone of ``key`` read from the log (a record without a value); ``of`` is the
    effect it expires, when it names one (see :func:`check_expiry`)."""

    key: str
    of: str | None = None


def new_effect(operation_id: str, kind: str, target: str, payload: Any, worker_id: str, *,
               payload_ref: str | None = None,
               max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> EffectEvent:
    """The create event of a new effect; the canonical payload travels unless a ref is given."""
    key = make_key(operation_id, kind, target)
    body = canonical_payload(payload)
    digest = payload_hash_of_bytes(body)
    if payload_ref is None and len(body) > max_payload_bytes:
        raise InvalidInput(f"payload is {len(body)} bytes, over the {max_payload_bytes}-byte "
                           "limit: pass a payload_ref instead")
    if not worker_id or not isinstance(worker_id, str):
        raise InvalidInput("worker_id must be a non-empty string")
    stamp = now_ms()
    event = EffectEvent(
        idempotency_key=key, operation_id=operation_id, kind=kind, target=target,
        payload_hash=digest, transition=T.CREATE, state=S.CREATED,
        fencing_epoch=0, worker_id=worker_id, attempt=0, created_at=stamp, occurred_at=stamp,
        payload=None if payload_ref else body, payload_ref=payload_ref,
    )
    return event  # legal by construction: check(None, event) passes (pinned by a test)


def advance(current: EffectEvent, transition: Transition, worker_id: str, *,
            state: State | None = None, epoch: int | None = None,
            outcome: Outcome | None = None, error: str | None = None,
            approval: Approval | None = None) -> EffectEvent:
    """The checked next event of ``current``; claiming transitions take ``epoch`` or epoch+1."""
    if state is None:
        state = _default_state(current.state, transition, outcome, approval)
    if epoch is None:
        epoch = current.fencing_epoch + 1 if transition in CLAIMING else current.fencing_epoch
    step = 1 if transition is T.DISPATCH else 0
    event = current.next(transition, state, fencing_epoch=epoch, worker_id=worker_id,
                         attempt=current.attempt + step, outcome=outcome, error=error,
                         approval=approval)
    check(current, event)
    return event


def _default_state(state: State, transition: Transition, outcome: Outcome | None,
                   approval: Approval | None) -> State:
    if transition is T.RECORD and outcome is not None:
        return outcome.status
    if transition is T.APPROVE and approval is not None:
        return S.RESERVED if approval.decision is Decision.RETRY else S.ABANDONED
    allowed = legal_next_states(state, transition)
    if len(allowed) != 1:
        raise IllegalTransition(f"{transition.value} is not allowed from {state.value}")
    return next(iter(allowed))
