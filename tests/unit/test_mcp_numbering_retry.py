"""``effectlog mcp`` and the run's numbering: what calling again does after an answer in doubt,
and that a call which sent nothing takes no run number (a restarted run with the same run id
must meet the key its one call was written under)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from effectlog.errors import BackendUnavailable
from effectlog.log import EVENTS
from effectlog.log.base import Position
from effectlog.log.sqlite import SqliteLog
from effectlog.mcp.config import ToolEffect, parse_config
from effectlog.mcp.effects import EffectCaller
from effectlog.mcp.operations import OperationIds
from effectlog.mcp.upstream import UpstreamInDoubt, UpstreamUnavailable
from effectlog.worker import AsyncWorker

pytestmark = pytest.mark.timeout(60)

CONFIG = {"upstream": {"command": ["true"]},
          "effects": {"charge": {"kind": "payment.charge", "target": "customer:{customer}",
                                 "operation_id": "order_id"}}}
ARGS = {"customer": "c1", "amount": 5}


class FakeUpstream:
    """Counts the calls it performs; ``down`` connects fail, ``silent`` calls get no answer."""

    def __init__(self, *, down: int = 0, silent: bool = False, gone: bool = False) -> None:
        self.performed: list[dict[str, Any]] = []
        self.down = down
        self.silent = silent
        self.gone = gone  # the reconnect inside the call fails (after the dispatch)

    async def session(self) -> object:
        if self.down > 0:
            self.down -= 1
            raise UpstreamUnavailable("cannot reach the upstream MCP server: connection refused")
        return object()

    async def call_effect(self, params: dict[str, Any]) -> types.CallToolResult:
        if self.gone:
            raise UpstreamUnavailable("cannot reach the upstream MCP server: connection refused")
        self.performed.append(params)
        if self.silent:
            raise UpstreamInDoubt("no answer in 1s")
        return types.CallToolResult(content=[types.TextContent(type="text", text="charged")])

    def keys(self) -> list[str]:
        return [p["_meta"]["effectlog/idempotencyKey"] for p in self.performed]


class FailingFirstAppends(SqliteLog):
    """A log whose first ``failures`` appends fail before anything is written."""

    failures = 0

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        if self.failures > 0:
            self.failures -= 1
            raise BackendUnavailable("the disk is full")
        return super().append_after(topic, key, values, last_offset)


def effect() -> ToolEffect:
    return parse_config(CONFIG).effects["charge"]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def calls(log: SqliteLog, upstream: FakeUpstream, params_list: list[dict[str, Any]],
          run_id: str = "job-7") -> list[types.CallToolResult | MCPError]:
    """Make the calls in order through one proxy process; errors are kept, not raised."""
    answers: list[types.CallToolResult | MCPError] = []

    async def main() -> None:
        async with AsyncWorker(log, "mcp:p") as worker:
            caller = EffectCaller(worker, upstream, OperationIds(run_id))  # type: ignore[arg-type]
            for params in params_list:
                try:
                    answers.append(await caller.call(effect(), params))
                except MCPError as exc:
                    answers.append(exc)

    anyio.run(main)
    return answers


def test_a_run_numbered_call_in_doubt_says_calling_again_is_a_new_effect(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    upstream = FakeUpstream(silent=True)
    plain = {"name": "charge", "arguments": ARGS}
    first, = calls(log, upstream, [plain])
    assert isinstance(first, types.CallToolResult) and first.is_error
    assert "Call again with the same arguments" not in text(first)
    assert "Calling again is a NEW effect" in text(first)
    assert "idempotencyKey 'job-7.1'" in text(first)
    # as told: the same call with the key named meets the first effect, and is not sent again
    keyed = {**plain, "idempotencyKey": "job-7.1"}
    again, = calls(log, upstream, [keyed], run_id="another-run")
    assert isinstance(again, types.CallToolResult) and again.is_error
    assert "in doubt" in text(again) and "Call again with the same arguments" in text(again)
    assert upstream.keys() == ["agent:job-7.1:payment.charge:customer:c1"]
    # a run-numbered call that meets a key in doubt (the job restarted) is told the same
    met, = calls(log, upstream, [plain])
    assert isinstance(met, types.CallToolResult) and "NEW effect" in text(met)
    assert len(upstream.performed) == 1
    log.close()


@pytest.mark.parametrize("params", [
    {"name": "charge", "arguments": ARGS, "idempotencyKey": "k-1"},
    {"name": "charge", "arguments": {**ARGS, "order_id": "o-1"}},
])
def test_a_keyed_call_in_doubt_says_call_again(tmp_path: Path, params: dict[str, Any]) -> None:
    log = SqliteLog(tmp_path / "log.db")
    upstream = FakeUpstream(silent=True)
    first, again = calls(log, upstream, [params, params])
    for answer in (first, again):
        assert isinstance(answer, types.CallToolResult) and answer.is_error
        assert "Call again with the same arguments" in text(answer)
        assert "NEW effect" not in text(answer)
    assert len(upstream.performed) == 1
    log.close()


def test_a_call_refused_before_it_was_written_takes_no_run_number(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    upstream = FakeUpstream(down=1)
    params = {"name": "charge", "arguments": ARGS, "_meta": {"effectlog/runId": "job-42"}}
    refused, done = calls(log, upstream, [params, params])  # unreachable; the agent retries
    assert isinstance(refused, MCPError) and "nothing was sent" in str(refused)
    assert isinstance(done, types.CallToolResult) and not done.is_error
    restarted, = calls(log, upstream, [params])  # the job restarted with its run id
    assert isinstance(restarted, types.CallToolResult)
    assert (restarted.meta or {}).get("effectlog/replayed") is True
    assert upstream.keys() == ["agent:job-42.1:payment.charge:customer:c1"]
    log.close()


def test_a_call_the_log_refused_gives_its_run_number_back(tmp_path: Path) -> None:
    log = FailingFirstAppends(tmp_path / "log.db")
    log.failures = 1
    upstream = FakeUpstream()
    params = {"name": "charge", "arguments": ARGS}
    refused, done = calls(log, upstream, [params, params])
    assert isinstance(refused, MCPError) and "nothing was sent" in str(refused)
    assert isinstance(done, types.CallToolResult) and not done.is_error
    restarted, = calls(log, upstream, [params])
    assert isinstance(restarted, types.CallToolResult)
    assert (restarted.meta or {}).get("effectlog/replayed") is True
    assert upstream.keys() == ["agent:job-7.1:payment.charge:customer:c1"]
    assert len(log.read_key(EVENTS, "agent:job-7.2:payment.charge:customer:c1")) == 0
    log.close()


def test_numbers_given_back_only_while_no_later_call_took_one() -> None:
    ids = OperationIds("run-1")
    wanted = ids.resolve(effect(), {"arguments": ARGS}, "t")
    first, second = ids.take(wanted), ids.take(wanted)
    ids.give_back(wanted, first)  # another call took a number since: kept
    assert ids.take(wanted).operation_id == "run-1.3"
    ids.give_back(wanted, ids.take(wanted))
    assert (second.operation_id, ids.take(wanted).operation_id) == ("run-1.2", "run-1.4")


def test_an_upstream_gone_after_the_dispatch_is_in_doubt_and_says_so(tmp_path: Path) -> None:
    log = SqliteLog(tmp_path / "log.db")
    upstream = FakeUpstream(gone=True)
    answer, = calls(log, upstream, [{"name": "charge", "arguments": ARGS}])
    assert isinstance(answer, types.CallToolResult) and answer.is_error
    assert "could not be reached after the dispatch was logged" in text(answer)
    assert (answer.meta or {}).get("effectlog/state") == "UNKNOWN"
    assert upstream.performed == []
    log.close()
