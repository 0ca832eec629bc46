"""A verdict on a worker's DISPATCH that comes after recovery may have acted is not called on.

Found by the Kafka soak in ``make test``: a worker's DISPATCH was appended while `serve`
instances and the broker were being killed, and the positive verdict on it came 16 s later.
Recovery's deadline (15 s on the log's time) had passed meanwhile: the reconciler looked the key
up at the provider (not found: the worker had not called yet), claimed it and dispatched again,
and the worker, holding its positive verdict, called too. Two executions of one key. A worker now
calls only when the verdict came within ``accept_timeout_s`` of the start of its write; recovery's
``--stuck-after`` must be longer than that (docs/design/one-judge.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from effectlog.judge.query import Answer, Query
from effectlog.log import open_log
from effectlog.log.base import EventLog
from effectlog.model import State
from effectlog.worker import EffectInDoubt, LateVerdict, Worker
from tests.judges import FoldingJudge

KIND, TARGET = "payment.charge", "acct:42"


class SlowVerdicts:
    """A truthful judge whose verdicts on written events take ``delay_s`` to come."""

    def __init__(self, log: EventLog, delay_s: float) -> None:
        self.judge = FoldingJudge(log)
        self.delay_s = delay_s

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        if any(q.written for q in queries):
            time.sleep(self.delay_s)
        return self.judge.ask(queries)

    def close(self) -> None:
        return None


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    handle = open_log(f"sqlite:///{tmp_path}/events.db")
    yield handle
    handle.close()


def test_a_verdict_later_than_the_accept_timeout_is_not_called_on(log: EventLog) -> None:
    calls: list[str] = []
    worker = Worker(log, "slow", judge=SlowVerdicts(log, 0.4), accept_timeout_s=0.2)
    with pytest.raises(LateVerdict, match="not called, left to recovery") as raised:
        worker.perform("op-1", KIND, TARGET, {"cents": 100}, lambda call: calls.append(call.key))
    assert calls == []
    assert isinstance(raised.value, EffectInDoubt)
    # the DISPATCH stands: recovery looks the key up and settles it, exactly once
    state = Worker(log, "reader").get(raised.value.key)
    assert state is not None and state.state is State.DISPATCHED


def test_a_verdict_within_the_accept_timeout_is_called_on(log: EventLog) -> None:
    calls: list[str] = []
    worker = Worker(log, "prompt", judge=SlowVerdicts(log, 0.05), accept_timeout_s=2.0)
    worker.perform("op-2", KIND, TARGET, {"cents": 100}, lambda call: calls.append(call.key))
    assert len(calls) == 1
    again = Worker(log, "again", judge=SlowVerdicts(log, 0.0))
    again.perform("op-2", KIND, TARGET, {"cents": 100}, lambda call: calls.append(call.key))
    assert len(calls) == 1  # finished: replayed, not called


def test_a_late_verdict_on_a_dispatch_step_raises_as_in_perform(log: EventLog) -> None:
    """``Worker.dispatch`` (what ``effectlog append`` and the reconciler call on) is held to
    the same bound: a late positive verdict is no word to call on."""
    worker = Worker(log, "slow", judge=SlowVerdicts(log, 0.4), accept_timeout_s=0.2)
    key = worker.create("op-3", KIND, TARGET, {"cents": 1}).idempotency_key
    worker.reserve(key)
    with pytest.raises(LateVerdict, match="not called, left to recovery"):
        worker.dispatch(key)
    prompt = Worker(log, "prompt", judge=SlowVerdicts(log, 0.0), accept_timeout_s=2.0)
    key = prompt.create("op-4", KIND, TARGET, {"cents": 1}).idempotency_key
    prompt.reserve(key)
    assert prompt.dispatch(key).state is State.DISPATCHED


def test_append_batches_print_no_dispatch_whose_verdict_came_late(log: EventLog) -> None:
    """``effectlog append --server`` prints a DISPATCH line as accepted only when its
    verdict came within the bound: a non-Python worker calls its provider on that word.
    The lines before it are printed; the late DISPATCH fails its line (exit 3)."""
    from effectlog.cli.append_batch import run_batch
    from effectlog.cli.log_commands import _apply
    from effectlog.errors import Fenced

    line = {"operation_id": "op-5", "kind": KIND, "target": TARGET, "worker_id": "w1"}
    requests = [(1, {**line, "transition": "create", "payload": {"cents": 1}}),
                (2, {**line, "transition": "reserve"}), (3, {**line, "transition": "dispatch"})]
    emitted: list[str] = []
    with pytest.raises(Fenced, match=r"line 3: .*not called, left to recovery"):
        run_batch(log, requests, SlowVerdicts(log, 0.4), _apply,
                  lambda event, _: emitted.append(event.transition.value), 0.2)
    assert emitted == ["CREATE", "RESERVE"]
    prompt: list[str] = []
    line = {**line, "operation_id": "op-6"}
    run_batch(log, [(1, {**line, "transition": "create", "payload": {}}),
                    (2, {**line, "transition": "reserve"}),
                    (3, {**line, "transition": "dispatch"})],
              SlowVerdicts(log, 0.0), _apply,
              lambda event, _: prompt.append(event.transition.value), 2.0)
    assert prompt == ["CREATE", "RESERVE", "DISPATCH"]
