"""The requests the worker's core yields and its shells answer: reads of the state view
and appends to the log, each typed by its answer."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from effectlog.log.base import Position
from effectlog.model import EffectEvent
from effectlog.view import Seen

R = TypeVar("R")


class Request(Generic[R]):
    """One I/O step the core asks its shell to perform; ``R`` is the answer's type."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Current(Request[Seen]):
    """The state view's snapshot of ``key`` (and how far it reaches, if known), once the
    view has applied offset ``since`` of the key's partition (None: the log end now;
    :data:`~effectlog.view.AS_IS`: no wait)."""

    key: str
    since: int | None = None


@dataclass(frozen=True, slots=True)
class CurrentAndEnd(Request["tuple[Seen, int]"]):
    """The state view's snapshot of ``key`` as it stands (no wait), and the end offset of the
    key's partition asked at the same time (the two round trips overlap where they can)."""

    key: str


@dataclass(frozen=True, slots=True)
class Accepted(Request[bool]):
    """The state view's verdict: was ``event``, appended at ``position``, accepted?"""

    event: EffectEvent
    position: Position
    timeout: float


@dataclass(frozen=True, slots=True)
class CurrentAt(Request["tuple[EffectEvent | None, int | None]"]):
    """The key's snapshot folded from the log, with the offset of its last record."""

    key: str


@dataclass(frozen=True, slots=True)
class PartitionEnd(Request[int]):
    """The next offset to be written to ``key``'s partition (one ListOffsets on Kafka)."""

    key: str


@dataclass(frozen=True, slots=True)
class Untouched(Request[bool]):
    """Whether provably no record of ``key`` but those at offsets ``own`` sits at offsets
    ``[start, end)`` of its partition (False: one does, or the log cannot tell)."""

    key: str
    start: int
    end: int
    own: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class Append(Request["list[Position]"]):
    """Durably append the encoded events of ``key`` as one append: all or none when
    ``atomic``, else in order (a failed append may have written some of them)."""

    key: str
    data: tuple[bytes, ...]
    atomic: bool = True


@dataclass(frozen=True, slots=True)
class AppendAfter(Request["list[Position] | None"]):
    """Append, all or none, only if the key's last record is at ``last_offset``."""

    key: str
    data: tuple[bytes, ...]
    last_offset: int | None


Steps: TypeAlias = Generator[Request[Any], Any, R]


def ask(request: Request[R]) -> Steps[R]:
    """Yield ``request`` to the shell and return its answer, typed."""
    answer: R = yield request
    return answer
