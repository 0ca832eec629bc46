"""Fresh reads share ListOffsets rounds, and every read gets a round sent after it arrived."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from consumers.node.fresh import SharedEndOffsets
from effectlog.errors import BackendUnavailable


class Broker:
    """A blocking end-offsets request whose rounds the test releases one by one."""

    def __init__(self) -> None:
        self.sent: list[float] = []  # when each request was sent
        self.release = threading.Semaphore(0)
        self.fail_next = False

    def fetch(self) -> dict[int, int]:
        self.sent.append(time.monotonic())
        number = len(self.sent)
        assert self.release.acquire(timeout=10)
        if self.fail_next:
            self.fail_next = False
            raise BackendUnavailable("broker gone")
        return {0: number}


def test_reads_arriving_during_a_round_share_the_next_one() -> None:
    broker = Broker()

    async def main() -> None:
        ends = SharedEndOffsets(broker.fetch)
        first = asyncio.ensure_future(ends())
        await asyncio.sleep(0.05)  # round 1 is in flight
        arrived = time.monotonic()
        later = [asyncio.ensure_future(ends()) for _ in range(10)]
        await asyncio.sleep(0.05)
        broker.release.release()  # round 1 answers the first read only
        assert await first == {0: 1}
        broker.release.release()
        answers = await asyncio.gather(*later)
        assert answers == [{0: 2}] * 10
        assert len(broker.sent) == 2 and broker.sent[1] >= arrived

    asyncio.run(asyncio.wait_for(main(), 20))


def test_an_error_reaches_its_round_and_the_next_round_works() -> None:
    broker = Broker()
    broker.fail_next = True

    async def main() -> None:
        ends = SharedEndOffsets(broker.fetch)
        failing = [asyncio.ensure_future(ends()) for _ in range(3)]
        broker.release.release()
        for read in failing:
            with pytest.raises(BackendUnavailable):
                await read
        broker.release.release()
        assert await ends() == {0: 2}

    asyncio.run(asyncio.wait_for(main(), 20))


def test_a_read_that_gives_up_does_not_cancel_the_others() -> None:
    broker = Broker()

    async def main() -> None:
        ends = SharedEndOffsets(broker.fetch)
        impatient = asyncio.ensure_future(asyncio.wait_for(ends(), 0.05))
        patient = asyncio.ensure_future(ends())
        with pytest.raises(asyncio.TimeoutError):
            await impatient
        broker.release.release()
        assert await patient == {0: 1}

    asyncio.run(asyncio.wait_for(main(), 20))
