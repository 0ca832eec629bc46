"""Judges for tests: one that folds the log itself (to set up histories on Kafka without a
``serve``), and a wrapper that makes a real judge lie in chosen ways (to show the worker's
checks refuse such answers)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from effectlog.codec import event_codec
from effectlog.errors import CodecError, Conflict
from effectlog.judge.premises import worker_fingerprint
from effectlog.judge.query import Answer, Judge, Premises, Query, Verdict
from effectlog.log.base import EVENTS, EventLog
from effectlog.machine import check
from effectlog.model import EffectEvent
from effectlog.worker import Worker


class FoldingJudge:
    """A judge that folds the key's records from the log with this release's rules: truthful
    by construction, slow on Kafka (it scans the partition). Only for setting up histories in
    tests; workers on Kafka ask ``effectlog serve``."""

    def __init__(self, log: EventLog) -> None:
        self.log = log

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        return [self._answer(q) for q in queries]

    def _answer(self, query: Query) -> Answer:
        log, codec = self.log, event_codec()
        partition = log.partition_for(EVENTS, query.key)
        applied = log.acknowledged_ends(EVENTS).get(partition, 0)
        state: EffectEvent | None = None
        accepted: dict[int, str] = {}
        for record in log.read_key(EVENTS, query.key):
            if record.offset >= applied:
                break
            try:
                event = EffectEvent.from_record(codec.decode(record.value))
                check(state, event)
            except (CodecError, Conflict, KeyError, ValueError):
                continue
            state = event
            accepted[record.offset] = event.event_id
        verdicts = tuple(Verdict(w.offset, w.event_id, accepted.get(w.offset) == w.event_id,
                                 None if accepted.get(w.offset) == w.event_id else "rejected")
                         for w in query.written)
        return Answer(query.key, partition, applied, state, verdicts,
                      Premises(log.identity(), "folded", worker_fingerprint(), f"fold:{log.url}"),
                      None if state is None else state.to_json())

    def close(self) -> None:
        return None


def scribe(log: EventLog, worker_id: str) -> Worker:
    """A worker that writes test histories on any log (folding the log where it has no
    compare-and-append)."""
    return Worker(log, worker_id, judge=None if log.conditional else FoldingJudge(log))


class LyingJudge:
    """Passes questions to ``inner`` and lets ``lie`` change each answer before it is
    returned: a judge whose answers rest on premises that do not hold."""

    def __init__(self, inner: Judge, lie: Callable[[Query, Answer], Answer]) -> None:
        self.inner = inner
        self.lie = lie

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        return [self.lie(q, a) for q, a in zip(queries, self.inner.ask(queries), strict=True)]

    def close(self) -> None:
        self.inner.close()


def accept_everything(query: Query, answer: Answer) -> Answer:
    """A lie: every written event accepted."""
    return replace(answer, verdicts=tuple(Verdict(w.offset, w.event_id, True)
                                          for w in query.written))
