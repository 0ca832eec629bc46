"""``effectlog append`` through the judge (Kafka, or any log with ``--server``), in batches.

Line by line, each transition would cost a question to the judge and a durable round trip.
Here a batch of lines is planned by the worker's own core against the keys' states as the
judge has them now (one request for the batch), its events are appended in one pipelined
call, and then the judge is asked about every appended event (one request). A line is
printed as accepted only when the judge accepted its event: non-Python workers call their
provider on that word. The output and exit codes are those of the line-by-line path: a line
that fails planning stops the run after the lines before it are appended; an event the judge
refused fails its line with exit 3 (the events after it, of any key, are then in the log but
were judged on their own, as a second writer's would be).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from effectlog.errors import EffectlogError, Fenced
from effectlog.judge.premises import Expected, check_answer
from effectlog.judge.query import Judge, Query, Written
from effectlog.log.base import EVENTS, EventLog, Position
from effectlog.model import EffectEvent, Transition
from effectlog.worker import Worker
from effectlog.worker.base import codec_fingerprint
from effectlog.worker.core import LateVerdict, WorkerCore
from effectlog.worker.requests import Request, Steps
from effectlog.worker.writes import Known

BATCH_LINES = 2000
#: A batch ends early when no next line came within this: a worker that writes a line and
#: waits for its answer before the next one is answered.
LINGER_S = 0.05
Planned = tuple[int, EffectEvent, bool]  # line number, event, whether it was appended now
Line = tuple[int, dict[str, Any]]  # line number, parsed request
_END = object()


class _Failed:
    """What reading the lines raised, handed to the batching thread."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def batches(lines: Iterable[Line], size: int = BATCH_LINES,
            linger_s: float = LINGER_S) -> Iterator[list[Line]]:
    """``lines`` (read on a thread of their own) in batches of at most ``size``; a batch also
    ends when no next line came within ``linger_s``. A line that cannot be read ends the batch
    before it, then its error is raised."""
    ready: queue.Queue[Line | _Failed | object] = queue.Queue(maxsize=4 * size)

    def read() -> None:
        try:
            for item in lines:
                ready.put(item)
        except BaseException as exc:  # raised on the batching thread, after the lines before
            ready.put(_Failed(exc))
            return
        ready.put(_END)

    threading.Thread(target=read, name="append-input", daemon=True).start()
    batch: list[Line] = []
    while True:
        try:
            item = ready.get(timeout=linger_s) if batch else ready.get()
        except queue.Empty:
            yield batch
            batch = []
            continue
        if item is _END:
            break
        if isinstance(item, _Failed):
            if batch:
                yield batch
            raise item.error
        batch.append(item)  # type: ignore[arg-type]
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


class _Plan:
    """The batch's appends in order, each key's state moved along by them (no I/O)."""

    def __init__(self, log: EventLog, states: dict[str, EffectEvent | None]) -> None:
        self.log = log
        self.states = states
        self.items: list[tuple[str, bytes]] = []

    def state(self, key: str, fresh: bool = False) -> Steps[Known]:
        return Known(self.states.get(key), True)
        yield  # a generator that asks nothing

    def write(self, key: str, events: tuple[EffectEvent, ...], data: tuple[bytes, ...],
              atomic: bool) -> Steps[list[Position]]:
        partition = self.log.partition_for(EVENTS, key)
        positions = []
        for value in data:
            self.items.append((key, value))
            positions.append(Position(EVENTS, partition, -len(self.items)))  # provisional
        self.states[key] = events[-1]
        return positions
        yield  # a generator that asks nothing

    def forget(self, key: str) -> None:
        return None


class _PlanningWorker(Worker):
    """A :class:`Worker` whose writes go into a :class:`_Plan`, judged after the append."""

    def __init__(self, worker_id: str, plan: _Plan) -> None:
        self.log = plan.log
        self.judge, self._owns_judge = None, False
        self._core = WorkerCore(worker_id, plan)

    def _answer(self, request: Request[Any]) -> Any:
        raise TypeError(f"a batch is planned without I/O, not {request!r}")


