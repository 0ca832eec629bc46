"""AsyncWorker: the Worker's semantics from asyncio, with the log's blocking calls off the loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from effectlog.errors import Fenced, PayloadMismatch
from effectlog.judge.query import Answer, Query
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.log.base import Position
from effectlog.log.memory import MemoryLog
from effectlog.machine import advance
from effectlog.model import EffectEvent, State, Transition
from effectlog.provider import ProviderFailed, ProviderTimeout
from effectlog.worker import AsyncEffectCall, AsyncWorker, EffectInDoubt, Worker
from effectlog.worker.aio import Pacer
from tests.judges import FoldingJudge

KIND, TARGET = "email.send", "mailto:a@example.com"
R = TypeVar("R")


def key(op: str) -> str:
    return f"agent:{op}:{KIND}:{TARGET}"


def run(factory: Callable[[], Awaitable[R]]) -> R:
    async def main() -> R:
        return await factory()
    return asyncio.run(asyncio.wait_for(main(), 60))


@pytest.fixture(params=["memory", "sqlite"])
def log(request: pytest.FixtureRequest, tmp_path: Path) -> EventLog:
    return open_log("memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/log.db")


def test_full_cycle_writes_one_event_per_transition(log: EventLog) -> None:
    async def main() -> Any:
        async with AsyncWorker(log, "w1") as worker:
            result = await worker.perform("op-1", KIND, TARGET, {"s": "hi"},
                                          lambda call: {"id": call.key})
            return result, await worker.history(key("op-1")), await worker.get(key("op-1"))

    result, history, current = run(main)
    assert result == {"id": key("op-1")}
    assert [e.transition for e in history] == [
        Transition.CREATE, Transition.RESERVE, Transition.DISPATCH, Transition.RECORD]
    assert current.state is State.SUCCEEDED


def test_same_key_and_payload_returns_the_original_result_without_calling(log: EventLog) -> None:
    calls: list[int] = []

    async def send(call: AsyncEffectCall) -> dict[str, int]:
        calls.append(call.fencing_epoch)
        return {"n": len(calls)}

    async def main() -> tuple[Any, Any]:
        async with AsyncWorker(log, "w1") as a, AsyncWorker(log, "w2") as b:
            return (await a.perform("op-1", KIND, TARGET, {"s": 1}, send),
                    await b.perform("op-1", KIND, TARGET, {"s": 1}, send))

    assert run(main) == ({"n": 1}, {"n": 1}) and calls == [1]


def test_same_key_with_another_payload_is_rejected_and_nothing_is_written(log: EventLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as worker:
            await worker.perform("op-1", KIND, TARGET, {"amount": 1}, lambda call: "ok")
            with pytest.raises(PayloadMismatch):
                await worker.perform("op-1", KIND, TARGET, {"amount": 2},
                                     lambda call: pytest.fail("called"))

    run(main)
    assert len(log.read_key(EVENTS, key("op-1"))) == 4


def test_provider_timeout_becomes_unknown_and_a_refusal_failed(log: EventLog) -> None:
    async def times_out(call: AsyncEffectCall) -> None:
        raise ProviderTimeout("no answer in 5s")

    async def refuses(call: AsyncEffectCall) -> None:
        raise ProviderFailed("mailbox does not exist", {"code": 550})

    async def main() -> tuple[EffectEvent | None, EffectEvent | None]:
        async with AsyncWorker(log, "w1") as worker:
            with pytest.raises(ProviderTimeout):
                await worker.perform("op-2", KIND, TARGET, {}, times_out)
            with pytest.raises(ProviderFailed):
                await worker.perform("op-3", KIND, TARGET, {}, refuses)
            return await worker.get(key("op-2")), await worker.get(key("op-3"))

    timed_out, refused = run(main)
    assert timed_out is not None and timed_out.state is State.UNKNOWN
    assert "no answer" in (timed_out.error or "")
    assert refused is not None and refused.state is State.FAILED
    assert refused.outcome is not None and refused.outcome.result == {"code": 550}


def test_effect_in_doubt_is_never_rerun_and_names_its_key(log: EventLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as first, AsyncWorker(log, "w2") as second:
            await first.create("op-4", KIND, TARGET, {})
            await first.reserve(key("op-4"))
            await first.dispatch(key("op-4"))  # then the worker "crashes"
            with pytest.raises(EffectInDoubt) as info:
                await second.perform("op-4", KIND, TARGET, {}, lambda call: pytest.fail("re-run"))
            assert info.value.key == key("op-4")

    run(main)


def test_paused_worker_with_the_same_id_is_fenced_after_a_takeover(log: EventLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as paused, AsyncWorker(log, "w1") as replacement:
            await paused.create("op-6", KIND, TARGET, {})
            await paused.reserve(key("op-6"))
            await replacement.reserve(key("op-6"))
            with pytest.raises(Fenced) as info:
                await paused.dispatch(key("op-6"))
            assert info.value.reason == "stale_epoch"

    run(main)


def test_effect_block_records_success_or_leaves_unknown(log: EventLog) -> None:
    async def main() -> tuple[EffectEvent | None, Any]:
        async with AsyncWorker(log, "w1") as worker:
            async with worker.effect("op-7", KIND, TARGET, {}) as call:
                assert call.fencing_epoch == 1  # and nothing recorded
            async with worker.effect("op-8", KIND, TARGET, {"x": 1}) as call:
                await call.succeeded({"message_id": "m-8"})
            async with worker.effect("op-8", KIND, TARGET, {"x": 1}) as again:
                assert again.done
            return await worker.get(key("op-7")), again.result

    unrecorded, replayed = run(main)
    assert unrecorded is not None and unrecorded.state is State.UNKNOWN
    assert replayed == {"message_id": "m-8"}


def test_plain_callables_run_off_the_loop_and_coroutines_on_it(log: EventLog) -> None:
    threads: dict[str, int] = {}

    def blocking(call: AsyncEffectCall) -> str:
        threads["plain"] = threading.get_ident()
        return "plain"

    async def awaited(call: AsyncEffectCall) -> str:
        threads["async"] = threading.get_ident()
        return "async"

    async def returned_later(value: str) -> str:
        return value

    async def main() -> list[Any]:
        threads["loop"] = threading.get_ident()
        async with AsyncWorker(log, "w1") as worker:
            return [await worker.perform("op-a", KIND, TARGET, {}, blocking),
                    await worker.perform("op-b", KIND, TARGET, {}, awaited),
                    await worker.perform("op-c", KIND, TARGET, {},
                                         lambda call: returned_later("lambda"))]

    assert run(main) == ["plain", "async", "lambda"]
    assert threads["plain"] != threads["loop"] and threads["async"] == threads["loop"]


def test_a_hundred_concurrent_effects_in_one_loop_each_complete_once(tmp_path: Path) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    calls: list[str] = []

    async def send(call: AsyncEffectCall) -> str:
        await asyncio.sleep(0.001)
        calls.append(call.key)
        return call.key

    async def main() -> list[Any]:
        async with AsyncWorker(log, "w1", threads=4) as worker:
            return await asyncio.gather(*(worker.perform(f"op-{i}", KIND, TARGET, {"i": i}, send)
                                          for i in range(100)))

    assert run(main) == [key(f"op-{i}") for i in range(100)]
    assert sorted(calls) == sorted(key(f"op-{i}") for i in range(100))
    worker = Worker(log, "reader")
    assert all(worker.get(key(f"op-{i}")).state is State.SUCCEEDED  # type: ignore[union-attr]
               for i in range(100))


def test_concurrent_duplicate_deliveries_in_one_loop_call_the_provider_once(log: EventLog) -> None:
    calls: list[str] = []
    release = asyncio.Event()

    async def send(call: AsyncEffectCall) -> str:
        calls.append(call.key)
        await release.wait()
        return "sent"

    async def deliver(worker: AsyncWorker) -> str:
        try:
            return str(await worker.perform("op-9", KIND, TARGET, {"n": 1}, send))
        except EffectInDoubt:
            return "in doubt"

    async def main() -> list[str]:
        async with AsyncWorker(log, "w1") as one, AsyncWorker(log, "w2") as two:
            tasks = [asyncio.create_task(deliver(w)) for w in (one, two, one, two)]
            while sum(t.done() for t in tasks) < 3:  # the call is held open meanwhile
                await asyncio.sleep(0.001)
            release.set()
            return sorted(await asyncio.gather(*tasks))

    assert run(main) == ["in doubt", "in doubt", "in doubt", "sent"]
    assert calls == [key("op-9")]


def test_a_cancelled_provider_call_leaves_the_effect_unknown(log: EventLog) -> None:
    started = asyncio.Event()

    async def hangs(call: AsyncEffectCall) -> None:
        started.set()
        await asyncio.sleep(3600)

    async def main() -> EffectEvent | None:
        async with AsyncWorker(log, "w1") as worker:
            task = asyncio.create_task(worker.perform("op-10", KIND, TARGET, {}, hangs))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return await worker.get(key("op-10"))

    current = run(main)
    assert current is not None and current.state is State.UNKNOWN
    assert "CancelledError" in (current.error or "")


class GatedLog(MemoryLog):
    """A log whose appends block their thread until the test opens the gate, noting which
    thread each call ran on; a worker that appended on the loop thread would deadlock."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.threads: set[int] = set()
        self.opened_in_time = True

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        self.threads.add(threading.get_ident())
        self.opened_in_time &= self.gate.wait(10)
        return super().append_after(topic, key, values, last_offset)

    def read_key(self, topic: str, key: str) -> list[Any]:
        self.threads.add(threading.get_ident())
        return super().read_key(topic, key)


