"""An exception that ends an effect block after its key was settled (the RECORD landed although
the caller was cancelled or the append reported a failure, or a reconciler recorded first) is
raised to the caller as it was: the fallback UNKNOWN the log refuses (the key is settled) does
not replace it, and nothing in doubt is turned into a success."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import BackendUnavailable, Conflict
from effectlog.log.base import Position
from effectlog.log.sqlite import SqliteLog
from effectlog.model import State
from effectlog.worker import AsyncEffectCall, AsyncWorker, EffectCall, Worker

pytestmark = pytest.mark.timeout(60)

OP, KIND, TARGET = "op-1", "email.send", "mailto:a@x"
KEY = f"agent:{OP}:{KIND}:{TARGET}"
WAIT_S = 10.0


class HeldLog(SqliteLog):
    """A log whose next conditional append, once ``hold`` is set, waits for ``release``
    (a slow fsync) after telling ``entered``; ``fail_after`` makes it fail once written."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.hold = False
        self.fail_after = False
        self.entered = threading.Event()
        self.release = threading.Event()

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        held, self.hold = self.hold, False
        if held:
            self.entered.set()
            self.release.wait(WAIT_S)
        written = super().append_after(topic, key, values, last_offset)
        if self.fail_after:
            self.fail_after = False
            raise BackendUnavailable("no answer from the disk after the commit")
        return written


@pytest.fixture
def log(tmp_path: Path) -> Iterator[HeldLog]:
    log = HeldLog(tmp_path / "log.db")
    yield log
    log.close()


def settle_first(log: HeldLog) -> None:
    """A reconciler takes the key over and records what the provider's lookup found."""
    reconciler = Worker(log, "reconciler")
    reconciler.claim(KEY)
    reconciler.record(KEY, State.SUCCEEDED, {"found": True}, source="lookup")


def test_a_cancel_during_the_record_is_raised_as_the_cancel(log: HeldLog) -> None:
    async def main() -> BaseException | None:
        async with AsyncWorker(log, "w1") as worker:
            async def provider(call: AsyncEffectCall) -> dict[str, Any]:
                log.hold = True  # the RECORD's append waits
                return {"ok": 1}

            task = asyncio.create_task(worker.perform(OP, KIND, TARGET, {"a": 1}, provider))
            assert await asyncio.to_thread(log.entered.wait, WAIT_S)
            task.cancel()  # lands while the RECORD is being written
            await asyncio.sleep(0.05)
            log.release.set()
            try:
                await task
            except BaseException as exc:  # what the caller gets
                return exc
            return None

    outcome = asyncio.run(main())
    assert isinstance(outcome, asyncio.CancelledError), repr(outcome)
    assert Worker(log, "r").get(KEY).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_a_timeout_during_the_record_is_raised_as_the_timeout(log: HeldLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as worker:
            async def provider(call: AsyncEffectCall) -> dict[str, Any]:
                log.hold = True
                threading.Timer(0.5, log.release.set).start()
                return {"ok": 1}

            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await worker.perform(OP, KIND, TARGET, {"a": 1}, provider)

    asyncio.run(main())
    assert Worker(log, "r").get(KEY).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_a_record_that_failed_after_it_was_written_raises_its_failure(log: HeldLog) -> None:
    def provider(call: EffectCall) -> dict[str, Any]:
        log.fail_after = True  # the RECORD is written, then the append reports a failure
        return {"ok": 1}

    with pytest.raises(BackendUnavailable, match="after the commit"):
        Worker(log, "w1").perform(OP, KIND, TARGET, {"a": 1}, provider)
    assert Worker(log, "r").get(KEY).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_a_record_that_lost_to_a_reconciler_raises_its_own_refusal(log: HeldLog) -> None:
    def provider(call: EffectCall) -> dict[str, Any]:
        settle_first(log)
        return {"ok": 1}

    with pytest.raises(Conflict, match=r"^RECORD from SUCCEEDED"):  # not the fallback UNKNOWN's
        Worker(log, "w1").perform(OP, KIND, TARGET, {"a": 1}, provider)
    settled = Worker(log, "r").get(KEY)
    assert settled is not None and settled.state is State.SUCCEEDED
    assert settled.outcome is not None and settled.outcome.result == {"found": True}


def test_an_async_record_that_lost_to_a_reconciler_raises_its_own_refusal(log: HeldLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as worker:
            async def provider(call: AsyncEffectCall) -> dict[str, Any]:
                await asyncio.to_thread(settle_first, log)
                return {"ok": 1}

            with pytest.raises(Conflict, match=r"^RECORD from SUCCEEDED"):
                await worker.perform(OP, KIND, TARGET, {"a": 1}, provider)

    asyncio.run(main())
    assert Worker(log, "r").get(KEY).state is State.SUCCEEDED  # type: ignore[union-attr]


def test_an_exception_in_doubt_still_leaves_the_effect_unknown(log: HeldLog) -> None:
    def provider(call: EffectCall) -> dict[str, Any]:
        raise TimeoutError("no answer from the provider")

    with pytest.raises(TimeoutError):
        Worker(log, "w1").perform(OP, KIND, TARGET, {"a": 1}, provider)
    assert Worker(log, "r").get(KEY).state is State.UNKNOWN  # type: ignore[union-attr]
