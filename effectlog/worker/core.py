"""The worker's I/O-free core: what to write next, and what a refused write means.

Every operation is a generator in the sans-I/O style: it yields the reads, appends and
questions it needs as small request objects and is sent their answers, so the sync shell
(:class:`~effectlog.worker.Worker`) and the async one (:class:`~effectlog.worker.AsyncWorker`)
share it. How a key's state is learned and a write is judged is the write strategy's
(:mod:`.writes`): a write returns only once accepted, and :meth:`WorkerCore.begin` returns a
DISPATCHED event only when the judge accepted this worker's own DISPATCH, which is when the
provider may be called. A timeout or crash never becomes FAILED: what a worker cannot confirm
is UNKNOWN, and an effect found in doubt raises :class:`EffectInDoubt`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from effectlog.codec import Codec, event_codec
from effectlog.errors import (
    BackendUnavailable,
    Conflict,
    Fenced,
    IllegalTransition,
    InvalidInput,
    NotFound,
)
from effectlog.keys import validate_fencing_epoch
from effectlog.log.base import Position
from effectlog.machine import CLAIMING, DEFAULT_MAX_PAYLOAD_BYTES, advance, check_binding, new_effect
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State, Transition
from effectlog.text import check_free_text
from effectlog.worker.requests import Steps
from effectlog.worker.writes import Refused, Writes

logger = logging.getLogger("effectlog.worker")

T = Transition
MAX_WORKER_ID = 200
RACE_RETRIES = 5
OPEN_FOR_DISPATCH = frozenset({State.CREATED, State.RESERVED})
FINISHED = frozenset({State.SUCCEEDED, State.FAILED, State.ABANDONED})


class EffectInDoubt(Conflict):
    """The effect may already have happened (DISPATCHED, UNKNOWN or awaiting approval):
    it is left to recovery and reconciliation, never re-run blindly."""

    reason = "in_doubt"

    def __init__(self, event: EffectEvent) -> None:
        super().__init__(f"{event.idempotency_key} is {event.state.value}: "
                         "left to recovery, not re-run")
        self.event = event

    @property
    def key(self) -> str:
        """The idempotency key of the effect in doubt."""
        return self.event.idempotency_key


class LateVerdict(EffectInDoubt):
    """The verdict on this worker's own DISPATCH came too long after it began writing it:
    recovery may already be acting on the effect (its deadline runs on the log's time), so
    the provider is not called; the effect stays DISPATCHED and is left to recovery."""

    def __init__(self, event: EffectEvent, took_s: float, within_s: float) -> None:
        super().__init__(event)
        self.args = (f"{event.idempotency_key}: the verdict on its DISPATCH came {took_s:.1f}s "
                     f"after the write began (more than {within_s:g}s): not called, left to "
                     "recovery",)


@dataclass(frozen=True, slots=True)
class Appended:
    """An accepted event and where it sits in the log."""

    event: EffectEvent
    position: Position


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class WorkerCore:
    """Transitions and bookkeeping for one worker identity, over one write strategy."""

    def __init__(self, worker_id: str, writes: Writes, *,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 codec: Codec | None = None, call_within_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.worker_id = check_free_text("worker_id", worker_id, max_chars=MAX_WORKER_ID)
        self.writes = writes
        self.call_within_s = call_within_s
        self._clock = clock
        self.max_payload_bytes = max_payload_bytes
        self.claimed: dict[str, int] = {}
        self.last_position: Position | None = None
        self.codec = codec or event_codec()  # what it writes with, and folds with

    # -- reads ---------------------------------------------------------------------------

    def load(self, key: str, fresh: bool = False) -> Steps[EffectEvent | None]:
        """The key's state (``fresh``: as the log has it now)."""
        return (yield from self.writes.state(key, fresh)).event

    # -- transitions ---------------------------------------------------------------------

    def new_effect(self, operation_id: str, kind: str, target: str, payload: Any,
                   payload_ref: str | None) -> EffectEvent:
        return new_effect(operation_id, kind, target, payload, self.worker_id,
                          payload_ref=payload_ref, max_payload_bytes=self.max_payload_bytes)

    def create(self, operation_id: str, kind: str, target: str, payload: Any,
               payload_ref: str | None) -> Steps[EffectEvent]:
        """Create the effect, or find it (same key and payload; else PayloadMismatch)."""
        event = self.new_effect(operation_id, kind, target, payload, payload_ref)
        key = event.idempotency_key
        known = yield from self.writes.state(key)
        existing = known.event
        if existing is None:
            try:
                yield from self._write(event)
                return event
            except Refused as lost:  # another delivery created it at the same moment
                existing = lost.current
                if existing is None:
                    raise Fenced(f"CREATE of {key} was refused ({lost.reason})",
                                 "lost_race") from None
        elif not known.confirmed and existing.state not in FINISHED:
            existing = (yield from self.writes.state(key, fresh=True)).event or existing
        check_binding(existing, event)
        return existing

    def reserve(self, key: str, epoch: int | None) -> Steps[EffectEvent]:
        """Own the key to dispatch it: RESERVE from CREATED, CLAIM from RESERVED (a worker
        that reserved and died before dispatching). A key already dispatched is in doubt:
        taking it over is recovery's (:meth:`claim`), never a worker's way to dispatch again."""
        _given_epoch(epoch)

        def reserve(current: EffectEvent) -> EffectEvent:
            if current.state in FINISHED:
                raise IllegalTransition(f"{key} is {current.state.value}: finished")
            if current.state not in OPEN_FOR_DISPATCH:
                raise EffectInDoubt(current)
            transition = T.RESERVE if current.state is State.CREATED else T.CLAIM
            return advance(current, transition, self.worker_id, epoch=epoch)

        return (yield from self._judged(key, reserve))

    def claim(self, key: str, epoch: int | None) -> Steps[EffectEvent]:
        """Take the key over with a new epoch from any open state, keeping the state: how
        recovery (or an operator) fences out whoever held it before acting on an effect in
        doubt."""
        _given_epoch(epoch)

        def claim(current: EffectEvent) -> EffectEvent:
            transition = T.RESERVE if current.state is State.CREATED else T.CLAIM
            return advance(current, transition, self.worker_id, epoch=epoch)

        return (yield from self._judged(key, claim))

    def step(self, key: str, transition: Transition, epoch: int | None, *,
             outcome: Outcome | None = None, error: str | None = None) -> Steps[EffectEvent]:
        """DISPATCH, RECORD, UNKNOWN or AWAIT_APPROVAL with this worker's epoch (built on its
        own accepted write when it has one: the RECORD after a provider call reads nothing).
        A DISPATCH accepted more than ``call_within_s`` after it began raises
        :class:`LateVerdict`, as in :meth:`begin`."""
        _given_epoch(epoch)
        began = self._clock()
        event = yield from self._judged(key, lambda current: advance(
            current, transition, self.worker_id, outcome=outcome, error=error,
            epoch=self.epoch(key, current, epoch)))
        if transition is T.DISPATCH:
            self._in_time(event, began)
        return event

    def record(self, key: str, status: State | str, result: Any, source: str,
               epoch: int | None) -> Steps[EffectEvent]:
        state = State(status.upper()) if isinstance(status, str) else status
        if state not in (State.SUCCEEDED, State.FAILED):
            raise IllegalTransition(f"an outcome is SUCCEEDED or FAILED, not {state.value}")
        return (yield from self.step(key, T.RECORD, epoch, outcome=Outcome(state, result, source)))

    def approve(self, key: str, decision: Decision | str, by: str,
                reason: str) -> Steps[EffectEvent]:
        choice = Decision(decision.upper()) if isinstance(decision, str) else decision
        if not by.strip() or not reason.strip():
            raise InvalidInput("an approval needs who decided (--by) and why (--reason)")
        check_free_text("--by", by, max_chars=MAX_WORKER_ID)
        check_free_text("--reason", reason)
        approval = Approval(choice, by, reason)
        return (yield from self._judged(key, lambda current: advance(
            current, T.APPROVE, self.worker_id, approval=approval)))

    def begin(self, operation_id: str, kind: str, target: str, payload: Any,
              payload_ref: str | None) -> Steps[tuple[EffectEvent, bool]]:
        """Create (or find), claim and dispatch the effect in one append.

        Returns the accepted DISPATCHED event (the provider may now be called), or the
        finished record with ``done``. CREATE, RESERVE and DISPATCH are three events written
        together: the judge accepts or refuses each on its own, and the call is made only
        when it accepted this worker's DISPATCH, which it can only on this worker's claim. A
        prefix left by a crash is what a crash between two separate appends leaves. A verdict
        that came more than ``call_within_s`` after the write began raises
        :class:`LateVerdict`: recovery's deadline may have passed meanwhile.
        """
        created = self.new_effect(operation_id, kind, target, payload, payload_ref)
        key = created.idempotency_key
        head = (yield from self.writes.state(key)).event
        current = False  # head is the key as of now (a fresh read, or the judge's answer)
        for _ in range(RACE_RETRIES):
            if head is not None:
                check_binding(head, created)
                if head.state in FINISHED:
                    return head, True
                if head.state not in OPEN_FOR_DISPATCH:
                    if not current:  # in doubt is said of the current state only
                        head, current = (yield from self.writes.state(key, fresh=True)).event, True
                        continue
                    raise EffectInDoubt(head)
            start = created if head is None else head
            claim = advance(start, T.RESERVE if start.state is State.CREATED else T.CLAIM,
                            self.worker_id)
            dispatched = advance(claim, T.DISPATCH, self.worker_id)
            group = (created, claim, dispatched) if head is None else (claim, dispatched)
            began = self._clock()
            try:
                yield from self._write(*group, atomic=False)
            except Refused as lost:  # another writer moved the key in between: judge again
                head, current = lost.current, True
                continue
            self._in_time(dispatched, began)
            return dispatched, False
        raise Fenced(f"dispatch of {key} kept losing to concurrent writers", "lost_race")

    def write(self, *events: EffectEvent) -> Steps[EffectEvent]:
        """Append already-checked events of one key as one append, all or none; raises
        :class:`Fenced` unless every one of them is accepted."""
        try:
            yield from self._write(*events)
        except Refused as lost:
            winner = lost.current
            owner = f" (now epoch {winner.fencing_epoch}, owner {winner.worker_id})" if winner else ""
            raise Fenced(f"{events[-1].transition.value} on {lost.key} lost to a concurrent "
                         f"writer{owner}: {lost.reason}", "lost_race") from None
        return events[-1]

    # -- internals -----------------------------------------------------------------------

    def _in_time(self, dispatched: EffectEvent, began: float) -> None:
        """Raise :class:`LateVerdict` when the verdict on ``dispatched`` came too late to
        call on (recovery may be acting on the effect already)."""
        took = self._clock() - began
        if self.call_within_s is not None and took > self.call_within_s:
            raise LateVerdict(dispatched, took, self.call_within_s)

    def _judged(self, key: str, build: Callable[[EffectEvent], EffectEvent]) -> Steps[EffectEvent]:
        """Write ``build(state)`` on the key's state until it is accepted. A write refused,
        or one the rules refuse on a state that may be behind the log, is built again on the
        key's current state, so it meets the refusal (or the success) a read first would
        have given."""
        known = yield from self.writes.state(key)
        current, confirmed = known.event, known.confirmed
        for _ in range(RACE_RETRIES):
            if current is None:
                if not confirmed:
                    current, confirmed = (yield from self.writes.state(key, fresh=True))
                    continue
                raise NotFound(f"no effect with key {key}")
            try:
                event = build(current)
            except Conflict:
                if confirmed:
                    raise
                current, confirmed = (yield from self.writes.state(key, fresh=True))
                continue
            try:
                yield from self._write(event)
            except Refused as lost:
                current, confirmed = lost.current, True
                continue
            return event
        raise Fenced(f"a write of {key} kept losing to concurrent writers", "lost_race")

    def _write(self, *events: EffectEvent, atomic: bool = True) -> Steps[list[Position]]:
        """Append events of one key through the strategy; returns once all are accepted."""
        key = events[0].idempotency_key
        if any(e.idempotency_key != key for e in events):
            raise InvalidInput("one write carries the events of one key")
        data = tuple(self.codec.encode(e.to_record()) for e in events)
        try:
            positions = yield from self.writes.write(key, events, data, atomic)
        except BackendUnavailable:
            # An append that timed out may still have been written: nothing remembered of
            # the key is trusted again; the next call reads it afresh.
            self.writes.forget(key)
            raise
        for event, position in zip(events, positions, strict=True):
            self.last_position = position
            if event.transition in CLAIMING:
                self.claimed[key] = event.fencing_epoch
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("accepted %s %s at %s", event.transition.value, key, position)
        return positions

    def epoch(self, key: str, current: EffectEvent, epoch: int | None) -> int:
        """The epoch this worker writes with: explicit, else the one it claimed, else current.

        Remembering the claimed epoch is what fences a paused worker out after a
        replacement with the same worker id has claimed the key.
        """
        if epoch is not None:
            return epoch
        return self.claimed.get(key, current.fencing_epoch)


def _given_epoch(epoch: int | None) -> None:
    """An epoch the caller gave is bad input (exit 2) outside 0 to the maximum."""
    if epoch is not None:
        validate_fencing_epoch(epoch)
