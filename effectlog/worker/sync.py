"""The sync shell: :class:`Worker` answers the core's requests in the calling thread."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from effectlog.codec import Codec
from effectlog.errors import Conflict
from effectlog.log.base import EVENTS, EventLog
from effectlog.machine import DEFAULT_MAX_PAYLOAD_BYTES
from effectlog.model import Decision, EffectEvent, State, Transition
from effectlog.provider import ProviderFailed
from effectlog.view import LogView, decode_events
from effectlog.worker.base import UNRECORDED, CallBase, WorkerBase, failed_result, unknown_reason
from effectlog.worker.requests import (
    Append,
    AppendAfter,
    Ask,
    Fold,
    Identity,
    Request,
    Steps,
)

if TYPE_CHECKING:
    from effectlog.judge.query import Judge

R = TypeVar("R")
T = Transition

logger = logging.getLogger(__name__)


def answer_log(log: EventLog, request: Request[Any], codec: Codec | None = None) -> Any:
    """Answer a request that reads or appends the log itself (blocking); a fold decodes
    with ``codec``, the worker's."""
    if isinstance(request, Append):
        if len(request.data) == 1:
            return [log.append(EVENTS, request.key, request.data[0])]
        items = [(request.key, d) for d in request.data]
        return log.append_many(EVENTS, items) if request.atomic else log.append_ordered(EVENTS, items)
    if isinstance(request, AppendAfter):
        return log.append_after(EVENTS, request.key, request.data, request.last_offset)
    if isinstance(request, Fold):
        return LogView(log, codec).current_at(request.key)
    if isinstance(request, Identity):
        return log.identity()
    raise TypeError(f"not a log request: {request!r}")


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

    On a log with compare-and-append (SQLite, memory) each append is conditional on the
    key's last record, folded from the log: accepted as it is written. Elsewhere (Kafka) the
    judge of ``effectlog serve`` says whether each write was accepted: ``judge`` (a
    :class:`~effectlog.judge.client.ClusterJudge` the workers of a process share), or
    ``server`` (URLs; else ``$EFFECTLOG_SERVER``). ``accept_timeout_s`` bounds the wait for a
    verdict. ``close()`` closes a judge the worker opened from ``server``. The log is
    connected here (on Kafka: its producer id acquired), so no first call pays for it.
    """

    def __init__(self, log: EventLog, worker_id: str | None = None, *,
                 judge: Judge | None = None, server: str | Sequence[str] | None = None,
                 verify: bool = True, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 accept_timeout_s: float = 10.0, codec: Codec | None = None) -> None:
        self._setup(log, worker_id or "", judge, server, verify, max_payload_bytes,
                    accept_timeout_s, codec)
        self._warm()

    def close(self) -> None:
        """Close the judge this worker opened (the log stays open: it is the caller's)."""
        self._close_judge()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reads ---------------------------------------------------------------------------

    def get(self, key: str) -> EffectEvent | None:
        """The key's current snapshot, or None."""
        return self._run(self._core.load(key, fresh=True))

    def history(self, key: str) -> list[EffectEvent]:
        """Every decodable event of ``key`` in log order (accepted or not; expiries, the
        key's tombstones, are left out: a key used again after one starts a new effect)."""
        return [e for e in decode_events(self.log, key) if isinstance(e, EffectEvent)]

    # -- transitions ---------------------------------------------------------------------

    def create(self, operation_id: str, kind: str, target: str, payload: Any, *,
               payload_ref: str | None = None) -> EffectEvent:
        """Create the effect, or return the existing one when key and payload match.

        Raises :class:`PayloadMismatch` when the key exists with another payload.
        """
        return self._run(self._core.create(operation_id, kind, target, payload, payload_ref))

    def claim(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Take the key over with a new fencing epoch from any open state, keeping its
        state (recovery's way to fence out a paused or dead owner before it acts)."""
        return self._run(self._core.claim(key, epoch))

    def reserve(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Take ownership to dispatch, with a new fencing epoch (default: current + 1).

        RESERVE from CREATED; from RESERVED it is a CLAIM that takes the key over (a worker
        reserved it and died before dispatching). A key DISPATCHED, UNKNOWN or awaiting
        approval raises :class:`EffectInDoubt`: taking it over is :meth:`claim`'s, recovery's.
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
        FAILED) and is raised again, also when the key was settled meanwhile (then it is not
        marked); leaving the block without recording also marks it UNKNOWN.
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
                self._unknown_for(call, exc)
            raise
        if call.outcome is None:
            self.unknown(call.key, UNRECORDED)

    def _unknown_for(self, call: EffectCall, exc: BaseException) -> None:
        """Mark the effect UNKNOWN for ``exc``, raised in the block. When the log refuses
        because the key was settled meanwhile (the RECORD landed although the call raised
        after it), the caller gets ``exc`` itself, as it does when ``exc`` is the log's refusal
        of its own write; a key another owner took over raises the refusal."""
        try:
            self.unknown(call.key, unknown_reason(exc))
        except Conflict as refusal:
            current = None if isinstance(exc, Conflict) else self.get(call.key)
            if current is not None and (current.fencing_epoch, current.worker_id) != \
                    (call.fencing_epoch, self.worker_id):
                raise  # another owner took the key over: that is what the caller must hear
            logger.info("%s: not marked UNKNOWN after %s: %s", call.key, type(exc).__name__,
                        refusal)

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
        if isinstance(request, Ask):
            assert self.judge is not None
            return self.judge.ask([request.query])[0]
        return answer_log(self.log, request, self._core.codec)


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

