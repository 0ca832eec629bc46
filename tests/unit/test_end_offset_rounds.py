"""Threads asking for end offsets at once share requests, and every thread gets the answer of
a request sent after it asked."""

from __future__ import annotations

import threading
import time

import pytest

from effectlog.errors import BackendUnavailable
from effectlog.log.kafka.ends import EndOffsetRounds


class Broker:
    def __init__(self) -> None:
        self.sent: list[float] = []
        self.release = threading.Semaphore(0)
        self.fail = False

    def fetch(self) -> dict[int, int]:
        self.sent.append(time.monotonic())
        number = len(self.sent)
        assert self.release.acquire(timeout=10)
        if self.fail:
            raise BackendUnavailable("broker gone")
        return {0: number, 1: number * 10}


def ask_in_thread(rounds: EndOffsetRounds, out: list[object]) -> threading.Thread:
    def ask() -> None:
        try:
            out.append(rounds.ends())
        except BackendUnavailable as exc:
            out.append(exc)
    thread = threading.Thread(target=ask)
    thread.start()
    return thread


def wait_for(condition: object, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not condition() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.005)


def test_threads_arriving_during_a_request_share_the_next_one() -> None:
    broker = Broker()
    rounds = EndOffsetRounds(broker.fetch)
    first: list[object] = []
    leader = ask_in_thread(rounds, first)
    wait_for(lambda: len(broker.sent) == 1)
    arrived = time.monotonic()
    later: list[object] = []
    threads = [ask_in_thread(rounds, later) for _ in range(10)]
    wait_for(lambda: len(rounds._cond._waiters) == 10)  # type: ignore[attr-defined]
    broker.release.release()  # round 1 answers the first caller only
    leader.join(5)
    assert first == [{0: 1, 1: 10}]
    wait_for(lambda: len(broker.sent) == 2)
    broker.release.release()
    for thread in threads:
        thread.join(5)
    assert later == [{0: 2, 1: 20}] * 10
    assert len(broker.sent) == 2 and broker.sent[1] >= arrived


def test_a_lone_caller_sends_its_own_request_each_time() -> None:
    broker = Broker()
    rounds = EndOffsetRounds(broker.fetch)
    for n in (1, 2, 3):
        broker.release.release()
        assert rounds.ends() == {0: n, 1: n * 10}


def test_a_failed_request_fails_its_callers_and_the_next_one_is_sent_again() -> None:
    broker = Broker()
    rounds = EndOffsetRounds(broker.fetch)
    broker.fail = True
    broker.release.release()
    with pytest.raises(BackendUnavailable):
        rounds.ends()
    broker.fail = False
    broker.release.release()
    assert rounds.ends() == {0: 2, 1: 20}
