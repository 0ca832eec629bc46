"""A function's own ``operation_id`` parameter pins its effect's operation id however it is
passed (keyword, position, default), so a retry after a timeout meets the first key and raises
:class:`EffectInDoubt` instead of calling the provider again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectlog
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.worker import AsyncWorker, EffectInDoubt, Worker

calls: list[str] = []


@effectlog.effect("payment.charge", target=lambda customer, **_: f"stripe:{customer}")
def charge(customer: str, amount: int, operation_id: str) -> dict[str, Any]:
    calls.append(operation_id)
    if len(calls) == 1:
        raise TimeoutError("no answer from the bank")  # may have happened
    return {"ok": True}


@effectlog.effect("payment.charge", target=lambda customer, **_: f"stripe:{customer}")
def charge_default(customer: str, amount: int, operation_id: str = "order-7") -> dict[str, Any]:
    calls.append(operation_id)
    return {"ok": True}


@effectlog.effect("payment.charge", target=lambda customer, **_: f"stripe:{customer}")
async def charge_async(customer: str, operation_id: str, amount: int = 1) -> dict[str, Any]:
    await asyncio.sleep(0)
    calls.append(operation_id)
    raise TimeoutError("no answer from the bank")


@pytest.fixture(autouse=True)
def reset_calls() -> None:
    calls.clear()


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    yield log
    log.close()


def keys(log: EventLog) -> list[str]:
    return sorted({r.key for r in log.scan(EVENTS, 0)})


def test_a_positional_operation_id_pins_the_key_and_a_retry_is_in_doubt(log: EventLog) -> None:
    with effectlog.run("job-1", worker=Worker(log, "w1")):
        with pytest.raises(TimeoutError):
            charge("cus_7", 4200, "order-1042")
        with pytest.raises(EffectInDoubt) as doubt:
            charge("cus_7", 4200, "order-1042")
    assert doubt.value.key == "agent:order-1042:payment.charge:stripe:cus_7"
    assert calls == ["order-1042"]
    assert keys(log) == ["agent:order-1042:payment.charge:stripe:cus_7"]


def test_a_default_operation_id_pins_the_key(log: EventLog) -> None:
    with effectlog.run("job-2", worker=Worker(log, "w1")):
        assert charge_default("cus_7", 1) == {"ok": True}
        assert charge_default("cus_7", 1) == {"ok": True}  # replayed, not numbered again
    assert calls == ["order-7"]
    assert keys(log) == ["agent:order-7:payment.charge:stripe:cus_7"]


def test_an_async_positional_operation_id_pins_the_key(log: EventLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as worker, effectlog.run("job-3", worker=worker):
            with pytest.raises(TimeoutError):
                await charge_async("cus_8", "order-9")
            with pytest.raises(EffectInDoubt):
                await charge_async("cus_8", "order-9")

    asyncio.run(main())
    assert calls == ["order-9"]
    assert keys(log) == ["agent:order-9:payment.charge:stripe:cus_8"]