def read_states(judge: Judge, expected: Expected, keys: set[str]) -> dict[str, EffectEvent | None]:
    """The keys' states as the judge has them now (each answer's premises checked)."""
    queries = [Query(key, fresh=True) for key in sorted(keys)]
    states: dict[str, EffectEvent | None] = {}
    for query, answer in zip(queries, judge.ask(queries), strict=True):
        check_answer(query, answer, expected)
        states[query.key] = answer.state
    return states


def expectations(log: EventLog) -> Expected:
    """What the judge's answers must hold for this log and this release."""
    from effectlog.codec import event_codec

    return Expected(codec_fingerprint(event_codec()), lambda key: log.partition_for(EVENTS, key),
                    log.identity)


def run_batch(log: EventLog, requests: list[tuple[int, dict[str, Any]]], judge: Judge,
              apply: Callable[[Any, dict[str, Any], int], EffectEvent],
              emit: Callable[[EffectEvent, Position | None], None],
              call_within_s: float) -> None:
    """Plan, append and judge one batch of parsed lines; emit one output line per line.
    A DISPATCH whose verdict came more than ``call_within_s`` after its append began is not
    printed as accepted (``LateVerdict``: recovery may be acting on it already)."""
    from effectlog.keys import make_key

    expected = expectations(log)
    plan = _Plan(log, read_states(judge, expected, {
        make_key(r["operation_id"], r["kind"], r["target"]) for _, r in requests}))
    workers: dict[str, _PlanningWorker] = {}
    planned: list[Planned] = []
    failure: EffectlogError | None = None
    for number, request in requests:
        worker = workers.setdefault(request["worker_id"],
                                    _PlanningWorker(request["worker_id"], plan))
        before = len(plan.items)
        try:
            event = apply(worker, request, number)
        except EffectlogError as exc:
            exc.args = (f"line {number}: {exc}",)
            failure = exc
            break
        planned.append((number, event, len(plan.items) > before))
    began = time.monotonic()
    positions = log.append_ordered(EVENTS, plan.items) if plan.items else []
    refused = _judge(judge, expected, planned, positions) if positions else None
    took = time.monotonic() - began
    if took > call_within_s:
        late = next((n for n, e, new in planned if new and e.transition is Transition.DISPATCH),
                    None)
        if late is not None and (refused is None or late < refused[0]):
            event = next(e for n, e, _ in planned if n == late)
            refused = (late, str(LateVerdict(event, took, call_within_s)))
    appended = iter(positions)
    for number, event, new in planned:
        if refused is not None and number >= refused[0]:
            raise Fenced(f"line {refused[0]}: {refused[1]}", "lost_race")  # exit 3
        emit(event, next(appended) if new else None)
    if failure is not None:
        raise failure


def _judge(judge: Judge, expected: Expected, planned: list[Planned],
           positions: list[Position]) -> tuple[int, str] | None:
    """The first line whose event the judge did not accept, and why; None if all were."""
    written: dict[str, list[tuple[int, Written]]] = {}
    appended = iter(positions)
    for number, event, new in planned:
        if new:
            position = next(appended)
            written.setdefault(event.idempotency_key, []).append(
                (number, Written(position.offset, event.event_id)))
    queries = [Query(key, written=tuple(w for _, w in items)) for key, items in written.items()]
    refused: list[tuple[int, str]] = []
    for query, answer in zip(queries, judge.ask(queries), strict=True):
        check_answer(query, answer, expected)
        for number, item in written[query.key]:
            verdict = answer.verdict(item)
            if verdict is None or not verdict.accepted:
                reason = "no verdict" if verdict is None else verdict.reason
                refused.append((number, f"{query.key}: the judge did not accept "
                                        f"event {item.event_id} ({reason})"))
                break
    return min(refused) if refused else None
