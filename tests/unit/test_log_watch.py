"""A running node looks at its log every few seconds: replaced (WrongLog, exit 4), a serving
premise broken under it (Conflict, exit 3: the same line ``serve`` refuses to start with), the
compaction lag handed to the guard, and an unreachable broker only looked at again."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from consumers.node import watch
from effectlog.errors import BackendUnavailable, Conflict, WrongLog
from effectlog.log.memory import MemoryLog


class Seen(MemoryLog):
    """The log as each look finds it: the next of ``looks`` (an identity, or an error to
    raise), a premise problem from ``problems``, a lag from ``lags``."""

    def __init__(self, looks: Iterator[object], problems: Iterator[str | None],
                 lags: Iterator[int | None]) -> None:
        super().__init__()
        self.look, self.problem, self.lag = next(looks), next(problems), next(lags)

    def identity(self) -> str:
        if isinstance(self.look, Exception):
            raise self.look
        return str(self.look)

    def check_serving(self, *, running: bool = False) -> None:
        assert running  # a lag below serve's floor is the guard's, not a reason to stop
        if self.problem is not None:
            raise Conflict(self.problem)

    def compaction_lag_ms(self) -> int | None:
        return self.lag


def run(monkeypatch: pytest.MonkeyPatch, looks: list[object], problems: list[str | None],
        lags: list[int | None]) -> tuple[object, list[int | None], int]:
    """Watch through ``looks`` (stopping after the last); the error, the lags heard, looks."""
    stop = threading.Event()
    seen = {"count": 0}
    looks_left, problems_left, lags_left = iter(looks), iter(problems), iter(lags)

    def opened(url: str, create: bool = True) -> Seen:
        seen["count"] += 1
        if seen["count"] == len(looks):
            stop.set()  # this look is the last
        return Seen(looks_left, problems_left, lags_left)

    monkeypatch.setattr(watch, "open_log", opened)
    heard: list[int | None] = []
    error = watch.watch_log("kafka://x", "topic-a", _Ticks(stop), 0.0, on_lag=heard.append)
    return error, heard, seen["count"]


class _Ticks(threading.Event):
    """A stop event whose wait returns at once (no sleeping in tests), set by the last look."""

    def __init__(self, inner: threading.Event) -> None:
        super().__init__()
        self.inner = inner
        self.waits = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        assert self.waits < 100  # bounded
        return self.inner.is_set()


def test_a_healthy_log_hands_each_lag_read_to_the_guard_until_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    error, heard, looks = run(monkeypatch, ["topic-a"] * 3, [None] * 3, [60_000, 30_000, None])
    assert error is None and looks == 3 and heard == [60_000, 30_000, None]


def test_a_premise_broken_under_a_running_node_stops_it_with_the_line_serve_starts_with(
        monkeypatch: pytest.MonkeyPatch) -> None:
    problem = "kafka topic t.events stamps records with the writers' clocks (…)"
    error, heard, looks = run(monkeypatch, ["topic-a"] * 3, [None, problem, None],
                              [60_000] * 3)
    assert isinstance(error, Conflict) and error.exit_code == 3 and looks == 2
    assert str(error).startswith(problem) and "stopped serving" in str(error)
    assert heard == [60_000]


def test_a_replaced_log_is_wrong_and_its_premises_are_not_asked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    error, heard, _ = run(monkeypatch, ["topic-a", "topic-b"], [None, "never asked"],
                          [1, 2])
    assert isinstance(error, WrongLog) and error.exit_code == 4
    assert "was replaced (identity topic-a -> topic-b)" in str(error) and heard == [1]


def test_an_unreachable_broker_is_looked_at_again_not_taken_for_a_replaced_log(
        monkeypatch: pytest.MonkeyPatch) -> None:
    down = BackendUnavailable("kafka broker x unreachable")
    error, heard, looks = run(monkeypatch, [down, down, "topic-a"], [None] * 3, [5, 6, 7])
    assert error is None and looks == 3 and heard == [7]
