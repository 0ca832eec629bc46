"""The proxy: an MCP server (the SDK's low-level ``Server``) in front of the upstream.

``tools/list`` is the upstream's, unchanged. A ``tools/call`` of a tool the config names is an
effect (:class:`~effectlog.mcp.effects.EffectCaller`); any other tool is forwarded as it came
(with ``[proxy] passthrough = "read-only"``, only tools the upstream marks ``readOnlyHint``).
The raw request params are read from the handler's context, because the SDK's params model
drops fields it does not know (SEP-3182's ``idempotencyKey``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from effectlog.mcp import results
from effectlog.mcp.config import ProxyConfig
from effectlog.mcp.effects import EffectCaller
from effectlog.mcp.upstream import Upstream, UpstreamInDoubt, UpstreamUnavailable, forwarded

logger = logging.getLogger(__name__)

NAME = "effectlog-mcp"
STARTUP_S = 30.0  # how long the HTTP listener may take to bind before the start line is skipped


@dataclass(frozen=True, slots=True)
class Listening:
    """Where the proxy serves: stdio (``host`` None) or streamable HTTP."""

    host: str | None = None
    port: int = 0
    path: str = "/mcp"


class Proxy:
    """The handlers of one proxy process, shared by all its client sessions."""

    def __init__(self, config: ProxyConfig, upstream: Upstream, caller: EffectCaller,
                 read_only: frozenset[str], instructions: str | None = None) -> None:
        self.config = config
        self.upstream = upstream
        self.caller = caller
        self.read_only = read_only
        self.server: Server[Any] = Server(
            NAME, version=_version(), instructions=instructions,
            on_list_tools=self.list_tools, on_call_tool=self.call_tool)

    async def list_tools(self, ctx: ServerRequestContext[Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        try:
            page = await self.upstream.list_tools(params.cursor if params else None)
        except (UpstreamInDoubt, UpstreamUnavailable) as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=f"upstream: {exc}") from exc
        return types.ListToolsResult(tools=page.tools, next_cursor=page.next_cursor)

    async def call_tool(self, ctx: ServerRequestContext[Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        raw: Mapping[str, Any] = ctx.params or {}
        effect = self.config.effects.get(params.name)
        if effect is not None:
            return await self.caller.call(effect, raw)
        if self.config.passthrough == "read-only" and params.name not in self.read_only:
            return results.refused(f"tool {params.name!r} is neither an effect in "
                                   f"{self.config.source} nor read-only (passthrough = read-only)")
        try:
            answer = await self.upstream.call_tool(forwarded(raw))
        except (UpstreamInDoubt, UpstreamUnavailable) as exc:
            raise MCPError(code=types.INTERNAL_ERROR, message=f"upstream: {exc}") from exc
        record = results.record_of(answer)
        return types.CallToolResult.model_validate(record)

    async def serve(self, where: Listening, ready: Callable[[str], None]) -> None:
        """Serve until the client goes away (stdio) or SIGTERM/SIGINT (HTTP); ``ready`` is
        told where (``stdio`` or the URL, with the port picked for port 0)."""
        if where.host is None:
            async with stdio_server() as (read, write):
                ready("stdio")
                await self.server.run(read, write, self.server.create_initialization_options())
            return
        import uvicorn

        app = self.server.streamable_http_app(host=where.host, streamable_http_path=where.path)
        config = uvicorn.Config(app, host=where.host, port=where.port, log_level="warning",
                                lifespan="on")
        http = uvicorn.Server(config)
        async with anyio.create_task_group() as tg:
            tg.start_soon(http.serve)
            with anyio.move_on_after(STARTUP_S):
                while not http.started and not http.should_exit:
                    await anyio.sleep(0.01)
            if http.started:
                port = http.servers[0].sockets[0].getsockname()[1] if http.servers else where.port
                host = f"[{where.host}]" if ":" in where.host else where.host
                ready(f"http://{host}:{port}{where.path}")


def unguarded(config: ProxyConfig, tools: list[types.Tool]) -> list[str]:
    """Tools that pass through although they may change something (not read-only)."""
    return sorted(t.name for t in tools if t.name not in config.effects
                  and not (t.annotations and t.annotations.read_only_hint))


def read_only(tools: list[types.Tool]) -> frozenset[str]:
    return frozenset(t.name for t in tools if t.annotations and t.annotations.read_only_hint)


def announce(text: str) -> None:
    """One line on stderr (stdout is the MCP channel in stdio mode)."""
    print(f"effectlog mcp: {text}", file=sys.stderr, flush=True)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("effectlog")
    except PackageNotFoundError:
        return ""
