"""How a worker learns a key's state and gets its writes judged: the port of the two write
strategies (:mod:`.conditional` for logs with compare-and-append, :mod:`.judged` for logs
judged by the projection that owns the key)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from effectlog.errors import Conflict
from effectlog.log.base import Position
from effectlog.model import EffectEvent
from effectlog.worker.requests import Steps

#: Keys a strategy remembers per worker (oldest forgotten first).
REMEMBERED = 10_000


class Known(NamedTuple):
    """A key's state to build a write on, and whether it is confirmed: read as the log has it
    now, or the worker's own write the judge accepted (False: as a judge had it at some point,
    perhaps behind the log)."""

    event: EffectEvent | None
    confirmed: bool


class Refused(Conflict):
    """A write that was not accepted (the log order put another writer's record first, or
    the judge rejected it): ``current`` is the key's state as of a moment after the write,
    ``reason`` what the judge said of the first refused event."""

    def __init__(self, key: str, current: EffectEvent | None, reason: str) -> None:
        super().__init__(f"a write of {key} was refused ({reason})")
        self.key = key
        self.current = current
        self.reason = reason


class Writes(Protocol):
    """A write strategy: every write it returns from was accepted, never merely appended."""

    def state(self, key: str, fresh: bool = False) -> Steps[Known]:
        """The state of ``key`` to build on (``fresh``: as the log has it now)."""
        ...

    def write(self, key: str, events: tuple[EffectEvent, ...], data: tuple[bytes, ...],
              atomic: bool) -> Steps[list[Position]]:
        """Append ``data`` (the encoded ``events`` of ``key``) and return their positions once
        every one of them is accepted; raise :class:`Refused` when one is not."""
        ...

    def forget(self, key: str) -> None:
        """Trust nothing remembered of ``key`` (an append of it may or may not have landed)."""
        ...


def remember(table: dict[str, Known], key: str, known: Known) -> None:
    """``table[key] = known``, forgetting the oldest entry past :data:`REMEMBERED`."""
    if len(table) >= REMEMBERED and key not in table:
        table.pop(next(iter(table)))
    table[key] = known
