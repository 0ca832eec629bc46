"""Current state per key, as seen by a writer: read-your-writes on any backend."""

from __future__ import annotations

import asyncio
import inspect
from concurrent.futures import Executor
from typing import NamedTuple, Protocol, cast

from effectlog.codec import event_codec
from effectlog.errors import CodecError
from effectlog.log.base import EVENTS, EventLog, Position, Record
from effectlog.machine import fold
from effectlog.model import EffectEvent


class Seen(NamedTuple):
    """A key's snapshot as a view saw it, and how far it reaches: every record of the key's
    partition below offset ``through`` is reflected in it (None: not known). A writer whose
    next append lands exactly at ``through`` knows nothing came in between, so it can judge
    that append itself with the projector's rules instead of asking whether it won."""

    event: EffectEvent | None
    through: int | None = None


#: A ``since`` that waits for nothing: the view's snapshot as it stands, with how far it reaches.
AS_IS = -1


class StateView(Protocol):
    """Where a writer learns a key's current snapshot and whether its event was accepted."""

    def current(self, key: str) -> EffectEvent | None:
        """The latest accepted snapshot of ``key``, or None."""
        ...

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        """Whether ``event`` (appended at ``position``) was accepted under the log order."""
        ...


class AsyncStateView(Protocol):
    """:class:`StateView` for asyncio writers: the same two questions, awaited.

    An async HTTP client implements it natively; :class:`ThreadedView` adapts a sync view.
    """

    async def current(self, key: str) -> EffectEvent | None:
        """The latest accepted snapshot of ``key``, or None."""
        ...

    async def accepted(self, event: EffectEvent, position: Position,
                       timeout: float = 10.0) -> bool:
        """Whether ``event`` (appended at ``position``) was accepted under the log order."""
        ...


def seen_by(view: StateView, key: str, since: int | None = None) -> Seen:
    """``view.seen(key, since)`` where the view tells how far its snapshot reaches, else the
    (current) snapshot alone. ``since``: a snapshot that has applied that offset will do; the
    view need not wait for the log end (:data:`AS_IS`: it waits for nothing)."""
    seen = getattr(view, "seen", None)
    if seen is None:
        return Seen(view.current(key))
    return cast(Seen, seen(key) if since is None else seen(key, since))


class ThreadedView:
    """An :class:`AsyncStateView` over a sync :class:`StateView`: every call runs on
    ``executor`` (None: the loop's default one), never on the event loop."""

    def __init__(self, view: StateView, executor: Executor | None = None) -> None:
        self.view = view
        self._executor = executor

    async def current(self, key: str) -> EffectEvent | None:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.view.current, key)

    async def seen(self, key: str, since: int | None = None) -> Seen:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, seen_by, self.view, key, since)

    async def accepted(self, event: EffectEvent, position: Position,
                       timeout: float = 10.0) -> bool:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.view.accepted, event, position,
                                          timeout)


def as_async_view(view: StateView | AsyncStateView,
                  executor: Executor | None = None) -> AsyncStateView:
    """``view`` itself when it answers with coroutines, else a :class:`ThreadedView` of it."""
    if inspect.iscoroutinefunction(getattr(view, "current", None)):
        return cast(AsyncStateView, view)
    return ThreadedView(cast(StateView, view), executor)


async def seen_by_async(view: AsyncStateView, key: str, since: int | None = None) -> Seen:
    """:func:`seen_by` for an async view."""
    seen = getattr(view, "seen", None)
    if seen is None:
        return Seen(await view.current(key))
    return cast(Seen, await (seen(key) if since is None else seen(key, since)))


def decode_events(log: EventLog, key: str, records: list[Record] | None = None
                  ) -> list[EffectEvent]:
    """The decodable events of ``key`` in log order (undecodable ones are skipped here;
    the projector stores them as rejected)."""
    codec = event_codec()
    events = []
    for record in log.read_key(EVENTS, key) if records is None else records:
        try:
            events.append(EffectEvent.from_record(codec.decode(record.value)))
        except (CodecError, KeyError, ValueError):
            continue
    return events


class LogView:
    """Folds a key's events straight from the log with the projector's own rules.

    Cheap on SQLite (indexed by key); on Kafka it scans the key's partition, so Kafka
    workers should use the projection's view instead.
    """

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def current(self, key: str) -> EffectEvent | None:
        return fold(decode_events(self.log, key))[0]

    def current_at(self, key: str) -> tuple[EffectEvent | None, int | None]:
        """The current snapshot and the offset of the key's last record, read together."""
        records = self.log.read_key(EVENTS, key)
        last = records[-1].offset if records else None
        return fold(decode_events(self.log, key, records))[0], last

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        events = decode_events(self.log, event.idempotency_key)
        _, rejected = fold(events)
        refused = {id(e) for e, _ in rejected}
        return any(e.event_id == event.event_id and id(e) not in refused for e in events)
