"""The proxy's client of the upstream MCP server: one connection, re-made when it breaks.

The SDK's :class:`mcp.Client` is held open by a task of its own, so a transport that dies
ends that task and not the proxy; the next call connects again (a stdio upstream is spawned
again). Calls are sent with the raw ``tools/call`` params, so fields the SDK's models do not
know still reach the server, and the result is not re-validated on the way (the proxy
forwards or records what the upstream answered).

A call's failure is told apart the way the recovery table needs it: :class:`UpstreamRefused`
is a JSON-RPC error saying the call was not run (malformed, unknown method, invalid params);
:class:`UpstreamInDoubt` is everything else after the request may have left (no answer in
time, connection lost, an internal error): the effect may have happened.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

import anyio
import mcp_types as types
from anyio.abc import TaskGroup, TaskStatus
from mcp import Client, StdioServerParameters
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from effectlog.errors import BackendUnavailable
from effectlog.mcp.config import UpstreamSpec

logger = logging.getLogger(__name__)

#: JSON-RPC errors that say the request was refused before the tool ran.
REFUSED_CODES = frozenset({types.PARSE_ERROR, types.INVALID_REQUEST, types.METHOD_NOT_FOUND,
                           types.INVALID_PARAMS})
RESERVED_META = "io.modelcontextprotocol/"
MAX_PAGES = 100


class UpstreamUnavailable(BackendUnavailable):
    """The upstream could not be reached: nothing was sent (exit 4 at start)."""


class UpstreamRefused(Exception):
    """The upstream answered with a JSON-RPC error saying the call was not run."""

    def __init__(self, error: types.ErrorData) -> None:
        super().__init__(error.message)
        self.error = error


class UpstreamInDoubt(Exception):
    """No usable answer after the request may have left: the effect may have happened."""


class _RawToolCall(types.Request[dict[str, Any], Literal["tools/call"]]):
    """``tools/call`` with params sent as they are (the SDK's model drops unknown fields)."""

    method: Literal["tools/call"] = "tools/call"
    params: dict[str, Any]


@dataclass
class _Connection:
    client: Client
    closing: anyio.Event = field(default_factory=anyio.Event)
    broken: bool = False


class Upstream:
    """A reconnecting client of one upstream server; enter it inside the proxy's event loop."""

    def __init__(self, spec: UpstreamSpec, errlog: TextIO | None = None) -> None:
        self.spec = spec
        self._errlog = errlog or sys.stderr
        self._tg: TaskGroup | None = None
        self._conn: _Connection | None = None
        self._lock = anyio.Lock()

    @asynccontextmanager
    async def running(self, *, connect: bool = True) -> AsyncIterator[Upstream]:
        """Keep a connection until exit; with ``connect``, connect first (raising
        :class:`UpstreamUnavailable`), else on the first call."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                if connect:
                    await self.session()
                yield self
            finally:
                if self._conn is not None:
                    self._conn.closing.set()
                self._tg = None
                tg.cancel_scope.cancel()

    async def session(self) -> ClientSession:
        """The connected session, connecting first if there is none or it broke."""
        async with self._lock:
            conn = self._conn
            if conn is None or conn.broken:
                if conn is not None:
                    conn.closing.set()
                assert self._tg is not None, "Upstream used outside running()"
                self._conn = conn = await self._tg.start(self._hold)
            return conn.client.session

    def mark_broken(self) -> None:
        """Connect again on the next call (the transport failed)."""
        if self._conn is not None:
            self._conn.broken = True

    async def _hold(self, *, task_status: TaskStatus[_Connection]) -> None:
        conn: _Connection | None = None
        try:
            async with Client(self._server(), cache=None) as client:
                conn = _Connection(client)
                task_status.started(conn)
                await conn.closing.wait()
        except Exception as exc:
            if conn is None:
                raise UpstreamUnavailable(f"cannot reach the upstream MCP server "
                                          f"{self.spec.describe()}: {_describe(exc)}") from None
            logger.warning("upstream connection ended: %s", _describe(exc))
            conn.broken = True

    def _server(self) -> StdioServerParameters | str:
        if self.spec.url:
            return self.spec.url
        command, *args = self.spec.command
        return StdioServerParameters(command=command, args=args, cwd=self.spec.cwd,
                                     env={**os.environ, **self.spec.env})

    # -- calls -----------------------------------------------------------------------------

    async def list_tools(self, cursor: str | None = None) -> types.ListToolsResult:
        """One page of the upstream's tools, as it answered."""
        session = await self.session()
        try:
            return await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
        except MCPError as exc:
            self._note(exc)
            raise
        except Exception as exc:  # the transport failed: connect again next time
            self.mark_broken()
            raise UpstreamInDoubt(_describe(exc)) from exc

    async def all_tools(self) -> list[types.Tool]:
        """Every tool, through at most ``MAX_PAGES`` pages."""
        tools: list[types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.list_tools(cursor)
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                return tools
        raise UpstreamUnavailable(f"the upstream's tools/list did not end in {MAX_PAGES} pages")

    async def call_tool(self, params: Mapping[str, Any], timeout_s: float | None = None
                        ) -> types.CallToolResult:
        """Forward a ``tools/call`` (raw params); errors come back as the upstream sent them
        (:class:`MCPError`) and transport failures as :class:`UpstreamInDoubt`."""
        session = await self.session()
        try:
            return await session.send_request(
                _RawToolCall(params=forwarded(params)), types.CallToolResult,
                request_read_timeout_seconds=timeout_s or self.spec.timeout_s)
        except MCPError as exc:
            self._note(exc)
            raise
        except Exception as exc:  # a transport or a malformed answer: the request may have left
            self.mark_broken()
            raise UpstreamInDoubt(_describe(exc)) from exc

    async def call_effect(self, params: Mapping[str, Any]) -> types.CallToolResult:
        """:meth:`call_tool` for an effect: every failure is refused or in doubt."""
        try:
            return await self.call_tool(params)
        except MCPError as exc:
            if exc.error.code in REFUSED_CODES:
                raise UpstreamRefused(exc.error) from exc
            raise UpstreamInDoubt(f"{exc.error.message} (JSON-RPC error {exc.error.code})") from exc

    def _note(self, exc: MCPError) -> None:
        if exc.error.code == types.CONNECTION_CLOSED:
            self.mark_broken()


def forwarded(params: Mapping[str, Any]) -> dict[str, Any]:
    """Raw params as the upstream gets them: the SDK's own ``_meta`` entries and the
    client's progress token left out (the proxy's session stamps its own)."""
    out = dict(params)
    meta = out.get("_meta")
    if isinstance(meta, dict):
        kept = {k: v for k, v in meta.items()
                if not k.startswith(RESERVED_META) and k != "progressToken"}
        if kept:
            out["_meta"] = kept
        else:
            out.pop("_meta")
    return out


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:300]
