"""Writes judged by the projection that owns the key (Kafka, or any log read through serve).

On a log without compare-and-append a writer cannot know at write time whether its record
wins: the order in the partition decides and the projector's rules judge it. So a write is
appended, then the judge is asked about exactly the events appended (their event ids at the
offsets the delivery reports named), and the write counts only when every one of them has a
positive verdict, except in a group written without atomicity (a worker's CREATE, RESERVE and
DISPATCH: other writers' records may land between them), which counts when its last event is
accepted: the rules accept one DISPATCH per claim, and only on its writer's claim, so that
verdict alone says the worker may call, even when its CREATE lost to another writer's
identical one (the key's state is then read afresh). Every answer is checked against what
this worker knows on its own (its key and partition, its events and offsets, the events topic
it writes to, the fingerprint of the rules and schema it wrote with) before anything is built
on it; an answer that fails a check raises, and nothing is acted on.
"""

from __future__ import annotations

from collections.abc import Callable

from effectlog.judge.premises import Expected, check_answer
from effectlog.judge.query import Answer, Query, Written
from effectlog.log.base import Position
from effectlog.model import EffectEvent
from effectlog.worker.requests import Append, Ask, Identity, Steps, ask
from effectlog.worker.writes import Known, Refused, remember

_UNKNOWN = object()


class JudgedWrites:
    """The :class:`~effectlog.worker.writes.Writes` of a log judged by its projection.

    ``fingerprint`` is the one this worker writes with (see
    :func:`~effectlog.judge.judge_fingerprint`); ``partition_of`` places a key in the log.
    """

    def __init__(self, fingerprint: str, partition_of: Callable[[str], int]) -> None:
        self.fingerprint = fingerprint
        self.partition_of = partition_of
        self._own: dict[str, Known] = {}  # this worker's last accepted write of each key
        self._topic: object = _UNKNOWN

    def state(self, key: str, fresh: bool = False) -> Steps[Known]:
        own = None if fresh else self._own.get(key)
        if own is not None:
            return own
        answer = yield from self.ask(Query(key, fresh=fresh))
        return Known(answer.state, fresh)

    def write(self, key: str, events: tuple[EffectEvent, ...], data: tuple[bytes, ...],
              atomic: bool) -> Steps[list[Position]]:
        self._own.pop(key, None)  # whatever happens next, the key moved
        positions = yield from ask(Append(key, data, atomic))
        written = tuple(Written(p.offset, e.event_id)
                        for p, e in zip(positions, events, strict=True))
        answer = yield from self.ask(Query(key, written=written))
        # each verdict taken by its event and offset (checked to be there), never by position
        verdicts = [answer.verdict(w) for w in written]
        refused = [v for v in verdicts if v is None or not v.accepted]
        if not refused:
            remember(self._own, key, Known(events[-1], True))
        elif atomic or verdicts[-1] is None or not verdicts[-1].accepted:
            first = refused[0]
            raise Refused(key, answer.state,
                          (first.reason if first is not None else None) or "not accepted")
        return positions

    def forget(self, key: str) -> None:
        self._own.pop(key, None)

    def ask(self, query: Query) -> Steps[Answer]:
        """The judge's answer to ``query``, once every premise of it is checked."""
        answer = yield from ask(Ask(query))
        if self._topic is _UNKNOWN:
            self._topic = yield from ask(Identity())
        topic = self._topic
        check_answer(query, answer, Expected(
            self.fingerprint, self.partition_of,
            lambda: topic if isinstance(topic, str) else None))
        return answer
