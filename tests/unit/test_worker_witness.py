"""A worker on a log without compare-and-append (as Kafka) judges its own append when it can
prove nothing came in between, and asks the projection only when it cannot.

The proof: the view's snapshot reaches offset ``through`` of the key's partition (or the
worker's own accepted write ends there), the projector's rules accept the append's records in
turn, and no other record of the key sits between ``through`` and them: they sit at
``through``, ``through + 1``, ..., or the log says no record of the key is in between
(``EventLog.untouched``; on Kafka a tail of recent keys answers). Anything else is read back
through the view, as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

import pytest

from effectlog.errors import BackendUnavailable, Fenced
from effectlog.log import EVENTS
from effectlog.log.base import Position
from effectlog.log.memory import MemoryLog
from effectlog.machine import advance, fold
from effectlog.model import EffectEvent, State, Transition
from effectlog.view import AS_IS, LogView, Seen, decode_events
from effectlog.worker import EffectInDoubt, Worker

KIND, TARGET = "email.send", "mailto:a@example.com"


def key(op: str) -> str:
    return f"agent:{op}:{KIND}:{TARGET}"


class PlainLog(MemoryLog):
    """No compare-and-append (as Kafka); counts the appends and end-offset requests.
    ``tells``: whether it answers ``untouched`` (as Kafka's key tail does once started)."""

    conditional = False

    def __init__(self, tells: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.tells = tells

    def untouched(self, topic: str, key: str, start: int, end: int,
                  own: Collection[int] = ()) -> bool:
        self.calls.append("untouched")
        return self.tells and super().untouched(topic, key, start, end, own)

    def append_many(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        self.calls.append("append_many")
        return super().append_many(topic, items)

    def append_ordered(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        self.calls.append("append_ordered")
        return super().append_many(topic, items)

    def partition_end(self, topic: str, partition: int) -> int:
        self.calls.append("partition_end")
        return super().partition_end(topic, partition)


class SeeingView:
    """A view that says how far its snapshots reach (as ``serve``'s applied offset does);
    ``meanwhile`` runs after a read, as another writer would."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.inner = LogView(log)
        self.calls: list[str] = []
        self.meanwhile: Callable[[], object] | None = None
        self.lag = 0

    def seen(self, key: str, since: int | None = None) -> Seen:
        self.calls.append("seen" if since is None else "seen since")
        # the log end as the projection knows it (not counted as the worker's ListOffsets)
        through = MemoryLog.partition_end(self.log, EVENTS, self.log.partition_for(EVENTS, key))
        if self.lag and since == AS_IS:  # a projection behind the log end (it need not wait)
            through -= self.lag
        records = [r for r in self.log.read_key(EVENTS, key) if r.offset < through]
        seen = Seen(fold(decode_events(self.log, key, records))[0], through)
        if self.meanwhile is not None:
            self.meanwhile()
            self.meanwhile = None
        return seen

    def current(self, key: str) -> EffectEvent | None:
        return self.seen(key).event

    def accepted(self, event: EffectEvent, position: Position, timeout: float = 10.0) -> bool:
        self.calls.append("accepted")
        return self.inner.accepted(event, position, timeout)


@pytest.fixture
def log() -> PlainLog:
    """A log whose partition already holds another effect (an empty partition holds no
    effect, so a worker would not even ask the view)."""
    log = PlainLog()
    Worker(log, "w0").create("op-0", KIND, "mailto:someone@example.com", {"n": 0})
    log.calls.clear()
    return log


def test_a_perform_needs_no_end_offsets(log: PlainLog) -> None:
    """Its writes are judged after they land, so no ListOffsets is asked before them: a log
    that cannot say where its partitions end does not stop a perform (a fresh ``get`` needs
    one, and fails)."""
    def no_end(topic: str, partition: int) -> int:
        raise BackendUnavailable("kafka broker unreachable: no end offsets")

    log.partition_end = no_end  # type: ignore[method-assign]
    worker = Worker(log, "w1", view=SeeingView(log))
    assert worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: "sent") == "sent"
    final = LogView(log).current(key("op-1"))
    assert final is not None and final.state is State.SUCCEEDED
    with pytest.raises(BackendUnavailable, match="no end offsets"):
        worker.get(key("op-1"))


def test_a_perform_with_nothing_in_between_needs_one_read_and_no_acceptance_read(
        log: PlainLog) -> None:
    view = SeeingView(log)
    worker = Worker(log, "w1", view=view)
    assert worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: "sent") == "sent"
    assert view.calls == ["seen since"]  # the key as the view has it, waiting for nothing
    # create+reserve+dispatch in one ordered append (no transaction) right where the
    # snapshot ends; the record right after the dispatch: no read, no end offsets
    assert log.calls == ["append_ordered"]
    final = LogView(log).current(key("op-1"))
    assert final is not None and final.state is State.SUCCEEDED


def test_a_record_of_another_key_in_between_makes_the_worker_ask(log: PlainLog) -> None:
    view = SeeingView(log)
    other = Worker(log, "w2")  # folds from the log itself: writes without reading through view
    view.meanwhile = lambda: other.create("op-other", KIND, TARGET, {"n": 2})
    worker = Worker(log, "w1", view=view)
    worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: "sent")
    # the dispatch no longer sits at `through`, and this log cannot tell what came in between
    assert view.calls[:2] == ["seen since", "accepted"]
    assert "untouched" in log.calls


@pytest.mark.parametrize("between", ["other key", "same key, other writer"])
def test_a_log_that_tells_what_came_in_between_spares_the_acceptance_read(between: str) -> None:
    log = PlainLog(tells=True)
    Worker(log, "w0").create("op-0", KIND, "mailto:someone@example.com", {"n": 0})
    view = SeeingView(log)
    other = Worker(log, "w2")
    worker = Worker(log, "w1", view=view)
    if between == "other key":
        view.meanwhile = lambda: other.create("op-other", KIND, TARGET, {"n": 2})
        assert worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: "sent") == "sent"
        assert view.calls == ["seen since"]  # no acceptance read, no read before the record
        final = LogView(log).current(key("op-1"))
        assert final is not None and final.state is State.SUCCEEDED
        return
    # the key itself is written in between (another delivery creates it): the log says so
    # and the worker asks whether its claim won. Its CREATE is refused; its RESERVE builds on
    # the other CREATED when both carry the same creation time (the same millisecond), else
    # it is refused too and the worker claims again on the current state: it wins either way
    view.meanwhile = lambda: other.create("op-1", KIND, TARGET, {"n": 1})
    assert worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: "sent") == "sent"
    assert view.calls[:2] == ["seen since", "accepted"]
    final = LogView(log).current(key("op-1"))
    assert final is not None and (final.state, final.worker_id) == (State.SUCCEEDED, "w1")


@pytest.mark.parametrize("tells", [False, True])
def test_a_takeover_during_the_call_refuses_the_record_with_the_error_a_read_would_give(
        tells: bool) -> None:
    """The RECORD builds on the worker's own accepted dispatch with no read first (as a
    conditional append on SQLite does): the rival's claim in between makes the log say no (or
    not tell), the view says the record was refused, and the worker raises the refusal a
    read first would have met. Nothing the rival wrote is lost, and the stale record stays
    refused."""
    log = PlainLog(tells)
    Worker(log, "w0").create("op-0", KIND, "mailto:someone@example.com", {"n": 0})
    view = SeeingView(log)
    worker = Worker(log, "w1", view=view)
    rival = Worker(log, "w2", view=SeeingView(log))

    def call(c: object) -> str:
        rival.reserve(key("op-1"))  # a replacement claims the key during the provider call
        return "sent"

    with pytest.raises(Fenced, match="epoch"):
        worker.perform("op-1", KIND, TARGET, {"n": 1}, call)
    # the record: no read first, refused by the view; judged again on the current state
    # (the winner's claim), which refuses it as a read first would have
    assert view.calls[:3] == ["seen since", "accepted", "seen"]
    assert "partition_end" in log.calls  # the current state: read afresh
    events = decode_events(log, key("op-1"))
    assert [e.transition for e in events] == [Transition.CREATE, Transition.RESERVE,
                                              Transition.DISPATCH, Transition.CLAIM,
                                              Transition.RECORD]
    current = LogView(log).current(key("op-1"))
    assert current is not None and current.worker_id == "w2" and current.fencing_epoch == 2
    assert current.state is State.DISPATCHED


def test_a_worker_that_does_not_verify_reads_before_each_step(log: PlainLog) -> None:
    """Without ``verify`` nothing judges an append after it is written, so each step reads the
    key first and a takeover is refused before anything is written."""
    worker = Worker(log, "w1", view=SeeingView(log), verify=False)
    rival = Worker(log, "w2", view=SeeingView(log))

    def call(c: object) -> str:
        rival.reserve(key("op-1"))
        return "sent"

    with pytest.raises(Fenced):
        worker.perform("op-1", KIND, TARGET, {"n": 1}, call)
    events = decode_events(log, key("op-1"))
    assert [e.transition for e in events][-1] is Transition.CLAIM  # no stale RECORD


def test_an_append_at_the_right_offset_that_the_rules_refuse_is_not_taken_as_won(
        log: PlainLog) -> None:
    view = SeeingView(log)
    worker = Worker(log, "w1", view=view)
    created = worker.create("op-1", KIND, TARGET, {"n": 1})
    reserved = worker.reserve(created.idempotency_key)
    assert worker.get(reserved.idempotency_key) == reserved  # the basis reaches the log end
    claim = advance(reserved, Transition.CLAIM, "w1")
    stale = dataclasses.replace(claim, fencing_epoch=reserved.fencing_epoch)  # not above
    asked = len(view.calls)
    with pytest.raises(Fenced):
        worker.write(stale)
    assert "accepted" in view.calls[asked:]  # judged by the view, not taken as won
    assert LogView(log).current(reserved.idempotency_key) == reserved


def test_an_explicit_multi_event_write_stays_all_or_nothing(log: PlainLog) -> None:
    worker = Worker(log, "w1", view=SeeingView(log))
    created = worker.create("op-1", KIND, TARGET, {"n": 1})
    reserved = advance(created, Transition.RESERVE, "w1")
    worker.write(reserved, advance(reserved, Transition.DISPATCH, "w1"))
    assert "append_many" in log.calls  # Worker.write keeps its promise: one atomic append


class DoubtfulLog(PlainLog):
    """Writes the next ordered append, then reports it as not acknowledged (a produce whose
    delivery report did not come in time, though the broker has the records)."""

    doubt_next = False

    def append_ordered(self, topic: str, items: Sequence[tuple[str, bytes]]) -> list[Position]:
        positions = super().append_ordered(topic, items)
        if self.doubt_next:
            self.doubt_next = False
            raise BackendUnavailable("no delivery report within 10s; the append may be durable")
        return positions


def test_an_append_in_doubt_is_never_built_on_the_key_is_read_again() -> None:
    log = DoubtfulLog()
    Worker(log, "w0").create("op-0", KIND, "mailto:someone@example.com", {"n": 0})
    view = SeeingView(log)
    worker = Worker(log, "w1", view=view)
    log.doubt_next = True
    calls: list[str] = []
    with pytest.raises(BackendUnavailable):
        worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: calls.append("sent"))
    assert calls == []  # no provider call without a known, won claim
    # the dispatch did land: the next perform reads the key afresh and finds it in doubt
    reads = len(view.calls)
    with pytest.raises(EffectInDoubt):
        worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: calls.append("sent"))
    # read as the view has it, then (an effect is said to be in doubt on its current state
    # only) afresh
    assert view.calls[reads:] == ["seen since", "seen since"] and calls == []


@pytest.mark.parametrize(("tells", "behind", "reads"), [
    (True, "other keys", ["seen since"]),
    (False, "other keys", ["seen since", "accepted"]),
    (True, "the key itself", ["seen since", "accepted", "seen", "seen since", "seen since"]),
])
def test_a_write_on_a_snapshot_behind_the_log_end_is_won_only_when_proven(
        tells: bool, behind: str, reads: list[str]) -> None:
    log = PlainLog(tells)
    first = Worker(log, "w0")
    first.create("op-0", KIND, "mailto:someone@example.com", {"n": 0})
    if behind == "the key itself":  # another delivery created the key: the snapshot misses it
        first.create("op-1", KIND, TARGET, {"n": 1})
    else:
        first.create("op-2", KIND, "mailto:other@example.com", {"n": 2})
    view = SeeingView(log)
    view.lag = 1  # the projection has not applied the last record yet
    worker = Worker(log, "w1", view=view)
    created = worker.create("op-1", KIND, TARGET, {"n": 1})
    assert view.calls == reads
    assert created.worker_id == ("w0" if behind == "the key itself" else "w1")


class OverlappingView(SeeingView):
    """A view that, like the cluster client, runs a call while its read is in flight."""

    def seen_during(self, key: str, since: int, during: Callable[[], None]) -> Seen:
        self.calls.append("seen during")
        during()
        return self.seen(key, since)


def test_a_fresh_read_and_its_end_offsets_overlap_and_an_end_offsets_error_wins(
        log: PlainLog) -> None:
    view = OverlappingView(log)
    worker = Worker(log, "w1", view=view)
    assert worker.perform("op-1", KIND, TARGET, {"n": 1}, lambda call: "sent") == "sent"
    view.calls.clear()
    current = worker.get(key("op-1"))
    assert current is not None and current.state is State.SUCCEEDED
    assert view.calls == ["seen during", "seen since"]  # one read, made while asking the end

    def no_end(topic: str, partition: int) -> int:
        raise BackendUnavailable("kafka broker unreachable: no end offsets")

    log.partition_end = no_end  # type: ignore[method-assign]
    with pytest.raises(BackendUnavailable, match="no end offsets"):
        worker.get(key("op-1"))
