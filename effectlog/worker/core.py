"""The worker's I/O-free core: what to append next, whether a claim won, what a record means.

Every operation is a generator in the sans-I/O style: it yields the reads and appends it needs
as small request objects and is sent their answers. The sync shell
(:class:`~effectlog.worker.Worker`) answers them in the calling thread, the async shell
(:class:`~effectlog.worker.AsyncWorker`) off the event loop, so the judging is written once.
A worker never calls a provider before its DISPATCHED event is durable and accepted, and never
turns a timeout or crash into FAILED: what it cannot confirm becomes UNKNOWN.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from effectlog.codec import event_codec
from effectlog.errors import (
    BackendUnavailable,
    Conflict,
    Fenced,
    IllegalTransition,
    InvalidInput,
    NotFound,
)
from effectlog.log.base import Position
from effectlog.machine import (
    CLAIMING,
    DEFAULT_MAX_PAYLOAD_BYTES,
    advance,
    check,
    new_effect,
)
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State, Transition
from effectlog.text import check_free_text
from effectlog.view import Seen
from effectlog.worker.knowledge import KeyKnowledge
from effectlog.worker.requests import (
    Accepted,
    Append,
    AppendAfter,
    Current,
    Request,
    Steps,
    Untouched,
    ask,
)

logger = logging.getLogger("effectlog.worker")

R = TypeVar("R")
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


@dataclass(frozen=True, slots=True)
class Appended:
    """An accepted event and where it sits in the log."""

    event: EffectEvent
    position: Position


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# -- the core ----------------------------------------------------------------------------

class WorkerCore(KeyKnowledge):
    """Judging and bookkeeping for one worker identity.

    ``atomic``: the shell reads through its own log view on a backend with compare-and-append,
    so each append is conditional on the key's last record and accepted by construction (no
    read-back). Otherwise appends are plain and judged after they land (``verify``).
    """

    def __init__(self, worker_id: str, *, atomic: bool, verify: bool = True,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 accept_timeout_s: float = 10.0) -> None:
        super().__init__(atomic=atomic, verify=verify)
        self.worker_id = check_free_text("worker_id", worker_id, max_chars=MAX_WORKER_ID)
        self.max_payload_bytes = max_payload_bytes
        self.accept_timeout_s = accept_timeout_s
        self.claimed: dict[str, int] = {}
        self.last_position: Position | None = None
        self._codec = event_codec()

    # -- writes on what is known ---------------------------------------------------------

    def _judged(self, key: str, build: Callable[[EffectEvent], EffectEvent]) -> Steps[EffectEvent]:
        """Write ``build(state)`` on the key's state; built on an unconfirmed state and
        refused (by the rules here or by the log), it is judged again on the current state,
        so it meets the refusal (or the success) a read first would have given."""
        current, unconfirmed = yield from self._writable(key)
        if unconfirmed:
            try:
                if current is not None:
                    return (yield from self.write(build(current)))
            except (IllegalTransition, Fenced):
                pass
            current = yield from self.load(key, fresh=True)
        if current is None:
            raise NotFound(f"no effect with key {key}")
        return (yield from self.write(build(current)))

    # -- transitions ---------------------------------------------------------------------

    def new_effect(self, operation_id: str, kind: str, target: str, payload: Any,
                   payload_ref: str | None) -> EffectEvent:
        return new_effect(operation_id, kind, target, payload, self.worker_id,
                          payload_ref=payload_ref, max_payload_bytes=self.max_payload_bytes)

    def create(self, operation_id: str, kind: str, target: str, payload: Any,
               payload_ref: str | None) -> Steps[EffectEvent]:
        event = self.new_effect(operation_id, kind, target, payload, payload_ref)
        existing, unconfirmed = yield from self._existing_to_write_on(event)
        if existing is not None and unconfirmed and existing.state not in FINISHED:
            existing = yield from self.existing(event, fresh=True)  # answered as it is now
        if existing is None:
            try:
                return (yield from self.write(event))
            except (IllegalTransition, Fenced):
                # Another delivery created the key at the same moment: judge against it.
                existing = yield from self.existing(event, fresh=True)
                if existing is None:
                    raise
        return existing

    def reserve(self, key: str, epoch: int | None) -> Steps[EffectEvent]:
        def claim(current: EffectEvent) -> EffectEvent:
            transition = T.RESERVE if current.state is State.CREATED else T.CLAIM
            return advance(current, transition, self.worker_id, epoch=epoch)

        return (yield from self._judged(key, claim))

    def step(self, key: str, transition: Transition, epoch: int | None, *,
             outcome: Outcome | None = None, error: str | None = None) -> Steps[EffectEvent]:
        """DISPATCH, RECORD, UNKNOWN or AWAIT_APPROVAL with this worker's epoch (built on
        this worker's own last write with no read first, see :meth:`_writable`: the RECORD
        after a provider call needs no ListOffsets)."""
        return (yield from self._judged(key, lambda current: advance(
            current, transition, self.worker_id, outcome=outcome, error=error,
            epoch=self.epoch(key, current, epoch))))

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
        """Create (or find), claim and dispatch the effect in one durable append.

        Returns the DISPATCHED event, or the finished record with ``done``. The three events
        are still three transitions in the log; writing them together makes DISPATCHED
        durable before the call at the cost of one write, not three. The append need not be
        all or none (on Kafka it is one ordered produce, no transaction): the log's judge
        accepts or refuses each event on its own, and the call is made only when this
        worker's DISPATCH was accepted, which it can be only on this worker's own claim.
        A prefix left by a crash is what a crash between two separate appends leaves.
        """
        created = self.new_effect(operation_id, kind, target, payload, payload_ref)
        for attempt in range(RACE_RETRIES):
            existing, unconfirmed = yield from self._existing_to_write_on(created, attempt > 0)
            head = created if existing is None else existing
            if head.state in FINISHED:
                return head, True
            if head.state not in OPEN_FOR_DISPATCH:
                if unconfirmed:
                    continue  # a state left to recovery is refused on the current state only
                raise EffectInDoubt(head)
            claim = advance(head, T.RESERVE if head.state is State.CREATED else T.CLAIM,
                            self.worker_id)
            dispatched = advance(claim, T.DISPATCH, self.worker_id)
            try:
                group = (created, claim, dispatched) if existing is None else (claim, dispatched)
                yield from self.write(*group, atomic=False)
            except (IllegalTransition, Fenced):
                continue  # another writer moved the key in between: judge again
            return dispatched, False
        raise Fenced(f"dispatch of {created.idempotency_key} kept losing to concurrent writers",
                     "lost_race")

    def write(self, *events: EffectEvent, atomic: bool = True) -> Steps[EffectEvent]:
        """Append already-checked events of one key, in order, as one durable append
        (all or none unless ``atomic`` is False; a conditional append always is)."""
        key = events[0].idempotency_key
        if any(e.idempotency_key != key for e in events):
            raise InvalidInput("one write carries the events of one key")
        data = tuple(self._codec.encode(e.to_record()) for e in events)
        if self.atomic:
            return (yield from self._write_atomic(events, data))
        positions = yield from self._appended(key, Append(key, data, atomic))
        last = events[-1]
        follows = yield from self._follows(key, events, positions)
        if self.verify and not follows and not (
                yield from ask(Accepted(last, positions[-1], self.accept_timeout_s))):
            self.forget(key)
            winner = (yield from ask(Current(key))).event
            owner = f" (now epoch {winner.fencing_epoch}, owner {winner.worker_id})" if winner else ""
            raise Fenced(f"{last.transition.value} on {key} lost to a concurrent writer{owner}",
                         "lost_race")
        self._accepted(events, positions)
        if (follows or self.verify) and positions[-1].offset >= 0:
            self._set_basis(key, Seen(last, positions[-1].offset + 1))
        else:
            self.basis.pop(key, None)  # unchecked, or planned (no offset yet): read next time
        return last

    # -- bookkeeping ---------------------------------------------------------------------

    def epoch(self, key: str, current: EffectEvent, epoch: int | None) -> int:
        """The epoch this worker writes with: explicit, else the one it claimed, else current.

        Remembering the claimed epoch is what fences a paused worker out after a
        replacement with the same worker id has claimed the key.
        """
        if epoch is not None:
            return epoch
        return self.claimed.get(key, current.fencing_epoch)

    def _appended(self, key: str, request: Request[R]) -> Steps[R]:
        try:
            return (yield from ask(request))
        except BackendUnavailable:
            # An append that timed out may still have been written: nothing remembered of
            # the key is trusted again; the next call reads it afresh.
            self.forget(key)
            raise

    def _follows(self, key: str, events: tuple[EffectEvent, ...],
                 positions: list[Position]) -> Steps[bool]:
        """True when the append provably follows the state it was built on, so it is
        accepted without asking: the projector's own rules accept its events in turn from
        the basis snapshot, and no other record of the key sits between everything the basis
        covered and them (they sit right after it, or the log proves it)."""
        basis = self.basis.get(key)
        if basis is None or basis.through is None or positions[0].offset < basis.through:
            return False
        state = basis.event
        for event in events:
            try:
                check(state, event)
            except Conflict:
                return False
            state = event
        through = basis.through
        if all(p.offset == through + i for i, p in enumerate(positions)):
            return True
        own = frozenset(p.offset for p in positions)
        return (yield from ask(Untouched(key, through, positions[-1].offset + 1, own)))

    def _write_atomic(self, events: tuple[EffectEvent, ...],
                      data: tuple[bytes, ...]) -> Steps[EffectEvent]:
        key = events[0].idempotency_key
        for _ in range(RACE_RETRIES):
            last_offset = self.known.get(key, (None, None))[1]
            positions = yield from self._appended(key, AppendAfter(key, data, last_offset))
            if positions is not None:
                self.remember(key, events[-1], positions[-1].offset)
                self._accepted(events, positions)
                return events[-1]
            fresh = yield from self.load(key, fresh=True)  # someone wrote in between: judge again
            check(fresh, events[0])
        raise Fenced(f"{events[0].transition.value} on {key} kept losing to concurrent writers",
                     "lost_race")

    def _accepted(self, events: tuple[EffectEvent, ...], positions: list[Position]) -> None:
        for event, position in zip(events, positions, strict=True):
            self.last_position = position
            if event.transition in CLAIMING:
                self.claimed[event.idempotency_key] = event.fencing_epoch
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("appended %s %s at %s", event.transition.value,
                             event.idempotency_key, position)