def test_the_loop_keeps_running_while_the_log_blocks() -> None:
    log = GatedLog()

    async def main() -> tuple[int, Any]:
        async with AsyncWorker(log, "w1") as worker:
            task = asyncio.create_task(worker.perform("op-11", KIND, TARGET, {}, lambda c: "ok"))
            while not log.threads:  # the append has started (and blocks its thread)
                await asyncio.sleep(0.001)
            log.gate.set()  # only possible because the loop is not the blocked thread
            result = await task
            await worker.get(key("op-11"))
            return threading.get_ident(), result

    loop_thread, result = run(main)
    assert result == "ok" and log.opened_in_time
    assert loop_thread not in log.threads


class NonAtomicLog(MemoryLog):
    """A log without compare-and-append (as Kafka): every write waits for the judge."""

    conditional = False


class CountingJudge(FoldingJudge):
    """A folding judge that keeps the questions it was asked."""

    def __init__(self, log: EventLog) -> None:
        super().__init__(log)
        self.asked: list[Query] = []

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        self.asked.extend(queries)
        return super().ask(queries)


def test_an_async_worker_waits_for_the_judge_on_every_write() -> None:
    log = NonAtomicLog()
    judge = CountingJudge(log)

    async def main() -> Any:
        async with AsyncWorker(log, "w1", judge=judge) as worker:
            return await worker.perform("op-12", KIND, TARGET, {}, lambda call: "ok")

    assert run(main) == "ok"
    # the key as it stands, the verdicts on CREATE+RESERVE+DISPATCH, the verdict on RECORD
    assert [(q.fresh, len(q.written)) for q in judge.asked] == [(False, 0), (False, 3), (False, 1)]


