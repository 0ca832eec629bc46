"""How ``effectlog append --server`` cuts its input into batches (effectlog/cli/append_batch.py):
at most 2,000 lines, ended early when no next line comes within the linger, and a line that
cannot be read ends the batch before it, then fails the run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from effectlog.cli.append_batch import batches
from effectlog.errors import InvalidInput

Line = tuple[int, dict[str, Any]]


def lines(count: int, *, pause_after: int | None = None, pause_s: float = 0.0,
          bad_at: int | None = None) -> Iterator[Line]:
    for number in range(1, count + 1):
        if number == bad_at:
            raise InvalidInput(f"line {number}: invalid JSON")
        yield number, {"n": number}
        if number == pause_after:
            time.sleep(pause_s)


def numbers(found: list[list[Line]]) -> list[list[int]]:
    return [[number for number, _ in batch] for batch in found]


def test_lines_that_come_at_once_fill_whole_batches() -> None:
    assert numbers(list(batches(lines(7), size=3, linger_s=5.0))) == [[1, 2, 3], [4, 5, 6], [7]]


def test_a_pause_in_the_input_ends_the_batch_so_the_lines_before_it_are_answered() -> None:
    found: list[tuple[list[int], float]] = []
    started = time.monotonic()
    for batch in batches(lines(4, pause_after=2, pause_s=1.0), size=100, linger_s=0.05):
        found.append(([n for n, _ in batch], time.monotonic() - started))
    assert [batch for batch, _ in found] == [[1, 2], [3, 4]]
    assert found[0][1] < found[1][1] - 0.5  # the first batch came before the pause ended


def test_a_bad_line_ends_the_batch_before_it_then_fails() -> None:
    found: list[list[Line]] = []
    with pytest.raises(InvalidInput, match="line 5"):
        for batch in batches(lines(9, bad_at=5), size=100, linger_s=5.0):
            found.append(batch)
    assert numbers(found) == [[1, 2, 3, 4]]
