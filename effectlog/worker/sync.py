"""The sync shell: :class:`Worker` answers the core's requests in the calling thread."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from effectlog.log.base import EVENTS, EventLog
from effectlog.machine import DEFAULT_MAX_PAYLOAD_BYTES
from effectlog.model import Decision, EffectEvent, State, Transition
from effectlog.provider import ProviderFailed
from effectlog.view import AS_IS, LogView, Seen, StateView, decode_events, seen_by
from effectlog.worker.base import UNRECORDED, CallBase, WorkerBase, failed_result, unknown_reason
from effectlog.worker.core import WorkerCore, default_worker_id
from effectlog.worker.requests import (
    Accepted,
    Append,
    AppendAfter,
    Current,
    CurrentAndEnd,
    CurrentAt,
    PartitionEnd,
    Request,
    Steps,
    Untouched,
)
from effectlog.worker.views import default_view

R = TypeVar("R")
T = Transition


def answer_log(log: EventLog, log_view: LogView, request: Request[Any]) -> Any:
    """Answer a request that reads or appends the log itself (blocking)."""
    if isinstance(request, AppendAfter):
        return log.append_after(EVENTS, request.key, request.data, request.last_offset)
    if isinstance(request, PartitionEnd):
        return log.partition_end(EVENTS, log.partition_for(EVENTS, request.key))
    if isinstance(request, Untouched):
        return log.untouched(EVENTS, request.key, request.start, request.end, request.own)
    if isinstance(request, CurrentAt):
        return log_view.current_at(request.key)
    if isinstance(request, Append):
        if len(request.data) == 1:
            return [log.append(EVENTS, request.key, request.data[0])]
        items = [(request.key, d) for d in request.data]
        return log.append_many(EVENTS, items) if request.atomic else log.append_ordered(EVENTS, items)
    raise TypeError(f"not a log request: {request!r}")


class Overlapped:
    """A call made at most once, while another request is in flight; its error is kept
    for :meth:`result` (``run`` never raises)."""

    def __init__(self, fn: Callable[[], R]) -> None:
        self._fn: Callable[[], Any] = fn
        self._ran = False
        self._value: Any = None
        self._error: Exception | None = None

    def run(self) -> None:
        if self._ran:
            return
        self._ran = True
        try:
            self._value = self._fn()
        except Exception as exc:  # handed to the caller by result()
            self._error = exc

    def result(self) -> Any:
        self.run()
        if self._error is not None:
            raise self._error
        return self._value


def seen_with_end(view: StateView, log: EventLog, key: str) -> tuple[Seen, int]:
    """The view's snapshot of ``key`` as it stands and the end of its partition: the
    ListOffsets runs while the read is in flight where the view allows it (``seen_during``),
    else first (and an empty partition is not read)."""
    end = Overlapped(functools.partial(log.partition_end, EVENTS,
                                       log.partition_for(EVENTS, key)))
    during = getattr(view, "seen_during", None)
    if during is None:
        at = int(end.result())
        return (Seen(None, 0) if at == 0 else seen_by(view, key, AS_IS)), at
    seen: Seen = during(key, AS_IS, end.run)
    return seen, int(end.result())


def drive(steps: Steps[R], answer: Callable[[Request[Any]], Any]) -> R:
    """Run a core operation to its end, answering each request with ``answer``; an error
    raised by ``answer`` is raised inside the operation, where the request was made."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            request = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as stop:
            result: R = stop.value
            return result
        try:
            reply, error = answer(request), None
        except BaseException as exc:  # handed to the operation, which re-raises
            reply, error = None, exc


