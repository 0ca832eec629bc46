"""The agent developer's API: ``@effectlog.effect`` and ``effectlog.run``.

``@effect(kind, target=...)`` turns a sync or async function into a guarded provider call:
its bound arguments are the payload, its return value is the recorded result, a repeated call
for the same operation returns that result without calling the function, and an effect in
doubt raises :class:`EffectInDoubt` instead of running again.

``run(run_id, worker=...)`` names the operations of one job run: the n-th call of a given kind
and target inside the run gets operation id ``{run_id}.{n}``, so a restarted job that makes the
same calls in the same order gets the same idempotency keys. The run lives in a context
variable, so asyncio tasks started inside it share it; a call takes its number when it starts.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import os
import threading
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from effectlog.errors import InvalidInput
from effectlog.keys import validate_operation_id
from effectlog.log import open_log
from effectlog.log.base import EventLog
from effectlog.model import EffectEvent, State
from effectlog.provider import ProviderFailed
from effectlog.worker import AsyncWorker, EffectInDoubt, Worker
from effectlog.worker.base import CallBase

F = TypeVar("F", bound=Callable[..., Any])
ArgsTo = Callable[..., str]

#: The log a run without ``worker=`` writes to when ``EFFECTLOG_LOG`` is unset (the CLI's default).
DEFAULT_LOG_URL = "sqlite:///./.effectlog/log.db"
OPERATION_ID = "operation_id"

_run: ContextVar[Run | None] = ContextVar("effectlog_run", default=None)
_call: ContextVar[CallBase | None] = ContextVar("effectlog_call", default=None)


class EffectAbandoned(ProviderFailed):
    """A person or policy abandoned the effect (``effectlog approve --decision abandon``):
    it did not happen and will not."""


def current_call() -> CallBase:
    """The effect being performed, inside a decorated function: its ``key``,
    ``fencing_epoch`` and ``payload_hash``, to hand to the provider."""
    call = _call.get()
    if call is None:
        raise LookupError("current_call() is only available inside an @effectlog.effect function")
    return call


def current_run() -> Run | None:
    """The run active in this context, or None."""
    return _run.get()


class Run:
    """The operation ids of one job run, and the worker its effects are written by.

    Use ``with run(...)`` around sync code (a :class:`Worker`) and ``async with run(...)``
    around async code (an :class:`AsyncWorker`). Without ``worker=`` the run opens one on
    ``EFFECTLOG_LOG`` (default ``sqlite:///./.effectlog/log.db``) and closes it at the end.
    A run opened inside another one is a sub-run: its id is ``{parent}.{run_id}`` and it
    writes with the parent's worker unless given one.
    """

    def __init__(self, run_id: str, *, worker: Worker | AsyncWorker | None = None) -> None:
        try:
            validate_operation_id(f"{run_id}.1")
        except InvalidInput:
            raise InvalidInput(f"invalid run id {run_id!r}: use [A-Za-z0-9._-], at most 120 "
                               "characters, starting with a letter or digit") from None
        self.name = self.run_id = run_id
        self.worker = worker
        self._given = worker
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._token: Token[Run | None] | None = None
        self._log: EventLog | None = None

    def next_operation_id(self, kind: str, target: str) -> str:
        """``{run_id}.{n}`` for the n-th call of ``kind`` on ``target`` in this run."""
        with self._lock:  # threads started with asyncio.to_thread share the run
            n = self._counts.get((kind, target), 0) + 1
            self._counts[(kind, target)] = n
        return validate_operation_id(f"{self.run_id}.{n}")

    def __enter__(self) -> Run:
        self._start()
        if self.worker is None:
            try:
                self._log = open_log(log_url())
            except BaseException:
                self._stop()
                raise
            self.worker = Worker(self._log)
        return self

    def __exit__(self, *exc: object) -> None:
        log = self._stop()
        if log is not None:
            log.close()

    async def __aenter__(self) -> Run:
        self._start()
        if self.worker is None:
            try:
                self._log = await asyncio.to_thread(open_log, log_url())
            except BaseException:
                self._stop()
                raise
            self.worker = AsyncWorker(self._log)
        return self

    async def __aexit__(self, *exc: object) -> None:
        worker = self.worker
        log = self._stop()
        if log is not None:
            assert isinstance(worker, AsyncWorker)
            await worker.aclose()
            await asyncio.to_thread(log.close)

    def _start(self) -> None:
        if self._token is not None:
            raise RuntimeError(f"run {self.run_id!r} is already active")
        parent = _run.get()
        self.run_id = self.name if parent is None else \
            validate_operation_id(f"{parent.run_id}.{self.name}")
        self.worker = self._given or (parent.worker if parent is not None else None)
        self._counts.clear()
        self._token = _run.set(self)

    def _stop(self) -> EventLog | None:
        """Leave the run; returns the log it opened for itself, to close."""
        assert self._token is not None
        _run.reset(self._token)
        self._token = None
        log, self._log = self._log, None
        if log is not None:
            self.worker = None
        return log


def run(run_id: str, *, worker: Worker | AsyncWorker | None = None) -> Run:
    """The run context of one job: ``with effectlog.run("job-123", worker=w):``."""
    return Run(run_id, worker=worker)


def log_url() -> str:
    """The log a run without ``worker=`` opens: ``EFFECTLOG_LOG``, else the CLI's default."""
    return os.environ.get("EFFECTLOG_LOG") or DEFAULT_LOG_URL


def effect(kind: str, *, target: str | ArgsTo, operation_id: ArgsTo | None = None,
           secret: Iterable[str] = (), exclude: Iterable[str] = (),
           payload_ref: str | ArgsTo | None = None) -> Callable[[F], F]:
    """Make a sync or async function an effect of ``kind`` on ``target``.

    ``target`` (and ``operation_id``, ``payload_ref``) may be a function of the call's
    arguments by name, e.g. ``target=lambda to, **_: f"mailto:{to}"``. The operation id is
    the call's ``operation_id=`` keyword if given (or, when the function takes an
    ``operation_id`` parameter, its value however it was passed, its default included), else
    ``operation_id(**arguments)``, else the next number of the active :func:`run`. The
    payload is the canonical JSON of the bound arguments except ``exclude`` (not part of the
    effect: clients, credentials, ``self``).
    ``secret`` arguments belong to the effect (they are in the payload hash) but must not
    sit on the log: the payload is then kept off it and the effect carries ``payload_ref``
    (default ``withheld:<names>``) instead.
    """

    def decorate(fn: F) -> F:
        plan = _Plan(fn, kind, target, operation_id, tuple(secret), tuple(exclude), payload_ref)
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def call_async(*args: Any, **kwargs: Any) -> Any:
                worker = plan.run_worker(AsyncWorker)
                call = plan.bind(args, kwargs)
                if worker is not None:
                    return await _perform_async(worker, fn, call)
                log = await asyncio.to_thread(open_log, log_url())
                try:
                    async with AsyncWorker(log) as owned:
                        return await _perform_async(owned, fn, call)
                finally:
                    await asyncio.to_thread(log.close)

            return cast(F, call_async)

        @functools.wraps(fn)
        def call_sync(*args: Any, **kwargs: Any) -> Any:
            worker = plan.run_worker(Worker)
            call = plan.bind(args, kwargs)
            if worker is not None:
                return _perform(worker, fn, call)
            with open_log(log_url()) as log:
                return _perform(Worker(log), fn, call)

        return cast(F, call_sync)

    return decorate


@dataclass(frozen=True, slots=True)
class _Call:
    """One call of a decorated function, as an effect."""

    operation_id: str
    target: str
    payload: dict[str, Any]
    payload_ref: str | None
    kind: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _perform(worker: Worker, fn: Callable[..., Any], c: _Call) -> Any:
    with worker.effect(c.operation_id, c.kind, c.target, c.payload,
                       payload_ref=c.payload_ref) as call:
        if call.done:
            return replayed(call.event)
        token = _call.set(call)
        try:
            result = as_recorded(fn(*c.args, **c.kwargs))
        finally:
            _call.reset(token)
        call.succeeded(result)
        return result


async def _perform_async(worker: AsyncWorker, fn: Callable[..., Any], c: _Call) -> Any:
    async with worker.effect(c.operation_id, c.kind, c.target, c.payload,
                             payload_ref=c.payload_ref) as call:
        if call.done:
            return replayed(call.event)
        token = _call.set(call)
        try:
            result = as_recorded(await fn(*c.args, **c.kwargs))
        finally:
            _call.reset(token)
        await call.succeeded(result)
        return result


W = TypeVar("W", Worker, AsyncWorker)


class _Plan:
    """How one decorated function's calls become effects (checked once, at decoration)."""

    def __init__(self, fn: Callable[..., Any], kind: str, target: str | ArgsTo,
                 operation_id: ArgsTo | None, secret: tuple[str, ...], exclude: tuple[str, ...],
                 payload_ref: str | ArgsTo | None) -> None:
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.signature = inspect.signature(fn)
        self.takes_id = OPERATION_ID in self.signature.parameters
        unknown = [n for n in (*secret, *exclude) if n not in self.signature.parameters]
        if unknown:
            raise TypeError(f"{self.name} has no argument(s) {', '.join(unknown)} to keep off the log")
        self.kind, self.target, self.operation_id = kind, target, operation_id
        self.dropped = frozenset((*exclude, *([OPERATION_ID] if self.takes_id else [])))
        self.secret = secret
        self.payload_ref = payload_ref if payload_ref is not None or not secret \
            else "withheld:" + ",".join(secret)

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Call:
        """One call as an effect: its operation id (a run's next number), target, payload."""
        pinned = None if self.takes_id else kwargs.pop(OPERATION_ID, None)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        named = dict(bound.arguments)
        if self.takes_id:  # the function's own parameter: by keyword, by position or default
            pinned = named.get(OPERATION_ID)
        target = self.target(**named) if callable(self.target) else self.target
        op = pinned if pinned is not None else (
            self.operation_id(**named) if self.operation_id is not None else None)
        if op is None:
            active = _run.get()
            if active is None:
                raise InvalidInput(f"{self.name} was called outside effectlog.run(...) without "
                                   "an operation_id: open a run or pass operation_id=")
            op = active.next_operation_id(self.kind, target)
        payload = {k: v for k, v in named.items() if k not in self.dropped}
        ref = self.payload_ref(**named) if callable(self.payload_ref) else self.payload_ref
        return _Call(str(op), target, payload, ref, self.kind, args, kwargs)

    def run_worker(self, kind: type[W]) -> W | None:
        """The active run's worker (None outside a run: the call opens one for itself)."""
        active = _run.get()
        worker = active.worker if active is not None else None
        if worker is not None and not isinstance(worker, kind):
            form = "async def" if kind is AsyncWorker else "a plain def"
            raise TypeError(f"{self.name} is {form}: its run's worker must be "
                            f"{kind.__name__}(...), not {type(worker).__name__}(...)")
        return worker


def as_recorded(result: Any) -> Any:
    """``result`` as the log keeps it (a JSON round trip), so a first call and every replay
    return the same value; a result that is not JSON leaves the effect UNKNOWN (TypeError)."""
    try:
        return json.loads(json.dumps(result, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"the effect's result must be JSON to be recorded: {exc}") from exc


def replayed(event: EffectEvent) -> Any:
    """What a finished effect gives a repeated call: its result, or the refusal again."""
    outcome = event.outcome
    if event.state is State.SUCCEEDED:
        return outcome.result if outcome else None
    if event.state is State.FAILED:
        raise ProviderFailed(f"{event.idempotency_key} failed before: "
                             f"{outcome.result if outcome else ''}", outcome.result if outcome else None)
    if event.state is State.ABANDONED:
        who = f" by {event.approval.by}: {event.approval.reason}" if event.approval else ""
        raise EffectAbandoned(f"{event.idempotency_key} was abandoned{who}")
    raise EffectInDoubt(event)
