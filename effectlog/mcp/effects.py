"""One effect tool call, with the semantics of ``@effectlog.effect``.

- a finished effect returns its recorded result and the upstream is not called;
- an effect in doubt (DISPATCHED, UNKNOWN, awaiting approval) returns a tool error that says
  so, and the upstream is not called again;
- the same key with other arguments is refused;
- an upstream tool error result is recorded FAILED (and returned), a JSON-RPC refusal too
  (and raised again on every repeat);
- no answer (timeout, lost connection) leaves the effect UNKNOWN.

The idempotency key and fencing epoch reach the upstream in the request's ``_meta``
(``effectlog/idempotencyKey``, ``effectlog/fencingEpoch``) and, where configured, as arguments.
Once dispatched, a call runs to its recorded end even if the client cancels it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from effectlog.errors import EffectlogError, InvalidInput, PayloadMismatch
from effectlog.keys import make_key
from effectlog.mcp import results
from effectlog.mcp.config import ToolEffect
from effectlog.mcp.operations import RUN_META, Operation, OperationIds
from effectlog.mcp.upstream import (
    Upstream,
    UpstreamInDoubt,
    UpstreamRefused,
    UpstreamUnavailable,
)
from effectlog.model import EffectEvent, State
from effectlog.worker import AsyncEffectCall, AsyncWorker, EffectInDoubt

logger = logging.getLogger(__name__)


class _Retry:
    """What :meth:`EffectCaller._perform` returns when the call should be made once more."""


RETRY = _Retry()


@dataclass
class _Sent:
    """A call handed to the upstream; ``failed`` is None until the upstream answered."""

    call: AsyncEffectCall
    failed: bool | None = None


class _NothingSent(Exception):
    """The log refused or failed before the upstream was called."""

    def __init__(self, error: EffectlogError) -> None:
        super().__init__(str(error))
        self.error = error


class EffectCaller:
    """Performs effect tool calls through one worker and one upstream connection."""

    def __init__(self, worker: AsyncWorker, upstream: Upstream, ids: OperationIds) -> None:
        self.worker = worker
        self.upstream = upstream
        self.ids = ids

    async def call(self, effect: ToolEffect, params: Mapping[str, Any]) -> types.CallToolResult:
        """Answer one raw ``tools/call`` of ``effect``'s tool."""
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            return results.refused("arguments must be an object")
        try:
            target = effect.target.render(arguments)
            wanted = self.ids.resolve(effect, params, target)
            payload = effect.payload(arguments)
        except InvalidInput as exc:
            return results.refused(str(exc))
        try:
            await self.upstream.session()  # connect before anything is written
        except UpstreamUnavailable as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=f"{exc}; nothing was sent") from exc
        operation = self.ids.take(wanted)  # a run number only for an effect about to be written
        with anyio.CancelScope(shield=True):  # once dispatched, the outcome is recorded
            try:
                answer = await self._perform(effect, params, operation, target, payload)
                if isinstance(answer, _Retry):  # approved for a retry since this worker saw it
                    answer = await self._perform(effect, params, operation, target, payload,
                                                 again=True)
            except _NothingSent as exc:
                self.ids.give_back(wanted, operation)  # the agent's retry meets the same key
                raise MCPError(code=types.INTERNAL_ERROR,
                               message=f"effectlog: {exc.error}; nothing was sent") from exc.error
        assert isinstance(answer, types.CallToolResult)
        return answer

    async def _perform(self, effect: ToolEffect, params: Mapping[str, Any],
                       operation: Operation, target: str, payload: dict[str, Any], *,
                       again: bool = False) -> types.CallToolResult | _Retry:
        sent: _Sent | None = None
        try:
            async with self.worker.effect(operation.operation_id, effect.kind, target, payload,
                                          payload_ref=effect.payload_ref) as call:
                if call.done:
                    return results.replay(call.event, effect, operation)
                sent = _Sent(call)
                return await self._send(effect, params, sent)
        except EffectInDoubt as exc:
            return await self._settled_since(exc.event, effect, operation, again)
        except PayloadMismatch as exc:
            return results.refused(f"this operation was already called with other arguments "
                                   f"({exc})", key=_key(operation.operation_id, effect, target))
        except UpstreamInDoubt as exc:
            assert sent is not None
            current = await self._current(sent.call)
            return results.in_doubt(current, effect, f"no answer from the upstream: {exc}",
                                    operation)
        except UpstreamUnavailable as exc:  # the reconnect failed after the dispatch was logged
            assert sent is not None
            current = await self._current(sent.call)
            return results.in_doubt(current, effect, f"the upstream could not be reached after "
                                    f"the dispatch was logged: {exc}", operation)
        except EffectlogError as exc:
            if sent is None:  # the log refused or failed before anything was sent
                raise _NothingSent(exc) from exc
            return await self._unrecorded(sent, effect, operation, exc)

    async def _send(self, effect: ToolEffect, params: Mapping[str, Any],
                    sent: _Sent) -> types.CallToolResult:
        call = sent.call
        try:
            answer = await self.upstream.call_effect(
                outgoing(effect, params, call.key, call.fencing_epoch))
        except UpstreamRefused as exc:
            sent.failed = True
            await call.failed(results.refusal_record(exc.error))
            raise MCPError.from_error_data(exc.error) from None
        record = results.record_of(answer)
        sent.failed = answer.is_error
        event = await (call.failed(record) if answer.is_error else call.succeeded(record))
        return results.tool_result(record, call.key, event.state, replayed=False)

    async def _unrecorded(self, sent: _Sent, effect: ToolEffect, operation: Operation,
                          exc: EffectlogError) -> types.CallToolResult:
        """The log refused or failed after the dispatch. When the upstream had answered, the
        key may be settled anyway (its RECORD landed, or a reconciler recorded first): a
        settled outcome of the answer's kind is what every repeat gets, so it is the answer;
        one of another kind is a conflict the agent is told about. Else the call is in doubt."""
        current = await self._current(sent.call)
        key, state = sent.call.key, current.state
        if sent.failed is not None and state in (State.SUCCEEDED, State.FAILED, State.ABANDONED):
            if state is (State.FAILED if sent.failed else State.SUCCEEDED):
                logger.info("%s: settled %s before this answer was recorded (%s)", key,
                            state.value, exc)
                return results.replay(current, effect, operation)
            logger.warning("%s: the upstream answered %s, the log settled it %s: %s", key,
                           "an error" if sent.failed else "success", state.value, exc)
            return results.conflict(current, sent.failed)
        logger.warning("%s: the answer could not be recorded: %s", key, exc)
        return results.in_doubt(current, effect, f"the answer could not be recorded: {exc}",
                                operation)

    async def _settled_since(self, event: EffectEvent, effect: ToolEffect, operation: Operation,
                             again: bool) -> types.CallToolResult | _Retry:
        """In doubt as the worker last saw it: read the key again, since a reconciler or a
        person may have settled it meanwhile (a long-lived worker keeps what it saw);
        :data:`RETRY` when it was approved for a retry (back to RESERVED)."""
        try:
            fresh = await self.worker.get(event.idempotency_key)
        except EffectlogError:
            fresh = None
        if fresh is not None and fresh.state in (State.CREATED, State.RESERVED) and not again:
            return RETRY
        return results.replay(fresh or event, effect, operation)

    async def _current(self, call: AsyncEffectCall) -> Any:
        """The key's state now, for the in-doubt answer (the dispatched event if unreadable)."""
        try:
            return await self.worker.get(call.key) or call.event
        except EffectlogError:
            return call.event


def outgoing(effect: ToolEffect, params: Mapping[str, Any], key: str,
             epoch: int) -> dict[str, Any]:
    """The raw params the upstream gets: the key and epoch set where configured and in
    ``_meta``; the proxy's own run id left out."""
    out = dict(params)
    arguments = dict(params.get("arguments") or {})
    if effect.key_argument:
        arguments[effect.key_argument] = key
    if effect.epoch_argument:
        arguments[effect.epoch_argument] = epoch
    out["name"] = effect.tool
    out["arguments"] = arguments
    meta = {k: v for k, v in dict(params.get("_meta") or {}).items() if k != RUN_META}
    meta[results.META_KEY] = key
    meta[results.META_EPOCH] = epoch
    out["_meta"] = meta
    return out


def _key(operation_id: str, effect: ToolEffect, target: str) -> str:
    return make_key(operation_id, effect.kind, target)
