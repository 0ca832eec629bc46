"""A LangGraph agent SIGKILLed after the provider answered and before the graph checkpointed,
then resumed from its SQLite checkpoint: exactly one provider execution.

The provider performs every call it receives (``dedupe=0``, like SMTP), so a second send would
show up as a second execution; the control test shows that a plain LangGraph tool killed at the
same point does send twice.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from consumers.table import Action
from effectlog.model import State, Transition
from tests.crash.harness import REPO, STEP_TIMEOUT_S, Env, actions

pytest.importorskip("langgraph.checkpoint.sqlite.aio")
pytestmark = pytest.mark.crash

THREAD = "job-7"
KEY = f"agent:{THREAD}.invoice:email.send:mailto:ann@example.com"


class Agent:
    """``tests.crash.langgraph_agent`` in its own process; its JSON lines read by a thread."""

    def __init__(self, env: Env, *args: str) -> None:
        cmd = [sys.executable, "-m", "tests.crash.langgraph_agent", "--log", env.log_url,
               "--provider", env.provider_spec, "--checkpoints", str(env.tmp / "graph.db"),
               "--thread", THREAD, *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def next_line(self) -> dict[str, Any] | None:
        try:
            return self.lines.get(timeout=STEP_TIMEOUT_S)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"the agent said nothing in {STEP_TIMEOUT_S}s") from None

    def kill_at(self, point: str) -> None:
        line = self.next_line()
        assert line == {"event": "paused", "point": point}, (line, self.stderr())
        self.proc.send_signal(signal.SIGKILL)
        assert self.proc.wait(STEP_TIMEOUT_S) == -signal.SIGKILL

    def finish(self) -> tuple[int, dict[str, Any]]:
        line = self.next_line()
        code = self.proc.wait(STEP_TIMEOUT_S)
        assert line is not None and line["event"] == "done", (code, line, self.stderr())
        return code, line

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read()[-3000:] if self.proc.poll() is not None else ""


def _receipt_in(answer: str) -> Any:
    """The receipt the agent reported, as data: the JSON of a replayed result and of the
    provider's stored one need not list its keys in the same order."""
    prefix = "invoice sent: "
    assert answer.startswith(prefix), answer
    return json.loads(answer[len(prefix):])


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path, f"sqlite:///{tmp_path}/log.db")


def test_killed_after_the_provider_answered_the_resumed_agent_waits_for_lookup_then_sends_once(
        env: Env) -> None:
    Agent(env, "--pause-at", "provider_answered").kill_at("provider_answered")
    assert env.provider.executions(KEY) == 1
    assert env.current(KEY).state is State.DISPATCHED  # type: ignore[union-attr]

    code, done = Agent(env, "--resume").finish()  # resumed from the checkpoint: in doubt
    assert (code, done["status"], done["key"]) == (5, "in_doubt", KEY)
    assert env.provider.calls(KEY) == 1  # the resumed tool did not call again

    assert actions(env.settle(), KEY) == [Action.RECORD]  # looked up, recorded, not re-sent
    code, done = Agent(env, "--resume").finish()
    assert (code, done["status"]) == (0, "completed")
    receipt = env.provider.lookup(KEY).outcome.result  # type: ignore[union-attr]
    assert _receipt_in(done["answer"]) == receipt
    assert env.provider.executions(KEY) == 1 and env.provider.total_executions() == 1


def test_killed_before_the_checkpoint_the_resumed_agent_replays_the_recorded_result(
        env: Env) -> None:
    Agent(env, "--pause-at", "before_checkpoint").kill_at("before_checkpoint")
    assert env.current(KEY).state is State.SUCCEEDED  # type: ignore[union-attr]

    code, done = Agent(env, "--resume").finish()
    assert (code, done["status"]) == (0, "completed")
    receipt = env.provider.lookup(KEY).outcome.result  # type: ignore[union-attr]
    assert _receipt_in(done["answer"]) == receipt
    assert env.provider.calls(KEY) == 1 and env.provider.total_executions() == 1
    assert [e.transition for e in env.history(KEY)] == [
        Transition.CREATE, Transition.RESERVE, Transition.DISPATCH, Transition.RECORD]


def test_a_plain_langgraph_tool_killed_at_the_same_point_sends_twice(env: Env) -> None:
    Agent(env, "--naive", "--pause-at", "before_checkpoint").kill_at("before_checkpoint")
    code, done = Agent(env, "--naive", "--resume").finish()
    assert (code, done["status"]) == (0, "completed")
    assert env.provider.executions(KEY) == 2  # LangGraph re-ran the tool from its checkpoint
