"""What the agent gets back for an effect tool call, and what the log keeps of it.

The log keeps the upstream's ``CallToolResult`` as JSON (without the SDK's own ``_meta``
entries), so a repeated call returns the same result; a JSON-RPC refusal is kept as
``{"jsonrpcError": {...}}`` and raised again. A call in doubt, refused or abandoned is a tool
error result (``isError``) whose text says what happened, the key, and what happens next;
every result carries the key and state under ``_meta`` (``effectlog/…``).
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from effectlog.mcp.config import ToolEffect
from effectlog.mcp.operations import CLIENT_KEY, Operation
from effectlog.model import EffectEvent, State

RESERVED_META = "io.modelcontextprotocol/"
META_KEY = "effectlog/idempotencyKey"
META_EPOCH = "effectlog/fencingEpoch"
META_STATE = "effectlog/state"
META_REPLAYED = "effectlog/replayed"
RPC_ERROR = "jsonrpcError"


def record_of(result: types.CallToolResult) -> dict[str, Any]:
    """The JSON the log keeps for an upstream result."""
    data = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    data.pop("resultType", None)  # the wire era's; the proxy's own session sets it
    meta = {k: v for k, v in (data.pop("_meta", None) or {}).items()
            if not k.startswith(RESERVED_META)}
    if meta:
        data["_meta"] = meta
    return data


def refusal_record(error: types.ErrorData) -> dict[str, Any]:
    """The FAILED result kept for a JSON-RPC refusal of the call."""
    return {RPC_ERROR: error.model_dump(mode="json", exclude_none=True)}


def tool_result(record: Any, key: str, state: State, *, replayed: bool) -> types.CallToolResult:
    """The agent's answer from a kept record: the original result (a refusal is raised)."""
    if isinstance(record, dict) and RPC_ERROR in record:
        raise MCPError.from_error_data(types.ErrorData.model_validate(record[RPC_ERROR]))
    try:
        result = types.CallToolResult.model_validate(record)
    except ValueError:  # a result recorded by another writer (a lookup, a person): as JSON
        result = text_result(_json_text(record), is_error=state is State.FAILED)
    meta = dict(result.meta or {})
    meta.update({META_KEY: key, META_STATE: state.value, META_REPLAYED: replayed})
    return result.model_copy(update={"meta": meta})


def replay(event: EffectEvent, effect: ToolEffect,
           operation: Operation | None = None) -> types.CallToolResult:
    """What a finished (or settled) effect gives a repeated call, without calling upstream."""
    key = event.idempotency_key
    if event.state in (State.SUCCEEDED, State.FAILED):
        return tool_result(event.outcome.result if event.outcome else None, key, event.state,
                           replayed=True)
    if event.state is State.ABANDONED:
        who = f" by {event.approval.by}: {event.approval.reason}" if event.approval else ""
        return _error(f"abandoned: effect {key} was abandoned{who}. It did not happen and will "
                      "not be sent.", key, event.state)
    return in_doubt(event, effect, operation=operation)


def in_doubt(event: EffectEvent, effect: ToolEffect, reason: str = "",
             operation: Operation | None = None) -> types.CallToolResult:
    """The tool error for an effect that may or may not have happened; what calling again
    does depends on where the call's ``operation`` id came from."""
    key, state = event.idempotency_key, event.state
    why = f" ({reason})" if reason else (f" ({event.error})" if event.error else "")
    if state is State.AWAITING_APPROVAL:
        nxt = (f"it awaits a person's decision: `effectlog approve {key} --decision "
               "retry|abandon` (or the web console)")
    elif effect.lookup:
        nxt = (f"the reconciler asks the upstream's {effect.lookup!r} tool and records what it "
               "finds; if that cannot tell, a person decides (`effectlog approve`)")
    else:
        nxt = (f"no lookup tool is configured, so a person decides: `effectlog approve {key} "
               "--decision retry|abandon` (or the web console)")
    return _error(f"in doubt: effect {key} is {state.value}{why}: the upstream may already have "
                  f"performed it, so it is not sent again. Next: {nxt}.{again(operation)}",
                  key, state)


def conflict(event: EffectEvent, failed: bool) -> types.CallToolResult:
    """The tool error for an upstream answer the log settled otherwise before it was recorded
    (a reconciler's lookup or a person's decision came first): the log's outcome stands."""
    key, state = event.idempotency_key, event.state
    by = f" by {event.approval.by}" if event.approval else (
        f" by {event.outcome.source}" if event.outcome and event.outcome.source else "")
    return _error(f"conflict: the upstream answered {'an error' if failed else 'success'}, "
                  f"but effect {key} was settled {state.value}{by} before that answer could be "
                  f"recorded. The log keeps {state.value}; check the upstream before acting on "
                  "either.", key, state)


def again(operation: Operation | None) -> str:
    """What calling again does: meets the same effect (a client key or an argument names it),
    or, for a call the run numbered, is a new effect unless the call passes the key."""
    if operation is None:
        return ""
    if operation.repeatable:
        return " Call again with the same arguments to get its result once it is settled."
    return (f" Calling again is a NEW effect (the run numbered this call {operation.operation_id}"
            f"): to get this one's result once it is settled, call again with {CLIENT_KEY} "
            f"{operation.operation_id!r} in the params or _meta.")


def refused(message: str, key: str | None = None) -> types.CallToolResult:
    """The tool error for a call refused before anything was sent."""
    result = text_result(f"refused: {message}. Nothing was sent.", is_error=True)
    if key is not None:
        result.meta = {META_KEY: key}
    return result


def text_result(text: str, *, is_error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                is_error=is_error)


def _error(text: str, key: str, state: State) -> types.CallToolResult:
    result = text_result(text, is_error=True)
    result.meta = {META_KEY: key, META_STATE: state.value, META_REPLAYED: False}
    return result


def _json_text(value: Any) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)
