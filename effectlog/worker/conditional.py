"""Writes on a log with compare-and-append (SQLite, memory): accepted as they are written.

The worker folds the key's records from the log with the projector's own rules (an index
lookup there), checks its events against that state with the same rules, and appends only if
the key's last record is still the one it folded. So a write either lands right after the
state the rules accepted it on, or is not written at all: the conditional append is the
verdict, and nothing is read back.
"""

from __future__ import annotations

from effectlog.errors import Conflict
from effectlog.log.base import Position
from effectlog.machine import check
from effectlog.model import EffectEvent
from effectlog.worker.requests import AppendAfter, Fold, Steps, ask
from effectlog.worker.writes import REMEMBERED, Known, Refused


class ConditionalWrites:
    """The :class:`~effectlog.worker.writes.Writes` of a log with ``append_after``."""

    def __init__(self) -> None:
        #: what the worker last saw of each key, and the offset of the key's last record then
        self._last: dict[str, tuple[EffectEvent | None, int | None]] = {}

    def state(self, key: str, fresh: bool = False) -> Steps[Known]:
        last = None if fresh else self._last.get(key)
        if last is not None:
            return Known(last[0], False)  # the conditional append will tell
        event, offset = yield from ask(Fold(key))
        self._note(key, event, offset)
        return Known(event, True)

    def write(self, key: str, events: tuple[EffectEvent, ...], data: tuple[bytes, ...],
              atomic: bool) -> Steps[list[Position]]:
        last = self._last.get(key)
        if last is None:
            last = yield from ask(Fold(key))
        state = last[0]
        try:  # the rules, on the state the append is conditional on, event after event
            for proposed in events:
                check(state, proposed)
                state = proposed
        except Conflict as exc:
            raise Refused(key, last[0], str(exc)) from None
        positions = yield from ask(AppendAfter(key, data, last[1]))
        if positions is None:
            event, offset = yield from ask(Fold(key))
            self._note(key, event, offset)
            raise Refused(key, event, "another record of the key came first")
        self._note(key, events[-1], positions[-1].offset)
        return positions

    def forget(self, key: str) -> None:
        self._last.pop(key, None)

    def _note(self, key: str, event: EffectEvent | None, offset: int | None) -> None:
        if len(self._last) >= REMEMBERED and key not in self._last:
            self._last.pop(next(iter(self._last)))
        self._last[key] = (event, offset)
