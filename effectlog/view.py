"""Current state per key, as seen by a writer: read-your-writes on any backend."""

from __future__ import annotations

from typing import Protocol

from effectlog.codec import event_codec
from effectlog.errors import CodecError
from effectlog.log.base import EVENTS, EventLog, Position, Record
from effectlog.machine import fold
from effectlog.model import EffectEvent


class StateView(Protocol):
    """Where a writer learns a key's current snapshot and whether its event was accepted."""

    def current(self, key: str) -> EffectEvent | None:
        """The latest accepted snapshot of ``key``, or None."""
        ...

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        """Whether ``event`` (appended at ``position``) was accepted under the log order."""
        ...


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