def test_a_lost_claim_race_is_fenced_through_the_judge() -> None:
    log = NonAtomicLog()

    async def main() -> None:
        async with AsyncWorker(log, "a", judge=FoldingJudge(log)) as a, \
                AsyncWorker(log, "b", judge=FoldingJudge(log)) as b:
            created = await a.create("op-13", KIND, TARGET, {})
            reserved = await a.reserve(created.idempotency_key)
            first = advance(reserved, Transition.CLAIM, "a")
            second = advance(reserved, Transition.CLAIM, "b")  # both from epoch 1
            await a.write(first)
            with pytest.raises(Fenced) as info:
                await b.write(second)
            assert info.value.reason == "lost_race"
            current = await b.get(created.idempotency_key)
            assert current is not None and current.worker_id == "a"

    run(main)


def test_approval_flow_through_the_single_transitions(log: EventLog) -> None:
    async def main() -> EffectEvent:
        async with AsyncWorker(log, "w1") as worker:
            await worker.create("op-14", KIND, TARGET, {})
            await worker.reserve(key("op-14"))
            await worker.dispatch(key("op-14"))
            await worker.unknown(key("op-14"), "timed out")
            await worker.await_approval(key("op-14"), "lookup down")
            await worker.approve(key("op-14"), "retry", "alice", "no email was sent")
            await worker.dispatch(key("op-14"))
            return await worker.record(key("op-14"), "succeeded", {"id": "m"})

    done = run(main)
    assert done.state is State.SUCCEEDED and done.fencing_epoch == 2


def test_a_worker_that_used_its_slice_of_the_loop_lets_other_tasks_run_first() -> None:
    async def main() -> list[str]:
        pacer = Pacer(budget=0.001)
        order: list[str] = []
        await pacer.turn()
        order.append("within budget")  # no yield needed
        pacer.used = 0.002  # core steps used more than the budget in this iteration

        async def other() -> None:
            order.append("other task")

        other_task = asyncio.ensure_future(other())
        await pacer.turn()
        order.append("after yielding")
        await other_task
        assert pacer.used == 0.0  # a fresh budget for the next iteration
        return order

    assert run(main) == ["within budget", "other task", "after yielding"]
