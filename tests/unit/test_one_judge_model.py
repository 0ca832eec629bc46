"""At most one provider call per key, whatever the interleaving (hypothesis, stateful).

Several workers (the real core and its judged write strategy, stepped one request at a time)
perform effects on a few keys of a log without compare-and-append, while the judge they ask
(the real store, gate and :class:`~consumers.node.judging.PartitionJudge` of ``serve``) lags,
loses its partition and gets it back (restoring from its store), has a rebuilt generation
swapped in that is behind the log (with the gate still at the old position), and the log
receives duplicate deliveries of earlier records. A write of several records is not a
transaction on such a log: its records land one at a time, other writers' records may land
between them, and the produce may fail after some of them landed. A worker calls the
provider the moment its
``begin`` returns a DISPATCHED event, and nowhere else; the invariant is that no key is ever
called twice, and every call rests on a DISPATCH a clean replay of the log accepts.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Generator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from consumers.node.gate import PartitionGate
from consumers.node.judging import PartitionJudge
from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable, EffectlogError
from effectlog.judge.premises import known_fingerprints, worker_fingerprint
from effectlog.judge.query import Answer, Query, Verdict
from effectlog.log.base import EVENTS
from effectlog.log.memory import MemoryLog
from effectlog.machine import fold
from effectlog.model import State, Transition
from effectlog.view import decode_events
from effectlog.worker.core import WorkerCore
from effectlog.worker.judged import JudgedWrites
from effectlog.worker.requests import Append, Ask, Identity, Request
from projections.rocksdb import layout
from projections.rocksdb.store import RocksProjectionStore
from projections.rocksdb.writer import RocksPartitionWriter

KEYS = ("a", "b")
WORKERS = 3
Steps = Generator[Request[Any], Any, None]


class NonAtomicLog(MemoryLog):
    """A log without compare-and-append, as Kafka: every write waits for the judge."""

    conditional = False


class Judged:
    """One worker: its core, and the operation it is in the middle of (if any)."""

    def __init__(self, name: str) -> None:
        self.core = WorkerCore(name, JudgedWrites(worker_fingerprint(), lambda key: 0))
        self.steps: Steps | None = None
        self.pending: Request[Any] | None = None
        self.landing: list[bytes] = []  # records of its append in flight, not in the log yet
        self.landed: list[Any] = []  # positions of those already in the log


class OneJudge(RuleBasedStateMachine):
    """Workers, a judge that lags, moves and is rebuilt, and a log with duplicates."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="one-judge-"))
        self.log = NonAtomicLog()
        self.store = RocksProjectionStore(self.tmp / "state")
        self.gate = PartitionGate()
        self.judge = PartitionJudge(self.gate, self.store.reader(lambda key: 0, self.gate.serving),
                                    "model:", self.log.identity(),
                                    known_fingerprints(event_codec().writer_fingerprints),
                                    lambda: self.log.acknowledged_ends(EVENTS))
        self.writer: RocksPartitionWriter | None = self.store.open_writer(0, partitions=1)
        self.gate.assigned(0, self.writer.next_offset, 0)
        self.workers = [Judged(f"w{n}") for n in range(WORKERS)]
        self.calls: Counter[str] = Counter()
        self.keys: dict[str, str] = {}

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize()
    def start(self) -> None:
        self.gate.applied(0, 0)

    # -- workers -------------------------------------------------------------------------

    @rule(n=st.integers(0, WORKERS - 1), key=st.sampled_from(KEYS))
    def deliver(self, n: int, key: str) -> None:
        """A job for ``key`` reaches worker ``n`` (when it is idle)."""
        worker = self.workers[n]
        if worker.steps is not None:
            return
        worker.steps = self._perform(worker.core, key)
        self._advance(worker, None, None)

    @rule(n=st.integers(0, WORKERS - 1))
    def answer(self, n: int) -> None:
        """The judge answers worker ``n``'s question, if it can now."""
        worker = self.workers[n]
        if not isinstance(worker.pending, Ask):
            return
        query = worker.pending.query
        found = self.judge.read(query, worker_fingerprint(), query.applied_at_least)
        if isinstance(found, Answer):
            self._advance(worker, found, None)

    @rule()
    def catch_up(self) -> None:
        """The judge applies everything, then answers whoever it can."""
        self.project(10_000)
        for n in range(WORKERS):
            self.answer(n)

    @rule(n=st.integers(0, WORKERS - 1))
    def give_up(self, n: int) -> None:
        """Worker ``n``'s question times out (the client's retries are spent)."""
        worker = self.workers[n]
        if isinstance(worker.pending, Ask):
            self._advance(worker, None, BackendUnavailable("the judge did not answer in time"))

    @rule(n=st.integers(0, WORKERS - 1), count=st.integers(1, 3), fails=st.integers(0, 4))
    def land(self, n: int, count: int, fails: int) -> None:
        """Up to ``count`` more records of worker ``n``'s append in flight reach the log;
        one time in five its produce then fails, the rest never delivered."""
        worker = self.workers[n]
        if not worker.landing:
            return
        assert isinstance(worker.pending, Append)
        for value in worker.landing[:count]:
            worker.landed.append(self.log.append(EVENTS, worker.pending.key, value))
        del worker.landing[:count]
        if fails == 0:
            worker.landing = []
            self._advance(worker, None, BackendUnavailable("not delivered: message timed out"))
        elif not worker.landing:
            self._advance(worker, list(worker.landed), None)

    def _perform(self, core: WorkerCore, op: str) -> Steps:
        event, done = yield from core.begin(op, "payment.charge", "acct:1", {"op": op}, None)
        if done:
            return
        self.calls[event.idempotency_key] += 1  # the provider call
        self.keys[event.idempotency_key] = op
        yield from core.record(event.idempotency_key, State.SUCCEEDED, {"ok": op}, "worker",
                               None)

    def _advance(self, worker: Judged, reply: Any, error: BaseException | None) -> None:
        """Run the worker's operation until it asks the judge (or ends)."""
        assert worker.steps is not None
        worker.pending = None
        while True:
            try:
                request = worker.steps.send(reply) if error is None \
                    else worker.steps.throw(error)
            except StopIteration:
                worker.steps = worker.pending = None
                return
            except EffectlogError:  # in doubt, fenced, refused, unavailable: the job ends
                worker.steps = worker.pending = None
                return
            reply, error = None, None
            if isinstance(request, Ask):
                worker.pending = request
                return
            if isinstance(request, Identity):
                reply = self.log.identity()
            elif isinstance(request, Append) and not request.atomic:
                worker.pending, worker.landing, worker.landed = request, list(request.data), []
                return
            elif isinstance(request, Append):
                reply = self._append(request.key, request.data)
            else:
                raise AssertionError(f"unexpected request {request!r}")

    def _append(self, key: str, data: Sequence[bytes]) -> Any:
        return self.log.append_ordered(EVENTS, [(key, value) for value in data])

    # -- the judge and the log -----------------------------------------------------------

    @rule(n=st.integers(1, 6))
    def project(self, n: int) -> None:
        """The judge's projector applies up to ``n`` records (it lags otherwise)."""
        if self.writer is None:
            return
        records = self.log.read(EVENTS, 0, self.writer.next_offset, n)
        if records:
            self.writer.apply(records)
            self.gate.applied(0, self.writer.next_offset)

    @precondition(lambda self: self.writer is not None)
    @rule()
    def revoke(self) -> None:
        """The partition moves away (a rebalance): released, no longer served."""
        self.gate.revoked(0)
        self.store.release(0)
        self.writer = None

    @precondition(lambda self: self.writer is None)
    @rule()
    def assign(self) -> None:
        """The partition comes back: restored from the store, served once caught up."""
        self.writer = self.store.open_writer(0, partitions=1)
        self.gate.assigned(0, self.writer.next_offset, self.log.end_offsets(EVENTS)[0])

    @precondition(lambda self: self.writer is not None)
    @rule(upto=st.integers(0, 40))
    def rebuild_swap(self, upto: int) -> None:
        """A rebuilt generation of the first ``upto`` records is swapped in under the
        judge; the gate keeps the old generation's position until the next batch."""
        built = layout.new_build_dir(self.tmp / "state")
        other = RocksProjectionStore(built)
        writer = other.open_writer(0, partitions=1)
        records = self.log.read(EVENTS, 0, 0, upto)
        if records:
            writer.apply(records)
        other.close()
        self.store.release(0)
        layout.swap_in(self.tmp / "state", built)
        self.writer = self.store.open_writer(0, partitions=1)

    @rule(data=st.data())
    def redeliver(self, data: st.DataObject) -> None:
        """A record already in the log is delivered again (same bytes, same event id)."""
        records = self.log.read(EVENTS, 0, 0, 10_000)
        if records:
            record = data.draw(st.sampled_from(records))
            self.log.append(EVENTS, record.key, record.value)

    # -- the promise ---------------------------------------------------------------------

    @invariant()
    def at_most_one_call_per_key(self) -> None:
        assert all(n <= 1 for n in self.calls.values()), self.calls
        event(f"provider calls: {min(sum(self.calls.values()), 2)}")
        busy = sum(1 for w in self.workers if w.steps is not None)
        event(f"workers in the middle of an effect at once: {busy}")

    @invariant()
    def every_call_rests_on_an_accepted_dispatch(self) -> None:
        for key, calls in self.calls.items():
            dispatched = [e for e in fold_accepted(self.log, key)
                          if e.transition is Transition.DISPATCH]
            assert len(dispatched) >= calls, (key, calls)


