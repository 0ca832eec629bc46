"""Provider adapter for effects made by ``effectlog mcp``: the upstream's tools, by config.

``mcp:///path/effects.toml`` (the proxy's own config file) gives the reconciler the upstream
and, per effect kind, the tool and its lookup tool:

- ``lookup(key)`` calls the effect's ``lookup`` tool with ``{lookup_argument: key}``. A tool
  error is *unavailable*; an answer that is empty, ``null`` or ``{"found": false}`` (as
  structured content or as JSON text) is *not found*; anything else is the confirmed result,
  recorded as the effect's SUCCEEDED result. A kind without a lookup tool is unavailable, so
  its effects in doubt go to a person's approval.
- ``execute`` re-sends the tool call with the original arguments (the payload), key and epoch,
  as the proxy does.

The SDK client is async; the adapter keeps one event loop in a daemon thread and one upstream
connection in it, re-made when it breaks.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from effectlog.errors import InvalidInput
from effectlog.keys import split_key
from effectlog.model import Outcome, State
from effectlog.provider import (
    LookupResult,
    LookupStatus,
    ProviderFailed,
    ProviderTimeout,
    ProviderUnavailable,
)

if TYPE_CHECKING:
    from effectlog.mcp.config import ToolEffect

T = TypeVar("T")
#: Seconds a call may take beyond the upstream timeout before the adapter gives up on it.
GRACE_S = 15.0


class McpToolsProvider:
    """Settles and re-sends MCP tool effects through the upstream named in a proxy config."""

    def __init__(self, config: Any) -> None:
        from effectlog.mcp.config import ProxyConfig
        from effectlog.mcp.upstream import Upstream

        assert isinstance(config, ProxyConfig)
        if not config.upstream.command and not config.upstream.url:
            raise InvalidInput(f"{config.source}: the mcp provider needs the upstream in the "
                               "config ([upstream] command or url)")
        self.config = config
        lookups = [e for e in config.effects.values() if e.lookup]
        # one flag per provider: complete only when every lookup tool says so
        self.lookup_complete = bool(lookups) and all(e.lookup_complete for e in lookups)
        self.retention_s = config.upstream.retention_s
        self._upstream = Upstream(config.upstream)
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="effectlog-mcp-provider",
                                        daemon=True)
        self._thread.start()
        self._ready.wait(10)
        atexit.register(self.close)

    @classmethod
    def from_url(cls, spec: str) -> McpToolsProvider:
        """``mcp:///abs/path/effects.toml`` or ``mcp:relative/effects.toml``."""
        try:
            from effectlog.mcp.config import load_config
        except ImportError:
            raise InvalidInput("the mcp provider needs the MCP SDK: pip install "
                               "'effectlog[mcp]'") from None
        path = spec.removeprefix("mcp:")
        path = path[2:] if path.startswith("//") else path
        if not path:
            raise InvalidInput(f"bad provider {spec!r}: use mcp:///path/to/effects.toml")
        return cls(load_config(Path(path)))

    # -- the provider contract ----------------------------------------------------------

    def execute(self, target: str, payload_hash: str, idempotency_key: str,
                fencing_epoch: int, payload: Any) -> Any:
        """Send the tool call again with its original arguments, key and epoch."""
        from effectlog.mcp import results
        from effectlog.mcp.effects import outgoing
        from effectlog.mcp.upstream import UpstreamInDoubt, UpstreamRefused, UpstreamUnavailable

        effect = self._effect(idempotency_key)
        if effect is None:
            raise ProviderUnavailable(f"no MCP tool in {self.config.source} is the effect of "
                                      f"{idempotency_key}")
        if not isinstance(payload, dict):
            raise ProviderFailed(f"{idempotency_key}: the payload is not a tool's arguments")
        params = outgoing(effect, {"name": effect.tool, "arguments": payload},
                          idempotency_key, fencing_epoch)
        try:
            answer = self._call(self._upstream.call_effect(params))
        except UpstreamRefused as exc:
            raise ProviderFailed(f"upstream refused: {exc}", results.refusal_record(exc.error)) \
                from exc
        except UpstreamUnavailable as exc:
            raise ProviderUnavailable(str(exc)) from exc
        except UpstreamInDoubt as exc:
            raise ProviderTimeout(str(exc)) from exc
        record = results.record_of(answer)
        if answer.is_error:
            raise ProviderFailed(f"{effect.tool} answered with a tool error", record)
        return record

    def lookup(self, idempotency_key: str) -> LookupResult:
        """Ask the effect's lookup tool what it knows about the key."""
        from effectlog.mcp import results

        effect = self._effect(idempotency_key)
        if effect is None or effect.lookup is None:
            return LookupResult(LookupStatus.UNAVAILABLE,
                                detail="no lookup tool is configured for this kind")
        params = {"name": effect.lookup, "arguments": {effect.lookup_argument: idempotency_key}}
        try:
            answer = self._call(self._upstream.call_tool(params))
        except Exception as exc:  # an MCP error, the upstream gone: nothing is known
            return LookupResult(LookupStatus.UNAVAILABLE, detail=f"{effect.lookup}: {exc}")
        if answer.is_error:
            return LookupResult(LookupStatus.UNAVAILABLE,
                                detail=f"{effect.lookup} answered with a tool error")
        record = results.record_of(answer)
        if not found(answer.structured_content, record.get("content", [])):
            return LookupResult(LookupStatus.NOT_FOUND, detail=f"{effect.lookup}: not found")
        return LookupResult(LookupStatus.CONFIRMED, Outcome(State.SUCCEEDED, record, "lookup"))

    def close(self) -> None:
        """Close the upstream connection and stop the loop's thread."""
        if self._thread.is_alive() and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)

    # -- plumbing -----------------------------------------------------------------------

    def _effect(self, key: str) -> ToolEffect | None:
        try:
            _, kind, _ = split_key(key)
        except InvalidInput:
            return None
        return self.config.by_kind(kind)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._hold())

    async def _hold(self) -> None:
        self._stop = asyncio.Event()
        async with self._upstream.running(connect=False):
            self._ready.set()
            await self._stop.wait()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.config.upstream.timeout_s + GRACE_S)
        except TimeoutError:
            future.cancel()
            from effectlog.mcp.upstream import UpstreamInDoubt

            raise UpstreamInDoubt("no answer in time") from None


def found(structured: Any, content: list[Any]) -> bool:
    """Whether a lookup tool's answer is a result (not empty, null or ``found: false``)."""
    value = structured
    if value is None:
        texts = [str(c.get("text", "")) for c in content
                 if isinstance(c, dict) and c.get("type") == "text"]
        if not content:
            return False
        if len(texts) != 1:
            return True
        try:
            value = json.loads(texts[0])
        except ValueError:
            return bool(texts[0].strip())
        if value is None:
            return False
    return not (isinstance(value, dict) and value.get("found") is False)
