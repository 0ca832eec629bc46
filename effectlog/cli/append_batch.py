"""``effectlog append`` on a log where reading a key scans a partition (Kafka), in batches.

Line by line, each transition would cost a read of its key and a durable round trip. Here a
batch of lines is planned by the same :class:`~effectlog.worker.Worker` against the keys'
states read once for the whole batch (through ``--server``, else one pass over each touched
partition), its events are appended in one pipelined call, and then each key's last event is
checked under the log order. The output and exit codes are those of the line-by-line path:
a line that fails planning stops the run after the lines before it are appended; an event
that lost a race with another writer fails its line with exit 3 (the events after it, of any
key, are then in the log but refused by the projector, as a second writer's would be).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from effectlog.errors import EffectlogError, Fenced
from effectlog.log.base import EVENTS, EventLog, Position, Record
from effectlog.machine import fold
from effectlog.model import EffectEvent
from effectlog.view import StateView, decode_events

BATCH_LINES = 2000
Planned = tuple[int, EffectEvent, bool]  # line number, event, whether it was appended now


class _Recorder(EventLog):
    """Takes the planned appends in order and hands out provisional positions."""

    def __init__(self, log: EventLog) -> None:
        self.url, self.log = log.url, log
        self.items: list[tuple[str, bytes]] = []

    def partitions(self, topic: str) -> int:
        return self.log.partitions(topic)

    def partition_for(self, topic: str, key: str) -> int:
        return self.log.partition_for(topic, key)

    def append(self, topic: str, key: str, value: bytes) -> Position:
        self.items.append((key, value))
        return Position(topic, self.partition_for(topic, key), -len(self.items))

    def append_many(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        return [self.append(topic, key, value) for key, value in items]

    def partition_end(self, topic: str, partition: int) -> int:
        """No end while planning (-1). Every step still asks the batch's view: it says
        nothing of how far its states reach, and planned appends have no offsets, so no
        state is ever proved current against this end."""
        return -1

    def untouched(self, topic: str, key: str, start: int, end: int,
                  own: Collection[int] = ()) -> bool:
        """Planning knows no offsets: nothing is proved, every step asks the batch's view."""
        return False

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        raise NotImplementedError("a batch is planned against the states read for it")

    def end_offsets(self, topic: str) -> dict[int, int]:
        raise NotImplementedError("a batch is planned against the states read for it")


class _BatchView:
    """Each key's state as read for the batch, moved along by the batch's own events."""

    def __init__(self, states: dict[str, EffectEvent | None]) -> None:
        self.states = states

    def current(self, key: str) -> EffectEvent | None:
        return self.states.get(key)

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        self.states[event.idempotency_key] = event  # judged for real after the append
        return True


def read_states(log: EventLog, keys: Iterable[str],
                view: StateView | None) -> dict[str, EffectEvent | None]:
    """The current state of ``keys``: through ``view`` (the cluster), else one pass over each
    partition they live on."""
    wanted = set(keys)
    if view is not None:
        return {key: view.current(key) for key in wanted}
    by_partition: dict[int, set[str]] = {}
    for key in wanted:
        by_partition.setdefault(log.partition_for(EVENTS, key), set()).add(key)
    states: dict[str, EffectEvent | None] = dict.fromkeys(wanted)
    for partition, mine in by_partition.items():
        records: dict[str, list[Record]] = {}
        for record in log.scan(EVENTS, partition):
            if record.key in mine:
                records.setdefault(record.key, []).append(record)
        for key, found in records.items():
            states[key] = fold(decode_events(log, key, found))[0]
    return states


def run_batch(log: EventLog, requests: list[tuple[int, dict[str, Any]]], view: StateView | None,
              apply: Callable[[Any, dict[str, Any], int], EffectEvent], verify: bool,
              emit: Callable[[EffectEvent, Position | None], None]) -> None:
    """Plan, append and check one batch of parsed lines; emit one output line per line."""
    from effectlog.keys import make_key
    from effectlog.worker import Worker

    states = read_states(log, {make_key(r["operation_id"], r["kind"], r["target"])
                               for _, r in requests}, view)
    recorder, batch_view = _Recorder(log), _BatchView(states)
    workers: dict[str, Worker] = {}
    planned: list[Planned] = []
    failure: EffectlogError | None = None
    for number, request in requests:
        worker = workers.setdefault(request["worker_id"], Worker(
            recorder, request["worker_id"], view=batch_view, verify=True))
        before = len(recorder.items)
        try:
            event = apply(worker, request, number)
        except EffectlogError as exc:
            exc.args = (f"line {number}: {exc}",)
            failure = exc
            break
        planned.append((number, event, len(recorder.items) > before))
    positions = log.append_many(EVENTS, recorder.items) if recorder.items else []
    lost = _check(log, view, planned, positions) if verify and positions else None
    appended = iter(positions)
    for number, event, new in planned:
        if lost is not None and number >= lost[0]:
            raise Fenced(f"line {lost[0]}: {lost[1]}", "lost_race")
        emit(event, next(appended) if new else None)
    if failure is not None:
        raise failure


def _check(log: EventLog, view: StateView | None, planned: list[Planned],
           positions: list[Position]) -> tuple[int, str] | None:
    """The first line whose event lost under the log order, and why; None if all won."""
    last: dict[str, tuple[int, EffectEvent, Position]] = {}
    first_line: dict[str, int] = {}
    appended = iter(positions)
    for number, event, new in planned:
        if new:
            key = event.idempotency_key
            last[key] = (number, event, next(appended))
            first_line.setdefault(key, number)
    if view is not None:
        refused = [key for key, (_, event, position) in last.items()
                   if not view.accepted(event, position)]
    else:
        states = read_states(log, last, None)
        refused = [key for key, (_, event, _) in last.items()
                   if (states.get(key) or event).event_id != event.event_id]
    if not refused:
        return None
    key = min(refused, key=lambda k: first_line[k])
    return first_line[key], f"{key} lost to a concurrent writer"
