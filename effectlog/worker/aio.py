"""The async shell: :class:`AsyncWorker` answers the core's requests without blocking the loop.

Log reads and appends (disk or network, through the synchronous :class:`EventLog` port) and
questions to the judge run on a small thread pool the worker owns.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from effectlog.codec import Codec
from effectlog.errors import Conflict
from effectlog.log.base import EventLog
from effectlog.machine import DEFAULT_MAX_PAYLOAD_BYTES
from effectlog.model import Decision, EffectEvent, State, Transition
from effectlog.provider import ProviderFailed
from effectlog.view import decode_events
from effectlog.worker.base import UNRECORDED, CallBase, WorkerBase, failed_result, unknown_reason
from effectlog.worker.requests import Ask, Request, Steps
from effectlog.worker.sync import answer_log

if TYPE_CHECKING:
    from effectlog.judge.query import Judge

R = TypeVar("R")
T = Transition

logger = logging.getLogger(__name__)


class AsyncWorker(WorkerBase):
    """Writes effect transitions for one worker identity from asyncio.

    The same semantics as :class:`~effectlog.worker.Worker` (one core, the same judge or
    conditional appends): ``perform`` and ``effect`` for ``async def`` and plain callables,
    :class:`EffectInDoubt`, fencing, payload binding and the single transitions, each
    awaited. ``threads`` bounds the pool that runs the log's blocking calls and the judge's
    questions (default: ``log.concurrent_appends``, 1 on SQLite, whose appends share one
    connection, 8 on Kafka, whose appends wait on the network). Close it with
    ``await worker.aclose()`` or ``async with AsyncWorker(log, "w1") as worker:``; the log
    stays open (it is the caller's).
    """

    def __init__(self, log: EventLog, worker_id: str | None = None, *,
                 judge: Judge | None = None, server: str | Sequence[str] | None = None,
                 verify: bool = True, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
                 accept_timeout_s: float = 10.0, threads: int | None = None,
                 codec: Codec | None = None) -> None:
        self._setup(log, worker_id or "", judge, server, verify, max_payload_bytes,
                    accept_timeout_s, codec)
        self._pool = ThreadPoolExecutor(max_workers=threads or log.concurrent_appends,
                                        thread_name_prefix="effectlog-aio")
        self._pacer = Pacer()

    async def __aenter__(self) -> AsyncWorker:
        """Connect the log off the loop (on Kafka: the producer id), so no first call pays."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self._warm)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the worker's threads once their calls are done (without blocking the loop),
        and close the judge it opened."""
        await asyncio.get_running_loop().run_in_executor(None, self._pool.shutdown)
        await asyncio.to_thread(self._close_judge)

    # -- reads ---------------------------------------------------------------------------

    async def get(self, key: str) -> EffectEvent | None:
        """The key's current snapshot, or None."""
        return await self._run(self._core.load(key, fresh=True))

    async def history(self, key: str) -> list[EffectEvent]:
        """Every decodable event of ``key`` in log order (accepted or not; expiries, the
        key's tombstones, are left out: a key used again after one starts a new effect)."""
        events = await self._off(decode_events, self.log, key)
        return [e for e in events if isinstance(e, EffectEvent)]

    # -- transitions ---------------------------------------------------------------------

    async def create(self, operation_id: str, kind: str, target: str, payload: Any, *,
                     payload_ref: str | None = None) -> EffectEvent:
        """Create the effect, or return the existing one when key and payload match."""
        return await self._run(self._core.create(operation_id, kind, target, payload,
                                                 payload_ref))

    async def claim(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Take the key over with a new fencing epoch from any open state (recovery's)."""
        return await self._run(self._core.claim(key, epoch))

    async def reserve(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Take ownership with a new fencing epoch (RESERVE from CREATED, else CLAIM)."""
        return await self._run(self._core.reserve(key, epoch))

    async def dispatch(self, key: str, *, epoch: int | None = None) -> EffectEvent:
        """Mark DISPATCHED; returns only when that is durable and accepted."""
        return await self._run(self._core.step(key, T.DISPATCH, epoch))

    async def record(self, key: str, status: State | str, result: Any = None, *,
                     source: str = "worker", epoch: int | None = None) -> EffectEvent:
        """Record the provider's outcome: SUCCEEDED or FAILED."""
        return await self._run(self._core.record(key, status, result, source, epoch))

    async def unknown(self, key: str, error: str, *, epoch: int | None = None) -> EffectEvent:
        """Mark UNKNOWN: the dispatch may or may not have reached the provider."""
        return await self._run(self._core.step(key, T.UNKNOWN, epoch, error=error))

    async def await_approval(self, key: str, reason: str, *,
                             epoch: int | None = None) -> EffectEvent:
        """Park an UNKNOWN effect until a person or policy decides."""
        return await self._run(self._core.step(key, T.AWAIT_APPROVAL, epoch, error=reason))

    async def approve(self, key: str, decision: Decision | str, by: str,
                      reason: str) -> EffectEvent:
        """Decide on an UNKNOWN effect: RETRY (back to RESERVED) or ABANDON, with a new epoch."""
        return await self._run(self._core.approve(key, decision, by, reason))

    async def write(self, *events: EffectEvent) -> EffectEvent:
        """Append already-checked events of one key, in order, as one durable append."""
        return await self._run(self._core.write(*events))

    # -- guarded provider call -----------------------------------------------------------

    @asynccontextmanager
    async def effect(self, operation_id: str, kind: str, target: str, payload: Any, *,
                     payload_ref: str | None = None) -> AsyncIterator[AsyncEffectCall]:
        """Create, reserve and dispatch; the block performs the call and records it.

        An exception in the block (a cancellation too) marks the effect UNKNOWN
        (``ProviderFailed`` records FAILED) and is raised again, also when the key was settled
        meanwhile (then it is not marked); leaving the block without recording marks it too.
        """
        event, done = await self._run(self._core.begin(operation_id, kind, target, payload,
                                                       payload_ref))
        call = AsyncEffectCall(self, event, payload, done=done)
        if call.done:
            yield call
            return
        try:
            yield call
        except ProviderFailed as exc:
            await call.failed(failed_result(exc))
            raise
        except BaseException as exc:
            if call.outcome is None:
                await self._unknown_for(call, exc)
            raise
        if call.outcome is None:
            await self.unknown(call.key, UNRECORDED)

    async def _unknown_for(self, call: AsyncEffectCall, exc: BaseException) -> None:
        """Mark the effect UNKNOWN for ``exc``, raised in the block. When the log refuses
        because the key was settled meanwhile (the RECORD landed although the caller was
        cancelled), the caller gets ``exc`` itself, as it does when ``exc`` is the log's refusal
        of its own write; a key another owner took over raises the refusal."""
        try:
            await self.unknown(call.key, unknown_reason(exc))
        except Conflict as refusal:
            current = None if isinstance(exc, Conflict) else await self.get(call.key)
            if current is not None and (current.fencing_epoch, current.worker_id) != \
                    (call.fencing_epoch, self.worker_id):
                raise  # another owner took the key over: that is what the caller must hear
            logger.info("%s: not marked UNKNOWN after %s: %s", call.key, type(exc).__name__,
                        refusal)

    async def perform(self, operation_id: str, kind: str, target: str, payload: Any,
                      fn: Callable[[AsyncEffectCall], Any], *,
                      payload_ref: str | None = None) -> Any:
        """Run ``fn(call)`` as the provider call and record what it returns.

        ``fn`` may be ``async def`` (awaited) or plain (run in a thread, so a blocking
        client does not stall the loop; an awaitable it returns is awaited). Same key and
        payload twice returns the recorded result without calling ``fn``.
        """
        async with self.effect(operation_id, kind, target, payload,
                               payload_ref=payload_ref) as call:
            if call.done:
                return call.result
            if inspect.iscoroutinefunction(fn):
                result = await fn(call)
            else:
                result = await asyncio.to_thread(fn, call)
                if inspect.isawaitable(result):
                    result = await result
            await call.succeeded(result)
            return result

    # -- plumbing ------------------------------------------------------------------------

    async def _run(self, steps: Steps[R]) -> R:
        """Run a core operation, answering its requests off the loop (see ``drive``)."""
        reply: Any = None
        error: BaseException | None = None
        while True:
            await self._pacer.turn()
            started = time.perf_counter()
            try:
                request = steps.send(reply) if error is None else steps.throw(error)
            except StopIteration as stop:
                result: R = stop.value
                return result
            finally:
                self._pacer.used += time.perf_counter() - started
            try:
                reply, error = await self._answer(request), None
            except BaseException as exc:  # handed to the operation, which re-raises
                reply, error = None, exc

    async def _answer(self, request: Request[Any]) -> Any:
        if isinstance(request, Ask):
            judge = self.judge
            assert judge is not None
            return (await self._off(judge.ask, [request.query]))[0]
        return await self._off(answer_log, self.log, request, self._core.codec)

    async def _off(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)


class Pacer:
    """Bounds the worker's own CPU work per event-loop iteration.

    Each core step (building, checking and encoding events) takes ~0.1 ms; a hundred effects
    started at once would run a hundred of them in one iteration and hold timers back for
    10+ ms. Once ``budget`` seconds are used in an iteration, further steps wait for the next
    one (``asyncio.sleep(0)``), so timers and other tasks run in between.
    """

    def __init__(self, budget: float = 0.0005) -> None:
        self.budget = budget
        self.used = 0.0
        self._reset_pending = False

    async def turn(self) -> None:
        while self.used >= self.budget:
            if not self._reset_pending:
                asyncio.get_running_loop().call_soon(self._reset)  # runs first next iteration
                self._reset_pending = True
            await asyncio.sleep(0)

    def _reset(self) -> None:
        self.used = 0.0
        self._reset_pending = False


class AsyncEffectCall(CallBase):
    """The dispatched effect handed to an async provider call; its recorders are awaited."""

    def __init__(self, worker: AsyncWorker, event: EffectEvent, payload: Any,
                 done: bool = False) -> None:
        super().__init__(event, payload, done)
        self._worker = worker

    async def succeeded(self, result: Any = None) -> EffectEvent:
        """Record SUCCEEDED with the provider's result."""
        return await self._record(State.SUCCEEDED, result)

    async def failed(self, result: Any = None) -> EffectEvent:
        """Record FAILED: the provider definitively refused."""
        return await self._record(State.FAILED, result)

    async def _record(self, state: State, result: Any) -> EffectEvent:
        event = await self._worker.record(self.key, state, result)
        self.outcome = event.outcome
        return event
