"""``effectlog mcp`` when the upstream answered but its RECORD was refused or failed: the agent
gets the settled outcome every repeat would get, a conflict when the log settled it otherwise,
and "in doubt" only while nothing is settled; the upstream is called once throughout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from effectlog.errors import BackendUnavailable
from effectlog.log.base import Position
from effectlog.log.sqlite import SqliteLog
from effectlog.mcp.config import parse_config
from effectlog.mcp.effects import EffectCaller
from effectlog.mcp.operations import OperationIds
from effectlog.mcp.results import META_REPLAYED, META_STATE
from effectlog.model import State
from effectlog.worker import AsyncWorker, Worker

pytestmark = pytest.mark.timeout(60)

CONFIG = {"upstream": {"command": ["true"]},
          "effects": {"charge": {"kind": "payment.charge", "target": "customer:{customer}",
                                 "operation_id": "order_id"}}}
CALL = {"name": "charge", "arguments": {"customer": "c1", "amount": 5, "order_id": "o-1"}}
KEY = "agent:o-1:payment.charge:customer:c1"


class RecordFails(SqliteLog):
    """``after_write``: the next append reports a failure once written; ``before_write``:
    the next append fails before anything is written."""

    after_write = False
    before_write = False

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        if self.before_write:
            self.before_write = False
            raise BackendUnavailable("the disk is gone")
        written = super().append_after(topic, key, values, last_offset)
        if self.after_write:
            self.after_write = False
            raise BackendUnavailable("no answer from the disk after the commit")
        return written


class Upstream:
    """Answers ``error`` or success, after running ``meanwhile`` (what happens during the call)."""

    def __init__(self, meanwhile: Callable[[], None], *, error: bool = False) -> None:
        self.meanwhile, self.error, self.calls = meanwhile, error, 0

    async def session(self) -> object:
        return object()

    async def call_effect(self, params: dict[str, Any]) -> types.CallToolResult:
        self.calls += 1
        self.meanwhile()
        return types.CallToolResult(content=[types.TextContent(type="text", text="charged")],
                                    is_error=self.error)


def reconciled(log: SqliteLog, state: State) -> Callable[[], None]:
    def settle() -> None:  # a reconciler takes the key over and records what its lookup found
        reconciler = Worker(log, "reconciler")
        reconciler.claim(KEY)
        reconciler.record(KEY, state, {"found": state is State.SUCCEEDED}, source="lookup")
    return settle


def call(log: SqliteLog, upstream: Upstream) -> types.CallToolResult:
    async def main() -> types.CallToolResult:
        async with AsyncWorker(log, "mcp:p") as worker:
            caller = EffectCaller(worker, upstream, OperationIds("run"))  # type: ignore[arg-type]
            return await caller.call(parse_config(CONFIG).effects["charge"], CALL)
    return anyio.run(main)


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@pytest.fixture
def log(tmp_path: Path) -> RecordFails:
    return RecordFails(tmp_path / "log.db")


def test_a_record_that_lost_to_a_reconciler_answers_its_settled_result(log: RecordFails) -> None:
    upstream = Upstream(reconciled(log, State.SUCCEEDED))
    answer = call(log, upstream)
    assert not answer.is_error, text(answer)
    assert "in doubt" not in text(answer) and '"found": true' in text(answer)
    assert answer.meta is not None and answer.meta[META_REPLAYED] is True
    assert answer.meta[META_STATE] == "SUCCEEDED" and upstream.calls == 1
    repeat = call(log, Upstream(lambda: None))
    assert text(repeat) == text(answer) and upstream.calls == 1


def test_a_success_the_log_settled_failed_meanwhile_is_a_conflict(log: RecordFails) -> None:
    upstream = Upstream(reconciled(log, State.FAILED))
    answer = call(log, upstream)
    assert answer.is_error and text(answer).startswith("conflict: the upstream answered success")
    assert "settled FAILED by lookup" in text(answer) and "in doubt" not in text(answer)
    assert Worker(log, "r").get(KEY).state is State.FAILED  # type: ignore[union-attr]


def test_a_record_written_although_its_append_failed_answers_the_result(log: RecordFails) -> None:
    def fail_after() -> None:
        log.after_write = True
    answer = call(log, Upstream(fail_after))
    assert not answer.is_error and "charged" in text(answer), text(answer)
    assert Worker(log, "r").get(KEY).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_a_record_not_written_leaves_the_call_in_doubt(log: RecordFails) -> None:
    def fail_before() -> None:
        log.before_write = True
    answer = call(log, Upstream(fail_before))
    assert answer.is_error and text(answer).startswith("in doubt:")
    assert "the answer could not be recorded: the disk is gone" in text(answer)