class Worker(WorkerBase):
    """Writes effect transitions for one worker identity, blocking the calling thread.

    ``view`` supplies current state and read-your-writes. By default a worker folds keys
    from the log itself on SQLite and memory, and on Kafka reads through the projection
    cluster's query API (``server``, a URL or several, else ``$EFFECTLOG_SERVER``; see
    :func:`effectlog.worker.views.default_view`).
    """

    def __init__(self, log: EventLog, worker_id: str | None = None, *,
                 view: StateView | None = None, server: str | Sequence[str] | None = None,
                 verify: bool = True, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 accept_timeout_s: float = 10.0) -> None:
        self.log = log
        self._log_view = LogView(log)
        if view is None:
            view = default_view(log, server)
        self.view: StateView = self._log_view if view is None else view
        self._core = WorkerCore(worker_id or default_worker_id(),
                                atomic=view is None and log.conditional, verify=verify,
                                max_payload_bytes=max_payload_bytes,
                                accept_timeout_s=accept_timeout_s)

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: str) -> EffectEvent | None:
        """The key's current snapshot, or None."""
        return self._run(self._core.load(key, fresh=True))

    def history(self, key: str) -> list[EffectEvent]:
        """Every decodable event of ``key`` in log order (accepted or not)."""
        return decode_events(self.log, key)

    # -- transitions ---------------------------------------------------------------------

    def create(self, operation_id: str, kind: str, target: str, payload: Any, *,
               payload_ref: str | None = None) -> EffectEvent:
        """Create the effect, or return the existing one when key and payload match.

        Raises :class:`PayloadMismatch` when the key exists with another payload.
        """
        return self._run(self._core.create(operation_id, kind, target, payload, payload_ref))

    def reserve(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Take ownership with a new fencing epoch (default: current + 1).

        RESERVE from CREATED; from any other open state it is a CLAIM that takes over
        the key (a replacement worker), keeping the state.
        """
        return self._run(self._core.reserve(key, epoch))

    def dispatch(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Mark DISPATCHED; returns only when that is durable and accepted."""
        return self._run(self._core.step(key, T.DISPATCH, epoch))

    def record(self, key: str, status: State | str, result: Any = None, *,
               source: str = "worker", epoch: int | None = None) -> EffectEvent:
        """Record the provider's outcome: SUCCEEDED or FAILED."""
        return self._run(self._core.record(key, status, result, source, epoch))

    def unknown(self, key: str, error: str, *, epoch: int | None = None) -> EffectEvent:
        """Mark UNKNOWN: the dispatch may or may not have reached the provider."""
        return self._run(self._core.step(key, T.UNKNOWN, epoch, error=error))

    def await_approval(self, key: str, reason: str, *, epoch: int | None = None) -> EffectEvent:
        """Park an UNKNOWN effect until a person or policy decides."""
        return self._run(self._core.step(key, T.AWAIT_APPROVAL, epoch, error=reason))

    def approve(self, key: str, decision: Decision | str, by: str, reason: str) -> EffectEvent:
        """Decide on an UNKNOWN effect: RETRY (back to RESERVED) or ABANDON.

        The decision claims a new epoch, fencing out any worker still holding the old one.
        """
        return self._run(self._core.approve(key, decision, by, reason))

    def write(self, *events: EffectEvent) -> EffectEvent:
        """Append already-checked events of one key, in order, as one durable append.

        Returns the last one once all are accepted; raises :class:`Fenced` (or the
        conflict found) when a concurrent writer got there first.
        """
        return self._run(self._core.write(*events))

    # -- guarded provider call -----------------------------------------------------------

    @contextmanager
    def effect(self, operation_id: str, kind: str, target: str, payload: Any, *,
               payload_ref: str | None = None) -> Iterator[EffectCall]:
        """Create, reserve and dispatch; the block performs the call and records it.

        An exception in the block marks the effect UNKNOWN (``ProviderFailed`` records
        FAILED); leaving the block without recording also marks it UNKNOWN.
        """
        event, done = self._run(self._core.begin(operation_id, kind, target, payload,
                                                 payload_ref))
        call = EffectCall(self, event, payload, done=done)
        if call.done:
            yield call
            return
        try:
            yield call
        except ProviderFailed as exc:
            call.failed(failed_result(exc))
            raise
        except BaseException as exc:
            if call.outcome is None:
                self.unknown(call.key, unknown_reason(exc))
            raise
        if call.outcome is None:
            self.unknown(call.key, UNRECORDED)

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

    # -- plumbing ------------------------------------------------------------------------

    def _run(self, steps: Steps[R]) -> R:
        return drive(steps, self._answer)

    def _answer(self, request: Request[Any]) -> Any:
        if isinstance(request, Current):
            return seen_by(self.view, request.key, request.since)
        if isinstance(request, CurrentAndEnd):
            return seen_with_end(self.view, self.log, request.key)
        if isinstance(request, Accepted):
            return self.view.accepted(request.event, request.position, request.timeout)
        return answer_log(self.log, self._log_view, request)


class EffectCall(CallBase):
    """The dispatched effect handed to the provider call: key, epoch, payload, recorder."""

    def __init__(self, worker: Worker, event: EffectEvent, payload: Any,
                 done: bool = False) -> None:
        super().__init__(event, payload, done)
        self._worker = worker

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

