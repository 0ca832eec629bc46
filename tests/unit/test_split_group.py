"""A worker whose CREATE lost to another's identical CREATE still wins with its own DISPATCH.

On Kafka the three records a worker writes to begin an effect (CREATE, RESERVE, DISPATCH) are
one produce, but not one transaction: another writer's records can land between them. Found
in `make test` (two processes racing for one key): racer 1's CREATE landed first, then racer
0's three records, then the rest of racer 1's. The judge accepted racer 0's RESERVE and
DISPATCH on racer 1's CREATE and rejected racer 0's CREATE as a second creation; racer 0 read
the refusal as a lost race, found the key DISPATCHED (by itself) and gave up in doubt, and so
did racer 1: nobody called the provider. The verdict on a worker's own DISPATCH is what
decides (the rules accept one DISPATCH per claim, and only on its writer's claim).
"""

from __future__ import annotations

import contextlib
from typing import Any

from effectlog.errors import EffectlogError
from effectlog.judge.premises import worker_fingerprint
from effectlog.judge.query import Answer
from effectlog.log.base import EVENTS
from effectlog.model import State
from effectlog.worker.requests import Append, Ask, Identity
from tests.unit.test_one_judge_model import OneJudge, Steps


def run_until_append(machine: OneJudge, steps: Steps, reply: Any = None) -> Append | None:
    """Drive ``steps``, answering its questions (the judge catching up first), until it
    asks to append; None when it ended."""
    while True:
        try:
            request = steps.send(reply)
        except StopIteration:
            return None
        if isinstance(request, Append):
            return request
        if isinstance(request, Identity):
            reply = machine.log.identity()
        elif isinstance(request, Ask):
            machine.project(10_000)
            found = machine.judge.read(request.query, worker_fingerprint(),
                                       request.query.applied_at_least)
            assert isinstance(found, Answer), found
            reply = found
        else:
            raise AssertionError(f"unexpected {request!r}")


def finish(machine: OneJudge, steps: Steps, append: Append | None) -> None:
    """Let ``steps`` run to its end, its appends written whole."""
    while append is not None:
        positions = machine.log.append_ordered(EVENTS, [(append.key, v) for v in append.data])
        append = run_until_append(machine, steps, positions)


def test_the_worker_whose_dispatch_was_accepted_calls_the_provider_once() -> None:
    machine = OneJudge()
    try:
        machine.start()
        first, second = machine.workers[0], machine.workers[1]
        racer1 = machine._perform(second.core, "a")
        racer0 = machine._perform(first.core, "a")
        group1 = run_until_append(machine, racer1)
        group0 = run_until_append(machine, racer0)
        assert group1 is not None and group0 is not None
        # racer 1's CREATE lands, then racer 0's three records, then the rest of racer 1's
        [create1] = machine.log.append_ordered(EVENTS, [(group1.key, group1.data[0])])
        after0 = machine.log.append_ordered(EVENTS, [(group0.key, v) for v in group0.data])
        finish(machine, racer0, run_until_append(machine, racer0, after0))
        rest1 = machine.log.append_ordered(EVENTS, [(group1.key, v) for v in group1.data[1:]])
        with contextlib.suppress(EffectlogError):  # the late racer may end in doubt
            finish(machine, racer1, run_until_append(machine, racer1, [create1, *rest1]))
        machine.project(10_000)
        key = group0.key
        assert machine.calls[key] == 1, machine.calls
        states = [e.state for e in _accepted(machine, key)]
        assert states[-1] is State.SUCCEEDED, states
    finally:
        machine.teardown()


def _accepted(machine: OneJudge, key: str) -> list[Any]:
    from tests.unit.test_one_judge_model import fold_accepted

    return fold_accepted(machine.log, key)