def fold_accepted(log: MemoryLog, key: str) -> list[Any]:
    """The events of ``key`` a clean replay accepts, in log order."""
    events = decode_events(log, key)
    _, rejected = fold(events)
    refused = {id(e) for e, _ in rejected}
    return [e for e in events if id(e) not in refused]


OneJudge.TestCase.settings = settings(max_examples=80, stateful_step_count=60, deadline=None)
TestOneJudge = OneJudge.TestCase


def test_the_model_can_fail() -> None:
    """The invariant is not vacuous: a judge that believes every claim makes it fail."""
    machine = OneJudge()
    try:
        original = machine.judge.read

        def lying(query: Query, judge: str, target: int) -> Any:
            """Answers at once, claiming to have applied what was asked and accepted it."""
            found = original(query, judge, 0)
            if isinstance(found, Answer) and query.written:
                return replace(found, applied=max(found.applied, query.applied_at_least),
                               verdicts=tuple(Verdict(w.offset, w.event_id, True)
                                              for w in query.written))
            return found

        machine.judge.read = lying  # type: ignore[method-assign]
        machine.start()
        for n in range(2):  # two deliveries of one job; the judge sees neither before answering
            machine.deliver(n, "a")
            machine.answer(n)  # the pre-read: the key is absent
            machine.land(n, 3, 1)  # its CREATE, RESERVE and DISPATCH
        for n in range(2):
            machine.answer(n)
        with pytest.raises(AssertionError):
            machine.at_most_one_call_per_key()
    finally:
        machine.teardown()
