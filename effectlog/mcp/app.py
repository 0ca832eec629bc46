"""One ``effectlog mcp`` process: connect the upstream, check the config against its tools,
and serve the proxy until the client goes away or a signal stops it."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from mcp import types
from mcp.shared.exceptions import MCPError

from effectlog.log.base import EventLog
from effectlog.mcp.config import ProxyConfig, check_tools
from effectlog.mcp.effects import EffectCaller
from effectlog.mcp.operations import OperationIds
from effectlog.mcp.server import Listening, Proxy, announce, read_only, unguarded
from effectlog.mcp.upstream import Upstream, UpstreamInDoubt, UpstreamUnavailable
from effectlog.redact import redact_url
from effectlog.worker import AsyncWorker, default_worker_id

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProxySettings:
    """How the proxy runs (read from the command line once)."""

    listening: Listening = field(default_factory=Listening)
    run_id: str | None = None                 # None: one made up for this process
    worker_id: str = field(default_factory=lambda: f"mcp:{default_worker_id()}")
    server: str | None = None                 # an `effectlog serve` URL (Kafka logs)

    def effective_run_id(self) -> str:
        return self.run_id or f"mcp-{uuid.uuid4().hex[:12]}"


async def run_proxy(config: ProxyConfig, open_log: Callable[[], EventLog],
                    settings: ProxySettings) -> None:
    """Serve ``config``'s upstream as effects on the log ``open_log`` opens (once the upstream
    answered: a proxy that cannot start makes no log); errors at start are raised (one line
    each: the upstream unreachable, the config naming tools it lacks)."""
    ids = OperationIds(settings.effective_run_id())
    upstream = Upstream(config.upstream)
    async with upstream.running():
        try:
            tools = await upstream.all_tools()
        except (UpstreamInDoubt, MCPError) as exc:
            raise UpstreamUnavailable(f"the upstream did not list its tools: {exc}") from exc
        check_tools(config, {t.name: dict(t.input_schema) for t in tools})
        loose = unguarded(config, tools)
        if loose and config.passthrough == "all":
            logger.warning("tools passed through unguarded (not effects, not read-only): %s",
                           ", ".join(loose))
        log = open_log()
        try:
            async with AsyncWorker(log, settings.worker_id, server=settings.server) as worker:
                await _serve(config, upstream, worker, ids, tools, log, settings)
        finally:
            log.close()


async def _serve(config: ProxyConfig, upstream: Upstream, worker: AsyncWorker,
                 ids: OperationIds, tools: list[types.Tool], log: EventLog,
                 settings: ProxySettings) -> None:
    """Serve the proxy of ``upstream``'s ``tools`` until the agent goes."""
    session = await upstream.session()
    proxy = Proxy(config, upstream, EffectCaller(worker, upstream, ids), read_only(tools),
                  session.instructions)
    summary = (f"{len(config.effects)} effect tool(s) of {len(tools)} from "
               f"{config.upstream.describe()} on {redact_url(log.url)}, run id {ids.run_id}")
    await proxy.serve(settings.listening, lambda where: announce(f"{summary}, serving on {where}"))
