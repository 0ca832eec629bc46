"""A LangGraph agent process for the kill tests: a scripted planner, a tool node whose tool is
an effectlog effect, and LangGraph's SQLite checkpointer, so the graph survives the process.

    python -m tests.crash.langgraph_agent --log URL --provider fake:///p.db?dedupe=0 \
        --checkpoints PATH --thread T [--resume] [--pause-at POINT] [--naive]

POINT is ``provider_answered`` (inside the tool, after the provider's answer, before effectlog
records it) or ``before_checkpoint`` (the tool node finished and effectlog recorded the
result; LangGraph has not yet saved the node's writes). At a pause the process prints
``{"event": "paused", ...}`` and waits for stdin; the test SIGKILLs it there. ``--naive`` runs
the same tool without effectlog, to show what the kill does to a plain agent. The last line is
``{"event": "done", ...}``; exit 0 when the graph finished, 5 when the effect was in doubt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Annotated, Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

import effectlog
from consumers.providers import load_provider
from effectlog.log import open_log
from effectlog.provider import Provider

KIND = "email.send"


def say(**line: Any) -> None:
    sys.stdout.write(json.dumps(line, default=str) + "\n")
    sys.stdout.flush()


async def pause(point: str, wanted: str | None) -> None:
    if point == wanted:
        say(event="paused", point=point)
        await asyncio.to_thread(sys.stdin.readline)  # the test kills the process here


class PausingSaver(AsyncSqliteSaver):
    """LangGraph's SQLite checkpointer, pausing before it saves anything that holds the tool's
    message: the node's writes, and the next step's checkpoint, which LangGraph may save in
    the background while the writes are still held (it once did: the resumed graph then
    skipped the tool)."""

    pause_at: str | None = None
    _held = False

    async def aput_writes(self, config: Any, writes: Any, task_id: str,
                          task_path: str = "") -> None:
        if any(isinstance(value, list) and any(isinstance(m, ToolMessage) for m in value)
               for _, value in writes):
            await self._hold()
        await super().aput_writes(config, writes, task_id, task_path)

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        messages = checkpoint.get("channel_values", {}).get("messages", [])
        if any(isinstance(m, ToolMessage) for m in messages):
            await self._hold()
        return await super().aput(config, checkpoint, metadata, new_versions)

    async def _hold(self) -> None:
        """The first save of the tool's message pauses; any later one waits for the kill."""
        if self.pause_at != "before_checkpoint":
            return
        if self._held:
            await asyncio.Event().wait()
        self._held = True
        await pause("before_checkpoint", self.pause_at)


def build_tool(provider: Provider, pause_at: str | None, naive: bool) -> Any:
    async def execute(to: str, amount: int, key: str, epoch: int, payload_hash: str) -> Any:
        result = await asyncio.to_thread(provider.execute, f"mailto:{to}", payload_hash, key,
                                         epoch, {"to": to, "amount": amount})
        await pause("provider_answered", pause_at)
        return result

    if naive:
        @tool
        async def send_invoice(to: str, amount: int,
                               tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
            """Email the invoice for ``amount`` to ``to``."""
            return await execute(to, amount, f"agent:{tool_call_id}:{KIND}:mailto:{to}", 1,
                                 "naive")
        return send_invoice

    @tool
    @effectlog.effect(KIND, target=lambda to, **_: f"mailto:{to}",
                      operation_id=lambda tool_call_id, **_: tool_call_id,
                      exclude=("tool_call_id",))
    async def send_invoice_once(to: str, amount: int,
                                tool_call_id: Annotated[str, InjectedToolCallId]) -> Any:
        """Email the invoice for ``amount`` to ``to``."""
        call = effectlog.current_call()
        return await execute(to, amount, call.key, call.fencing_epoch, call.payload_hash)

    return send_invoice_once


def build_graph(send_invoice: Any, thread: str) -> StateGraph[MessagesState]:
    def plan(state: MessagesState) -> dict[str, Any]:
        """The scripted 'LLM': first ask for the invoice email, then report the receipt."""
        done = [m for m in state["messages"] if isinstance(m, ToolMessage)]
        if done:
            return {"messages": [AIMessage(content=f"invoice sent: {done[-1].content}")]}
        call = {"name": send_invoice.name, "args": {"to": "ann@example.com", "amount": 42},
                "id": f"{thread}.invoice", "type": "tool_call"}
        return {"messages": [AIMessage(content="", tool_calls=[call])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("plan", plan)
    graph.add_node("tools", ToolNode([send_invoice], handle_tool_errors=False))
    graph.add_edge(START, "plan")
    graph.add_conditional_edges("plan", route, ["tools", END])
    graph.add_edge("tools", "plan")
    return graph


async def main_async(args: argparse.Namespace) -> int:
    provider = load_provider(args.provider)
    log = await asyncio.to_thread(open_log, args.log)
    config: Any = {"configurable": {"thread_id": args.thread}}
    try:
        async with PausingSaver.from_conn_string(args.checkpoints) as saver:
            saver.pause_at = args.pause_at
            graph = build_graph(build_tool(provider, args.pause_at, args.naive), args.thread)
            agent = graph.compile(checkpointer=saver)
            start = None if args.resume else {"messages": [("user", "invoice ann for 42")]}
            async with effectlog.AsyncWorker(log, args.worker_id) as worker, \
                    effectlog.run(args.thread, worker=worker):
                try:
                    final = await agent.ainvoke(start, config)
                except effectlog.EffectInDoubt as exc:
                    say(event="done", status="in_doubt", key=exc.key, state=exc.event.state.value)
                    return 5
            say(event="done", status="completed", answer=final["messages"][-1].content)
            return 0
    finally:
        await asyncio.to_thread(log.close)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a LangGraph agent with an effectlog tool")
    parser.add_argument("--log", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--checkpoints", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--worker-id", default="agent-1")
    parser.add_argument("--pause-at", choices=("provider_answered", "before_checkpoint"))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--naive", action="store_true")
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
