"""The requests the worker's write strategies yield and its shells answer, each typed by its
answer: reads and appends of the log, and questions to the judge."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from effectlog.judge.query import Answer, Query
from effectlog.log.base import Position
from effectlog.model import EffectEvent

R = TypeVar("R")


class Request(Generic[R]):
    """One I/O step a strategy asks its shell to perform; ``R`` is the answer's type."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Fold(Request[tuple[EffectEvent | None, int | None]]):
    """The key's state folded from the log with the projector's rules, and the offset of its
    last record (on logs with indexed keys: SQLite, memory)."""

    key: str


@dataclass(frozen=True, slots=True)
class AppendAfter(Request[list[Position] | None]):
    """Append, all or none, only if the key's last record is at ``last_offset`` (None: it
    has none); None when another record of the key came in between."""

    key: str
    data: tuple[bytes, ...]
    last_offset: int | None


@dataclass(frozen=True, slots=True)
class Append(Request[list[Position]]):
    """Durably append the encoded events of ``key``: all or none when ``atomic``, else in
    order (a failed append may have written some of them)."""

    key: str
    data: tuple[bytes, ...]
    atomic: bool = True


@dataclass(frozen=True, slots=True)
class Ask(Request[Answer]):
    """The judge's answer to ``query`` (not yet checked: the strategy checks it)."""

    query: Query


@dataclass(frozen=True, slots=True)
class Identity(Request[str | None]):
    """The identity of the log the worker writes to (the events topic's ID on Kafka)."""


Steps: TypeAlias = Generator[Request[Any], Any, R]


def ask(request: Request[R]) -> Steps[R]:
    """Yield ``request`` to the shell and return its answer, typed."""
    answer: R = yield request
    return answer
