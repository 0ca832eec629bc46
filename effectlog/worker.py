"""The worker API: one durable, checked event per transition, and a guarded provider call.

A worker never calls a provider before its DISPATCHED event is durable and accepted, and
never turns a timeout or crash into FAILED: what it cannot confirm becomes UNKNOWN.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from effectlog.codec import event_codec
from effectlog.errors import Conflict, Fenced, IllegalTransition, InvalidInput, NotFound
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.machine import (
    CLAIMING,
    DEFAULT_MAX_PAYLOAD_BYTES,
    advance,
    check,
    check_binding,
    new_effect,
)
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State, Transition
from effectlog.provider import ProviderFailed
from effectlog.text import check_free_text
from effectlog.view import LogView, StateView, decode_events

logger = logging.getLogger(__name__)

T = Transition
_RACE_RETRIES = 5
MAX_WORKER_ID = 200


class EffectInDoubt(Conflict):
    """The effect may already have happened (DISPATCHED, UNKNOWN or awaiting approval):
    it is left to recovery and reconciliation, never re-run blindly."""

    reason = "in_doubt"

    def __init__(self, event: EffectEvent) -> None:
        super().__init__(f"{event.idempotency_key} is {event.state.value}: "
                         "left to recovery, not re-run")
        self.event = event


@dataclass(frozen=True, slots=True)
class Appended:
    """An accepted event and where it sits in the log."""

    event: EffectEvent
    position: Position


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    """Writes effect transitions for one worker identity.

    ``view`` supplies current state and read-your-writes (default: fold the key's events
    from the log, right for SQLite and memory; use the projection's view on Kafka).
    """

    def __init__(self, log: EventLog, worker_id: str | None = None, *,
                 view: StateView | None = None, verify: bool = True,
                 max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 accept_timeout_s: float = 10.0) -> None:
        self.log = log
        self.worker_id = check_free_text("worker_id", worker_id or default_worker_id(),
                                         max_chars=MAX_WORKER_ID)
        # Against its own log view on a backend with compare-and-append, each event is
        # appended only if the key's last record is still the one it was checked against:
        # accepted by construction, no read-back needed.
        self.view: StateView
        self._atomic: LogView | None = None
        if view is None:
            log_view = LogView(log)
            self.view = log_view
            self._atomic = log_view if log.conditional else None
        else:
            self.view = view
        self._known: dict[str, tuple[EffectEvent | None, int | None]] = {}
        self.verify = verify
        self.max_payload_bytes = max_payload_bytes
        self.accept_timeout_s = accept_timeout_s
        self._codec = event_codec()
        self.last_position: Position | None = None
        self._claimed: dict[str, int] = {}

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: str) -> EffectEvent | None:
        """The key's current snapshot, or None."""
        return self._load(key, fresh=True)

    def history(self, key: str) -> list[EffectEvent]:
        """Every decodable event of ``key`` in log order (accepted or not)."""
        return decode_events(self.log, key)

    # -- transitions ---------------------------------------------------------------------

    def create(self, operation_id: str, kind: str, target: str, payload: Any, *,
               payload_ref: str | None = None) -> EffectEvent:
        """Create the effect, or return the existing one when key and payload match.

        Raises :class:`PayloadMismatch` when the key exists with another payload.
        """
        event = self._new_effect(operation_id, kind, target, payload, payload_ref)
        existing = self._existing(event)
        if existing is None:
            try:
                return self.write(event)
            except (IllegalTransition, Fenced):
                # Another delivery created the key at the same moment: judge against it.
                existing = self._existing(event, fresh=True)
                if existing is None:
                    raise
        return existing

    def reserve(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Take ownership with a new fencing epoch (default: current + 1).

        RESERVE from CREATED; from any other open state it is a CLAIM that takes over
        the key (a replacement worker), keeping the state.
        """
        current = self._require(key)
        transition = T.RESERVE if current.state is State.CREATED else T.CLAIM
        return self.write(advance(current, transition, self.worker_id, epoch=epoch))

    def dispatch(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Mark DISPATCHED; returns only when that is durable and accepted."""
        current = self._require(key)
        return self.write(advance(current, T.DISPATCH, self.worker_id,
                                             epoch=self._epoch(key, current, epoch)))

    def record(self, key: str, status: State | str, result: Any = None, *,
               source: str = "worker", epoch: int | None = None) -> EffectEvent:
        """Record the provider's outcome: SUCCEEDED or FAILED."""
        state = State(status.upper()) if isinstance(status, str) else status
        if state not in (State.SUCCEEDED, State.FAILED):
            raise IllegalTransition(f"an outcome is SUCCEEDED or FAILED, not {state.value}")
        current = self._require(key)
        outcome = Outcome(state, result, source)
        return self.write(advance(current, T.RECORD, self.worker_id, outcome=outcome,
                                             epoch=self._epoch(key, current, epoch)))

    def unknown(self, key: str, error: str, *, epoch: int | None = None) -> EffectEvent:
        """Mark UNKNOWN: the dispatch may or may not have reached the provider."""
        current = self._require(key)
        return self.write(advance(current, T.UNKNOWN, self.worker_id, error=error,
                                             epoch=self._epoch(key, current, epoch)))

    def await_approval(self, key: str, reason: str, *, epoch: int | None = None) -> EffectEvent:
        """Park an UNKNOWN effect until a person or policy decides."""
        current = self._require(key)
        event = advance(current, T.AWAIT_APPROVAL, self.worker_id, error=reason,
                        epoch=self._epoch(key, current, epoch))
        return self.write(event)

    def approve(self, key: str, decision: Decision | str, by: str, reason: str) -> EffectEvent:
        """Decide on an UNKNOWN effect: RETRY (back to RESERVED) or ABANDON.

        The decision claims a new epoch, fencing out any worker still holding the old one.
        """
        choice = Decision(decision.upper()) if isinstance(decision, str) else decision
        if not by.strip() or not reason.strip():
            raise InvalidInput("an approval needs who decided (--by) and why (--reason)")
        check_free_text("--by", by, max_chars=MAX_WORKER_ID)
        check_free_text("--reason", reason)
        current = self._require(key)
        approval = Approval(choice, by, reason)
        return self.write(advance(current, T.APPROVE, self.worker_id,
                                             approval=approval))

    # -- guarded provider call -----------------------------------------------------------

    @contextmanager
    def effect(self, operation_id: str, kind: str, target: str, payload: Any, *,
               payload_ref: str | None = None) -> Iterator[EffectCall]:
        """Create, reserve and dispatch; the block performs the call and records it.

        An exception in the block marks the effect UNKNOWN (``ProviderFailed`` records
        FAILED); leaving the block without recording also marks it UNKNOWN.
        """
        call = self._begin(operation_id, kind, target, payload, payload_ref)
        if call.done:
            yield call
            return
        try:
            yield call
        except ProviderFailed as exc:
            call.failed(exc.result if exc.result is not None else {"error": str(exc)})
            raise
        except BaseException as exc:
            if call.outcome is None:
                self.unknown(call.key, f"{type(exc).__name__}: {exc}"[:500])
            raise
        if call.outcome is None:
            self.unknown(call.key, "the effect block ended without recording an outcome")

    def perform(self, operation_id: str, kind: str, target: str, payload: Any,
                fn: Callable[[EffectCall], Any], *, payload_ref: str | None = None) -> Any:
        """Run ``fn(call)`` as the provider call of the effect and record its return value.

        Same key and payload twice returns the recorded result without calling ``fn``.
        """
        with self.effect(operation_id, kind, target, payload, payload_ref=payload_ref) as call:
            if call.done:
                return call.result
            result = fn(call)
            call.succeeded(result)
            return result

    def _begin(self, operation_id: str, kind: str, target: str, payload: Any,
               payload_ref: str | None) -> EffectCall:
        """Create (or find), claim and dispatch the effect in one atomic, durable append.

        The three events are still three transitions in the log; writing them together
        makes DISPATCHED durable before the call at the cost of one write, not three.
        """
        created = self._new_effect(operation_id, kind, target, payload, payload_ref)
        for attempt in range(_RACE_RETRIES):
            existing = self._existing(created, fresh=attempt > 0)
            head = created if existing is None else existing
            if head.state in (State.SUCCEEDED, State.FAILED, State.ABANDONED):
                return EffectCall(self, head, payload, done=True)
            if head.state not in (State.CREATED, State.RESERVED):
                raise EffectInDoubt(head)
            claim = advance(head, T.RESERVE if head.state is State.CREATED else T.CLAIM,
                            self.worker_id)
            dispatched = advance(claim, T.DISPATCH, self.worker_id)
            try:
                if existing is None:
                    self.write(created, claim, dispatched)
                else:
                    self.write(claim, dispatched)
            except (IllegalTransition, Fenced):
                continue  # another writer moved the key in between: judge again
            return EffectCall(self, dispatched, payload)
        raise Fenced(f"dispatch of {created.idempotency_key} kept losing to concurrent writers",
                     "lost_race")

    def write(self, *events: EffectEvent) -> EffectEvent:
        """Append already-checked events of one key, in order, as one durable append.

        Returns the last one once all are accepted; raises :class:`Fenced` (or the
        conflict found) when a concurrent writer got there first.
        """
        key = events[0].idempotency_key
        if any(e.idempotency_key != key for e in events):
            raise InvalidInput("one write carries the events of one key")
        data = [self._codec.encode(e.to_record()) for e in events]
        if self._atomic is not None:
            return self._write_atomic(events, data)
        if len(data) == 1:
            positions = [self.log.append(EVENTS, key, data[0])]
        else:
            positions = self.log.append_many(EVENTS, [(key, d) for d in data])
        last = events[-1]
        if self.verify and not self.view.accepted(last, positions[-1], self.accept_timeout_s):
            winner = self.view.current(key)
            owner = f" (now epoch {winner.fencing_epoch}, owner {winner.worker_id})" if winner else ""
            raise Fenced(f"{last.transition.value} on {key} lost to a concurrent writer{owner}",
                         "lost_race")
        for event, position in zip(events, positions, strict=True):
            self._accepted(event, position)
        return last

    # -- plumbing ------------------------------------------------------------------------

    def _epoch(self, key: str, current: EffectEvent, epoch: int | None) -> int:
        """The epoch this worker writes with: explicit, else the one it claimed, else current.

        Remembering the claimed epoch is what fences a paused worker out after a
        replacement with the same worker id has claimed the key.
        """
        if epoch is not None:
            return epoch
        return self._claimed.get(key, current.fencing_epoch)

    def _load(self, key: str, fresh: bool = False) -> EffectEvent | None:
        """Current snapshot of ``key``; in atomic mode also remembers the offset it is at."""
        if self._atomic is None:
            return self.view.current(key)
        if fresh or key not in self._known:
            self._remember(key, *self._atomic.current_at(key))
        return self._known[key][0]

    def _remember(self, key: str, event: EffectEvent | None, offset: int | None) -> None:
        if len(self._known) >= 10_000:
            self._known.pop(next(iter(self._known)))
        self._known[key] = (event, offset)

    def _require(self, key: str) -> EffectEvent:
        current = self._load(key)
        if current is None:
            raise NotFound(f"no effect with key {key}")
        return current

    def _write_atomic(self, events: tuple[EffectEvent, ...], data: list[bytes]) -> EffectEvent:
        key = events[0].idempotency_key
        for _ in range(_RACE_RETRIES):
            positions = self.log.append_after(EVENTS, key, data,
                                              self._known.get(key, (None, None))[1])
            if positions is not None:
                self._remember(key, events[-1], positions[-1].offset)
                for event, position in zip(events, positions, strict=True):
                    self._accepted(event, position)
                return events[-1]
            fresh = self._load(key, fresh=True)  # someone wrote in between: judge again
            check(fresh, events[0])
        raise Fenced(f"{events[0].transition.value} on {key} kept losing to concurrent writers",
                     "lost_race")

    def _new_effect(self, operation_id: str, kind: str, target: str, payload: Any,
                    payload_ref: str | None) -> EffectEvent:
        return new_effect(operation_id, kind, target, payload, self.worker_id,
                          payload_ref=payload_ref, max_payload_bytes=self.max_payload_bytes)

    def _existing(self, created: EffectEvent, fresh: bool = False) -> EffectEvent | None:
        """The key's current record if the effect exists (same payload), else None.

        With compare-and-append a key this worker has not seen is not read: appending
        "no record yet" fails if it exists, and only then is it read (one query fewer).
        Raises :class:`PayloadMismatch` when the key exists with another payload.
        """
        key = created.idempotency_key
        if not fresh and self._atomic is not None and key not in self._known:
            return None
        existing = self._load(key, fresh=fresh)
        if existing is not None:
            check_binding(existing, created)
        return existing

    def _accepted(self, event: EffectEvent, position: Position) -> None:
        self.last_position = position
        if event.transition in CLAIMING:
            self._claimed[event.idempotency_key] = event.fencing_epoch
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("appended %s %s at %s", event.transition.value, event.idempotency_key,
                         position)


class EffectCall:
    """The dispatched effect handed to the provider call: key, epoch, payload, recorder."""

    def __init__(self, worker: Worker, event: EffectEvent, payload: Any,
                 done: bool = False) -> None:
        self._worker = worker
        self.event = event
        self.payload = payload
        self.done = done
        self.outcome: Outcome | None = event.outcome if done else None

    @property
    def key(self) -> str:
        return self.event.idempotency_key

    @property
    def fencing_epoch(self) -> int:
        return self.event.fencing_epoch

    @property
    def payload_hash(self) -> str:
        return self.event.payload_hash

    @property
    def result(self) -> Any:
        """The recorded result (for an effect that was already done, the original one)."""
        return self.outcome.result if self.outcome else None

    def succeeded(self, result: Any = None) -> EffectEvent:
        """Record SUCCEEDED with the provider's result."""
        return self._record(State.SUCCEEDED, result)

    def failed(self, result: Any = None) -> EffectEvent:
        """Record FAILED: the provider definitively refused."""
        return self._record(State.FAILED, result)

    def _record(self, state: State, result: Any) -> EffectEvent:
        event = self._worker.record(self.key, state, result)
        self.outcome = event.outcome
        return event
