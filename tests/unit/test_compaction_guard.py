"""The compaction guard halts a partition before a gap compaction may have made.

A projection that starts from a point older than ``min.compaction.lag.ms`` (serve down that
long, or a partition left unpublished that long) may find that compaction removed records
after it. The end-to-end test restores such a partition: the restored state differs from a
full replay (a key whose CREATE to DISPATCH were removed reads as absent), and the guard stops
there instead. The other tests pin which gaps halt and which do not.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog.log.base import EVENTS, Record
from effectlog.log.memory import MemoryLog
from effectlog.log.source import AssignmentListener, Fetched, RecordSource
from projections.checkpoint import Checkpoint
from projections.compaction_guard import CompactionGap, CompactionGuard
from projections.projector import Projector, ProjectorSettings
from projections.rocksdb.digest import partition_digest
from tests.restore_support import RESTORED
from tests.unit.test_changelog_restore import (
    CompactedLog,
    MemoryChangelog,
    _apply_upto,
    compact_below,
    digest,
)
from tests.unit.test_publisher_during_assignment import records as histories

LAG_MS = 60_000
NOW_MS = 1_000_000_000
OLD = NOW_MS - 2 * LAG_MS  # older than the lag: may have been compacted
YOUNG = NOW_MS - 1_000


def record(offset: int, timestamp_ms: int, key: str = "k") -> Record:
    return Record(EVENTS, 0, offset, key, b"v", timestamp_ms)


class Stamped(MemoryLog):
    """A log whose partition 0 holds exactly ``kept`` (offsets with gaps)."""

    compacted = True

    def __init__(self, kept: list[Record]) -> None:
        super().__init__()
        self.kept = kept

    def read_before(self, topic: str, partition: int, offset: int, limit: int,
                    end: int) -> list[Record]:
        return [r for r in self.kept if offset <= r.offset < end][:limit]


def guard(kept: list[Record] | None = None, **options: object) -> tuple[CompactionGuard,
                                                                          list[str]]:
    halts: list[str] = []
    made = CompactionGuard(Stamped(kept or []), lag_ms=LAG_MS, clock_ms=lambda: NOW_MS,
                           on_halt=lambda p, why: halts.append(why), **options)  # type: ignore[arg-type]
    made.start(0, 0)
    return made, halts


def test_gaps_after_young_records_and_old_records_without_gaps_pass() -> None:
    made, halts = guard()
    old = [record(0, OLD), record(1, OLD), record(2, OLD)]
    assert made.admit(0, old) == old  # contiguous: nothing can be missing
    young = [record(3, YOUNG), record(7, YOUNG), record(20, YOUNG)]
    assert made.admit(0, young) == young
    assert halts == [] and made.halted() == {}


def test_a_gap_after_an_old_record_halts_the_partition_before_it() -> None:
    made, halts = guard()
    batch = [record(0, OLD), record(1, OLD), record(4, YOUNG), record(5, YOUNG)]
    assert made.admit(0, batch) == batch[:2]
    assert len(halts) == 1 and "offsets 2 to 3" in halts[0] and "halted" in halts[0]
    assert made.halted() == {0: halts[0]}
    assert made.admit(0, [record(6, YOUNG)]) == []  # nothing past the gap, ever
    assert made.admit(0, batch) == batch[:2]  # read again from the stored offset
    assert not made.reached(0, 9)  # nor is the stored offset moved past it
    made.start(0, 2)  # assigned again: checked afresh
    assert made.halted() == {}


def test_one_empty_offset_at_the_end_of_what_could_be_read_is_no_gap() -> None:
    """An idle partition: its last record is old, a transaction marker follows (offset 1),
    the reader reaches the end; a week later a new record comes at 2. (More empty offsets
    there: tests/unit/test_compaction_guard_tail.py.)"""
    made, halts = guard()
    assert made.admit(0, [record(0, OLD)]) == [record(0, OLD)]
    assert made.reached(0, 2)
    assert made.admit(0, [record(2, YOUNG)]) == [record(2, YOUNG)]
    assert halts == []


def test_a_start_of_unknown_age_is_dated_by_the_last_record_before_it() -> None:
    for stamp, halted in ((OLD, True), (YOUNG, False)):
        made, halts = guard([record(7, stamp), record(8, stamp)])
        made.start(0, 10)  # the copy applied 0 to 9; 9 is a marker
        assert made.admit(0, [record(12, YOUNG)]) == ([] if halted else [record(12, YOUNG)])
        assert bool(halts) == halted
    made, halts = guard([])
    made.start(0, 10)  # nothing readable before it: its age is unknown, so it may be old
    assert made.admit(0, [record(11, YOUNG)]) == [] and "unknown age" in halts[0]


def test_without_a_callback_a_gap_raises_and_accepted_it_is_only_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    made = CompactionGuard(Stamped([]), lag_ms=LAG_MS, clock_ms=lambda: NOW_MS)
    made.start(0, 0)
    with pytest.raises(CompactionGap, match="compaction may have removed accepted events"):
        made.admit(0, [record(0, OLD), record(3, OLD)])
    made, halts = guard(accept=True)
    with caplog.at_level(logging.ERROR, logger="projections.compaction_guard"):
        batch = [record(0, OLD), record(3, OLD)]
        assert made.admit(0, batch) == batch
    assert halts == [] and "--accept-compaction-gaps" in caplog.text


def test_a_host_clock_behind_the_brokers_is_corrected_by_the_newest_record_read() -> None:
    made, halts = guard()
    made._clock_ms = lambda: OLD - LAG_MS  # this host's clock runs far behind the brokers'
    made.start(1, 0)
    assert made.admit(1, [Record(EVENTS, 1, 0, "x", b"v", NOW_MS)])  # the brokers' time
    assert made.admit(0, [record(0, OLD), record(3, OLD)]) == [record(0, OLD)]
    assert "offsets 1 to 2" in halts[0]


def test_a_log_never_compacted_is_not_guarded() -> None:
    made = CompactionGuard(MemoryLog(), clock_ms=lambda: NOW_MS)
    made.start(0, 0)
    batch = [record(0, OLD), record(5, OLD)]
    assert made.admit(0, batch) == batch and made.halted() == {}


class LaggingLog(CompactedLog):
    """A compacted log whose records are all older than its compaction lag."""

    def compaction_lag_ms(self) -> int | None:
        return LAG_MS


def test_a_restore_from_a_checkpoint_older_than_the_lag_halts_where_compaction_thinned_it(
        tmp_path: Path) -> None:
    """The owner published at a third of the history and went away for longer than the
    lag; compaction then removed superseded records after the checkpoint too. A restore
    that applied the survivors would differ from a full replay (shown below); the guard
    stops at the first gap instead, and with ``--accept-compaction-gaps`` applies on."""
    tmp = tmp_path
    kept = [replace(r, timestamp_ms=OLD) for r in histories()]
    changelog = MemoryChangelog()
    with Projector(CompactedLog(kept, changelog, "log-1"), tmp / "owner") as owner:
        _apply_upto(owner, len(kept) // 3)
        store = owner.store.writers()[0]  # type: ignore[attr-defined]
        changes = store.take_changes()
        changelog.writer(0).publish(changes.changes, changes.checkpoint("log-1"))
    applied = Checkpoint.decode(changelog.last_checkpoint(0) or b"").applied
    thinned = compact_below(kept, len(kept))  # the whole topic compacted, tail included
    assert any(r.offset >= applied for r in kept if r not in thinned)
    truth = digest(CompactedLog(kept, MemoryChangelog(), "log-1"), tmp / "truth", False)
    unguarded = digest(CompactedLog(thinned, changelog, "log-1", len(kept)),
                       tmp / "unguarded", True)
    assert unguarded != truth, "the survivors alone give other states (the test can fail)"
    with pytest.raises(CompactionGap, match=f"no state past offset {applied}"):
        digest(LaggingLog(thinned, changelog, "log-1", len(kept)), tmp / "guarded", True)
    halted: dict[int, str] = {}
    with Projector(LaggingLog(thinned, changelog, "log-1", len(kept)), tmp / "serving",
                   on_halt=halted.__setitem__) as serving:
        serving.run(once=True)
        assert list(halted) == [0]
        stopped_at = serving.next_offsets()[0]
    assert applied <= stopped_at < len(kept)
    accepting = ProjectorSettings(accept_compaction_gaps=True)
    with Projector(LaggingLog(thinned, changelog, "log-1", len(kept)), tmp / "accepted",
                   accepting) as accepted:
        accepted.run(once=True)
    assert partition_digest(tmp / "accepted", 0, RESTORED) == unguarded


def test_a_halted_partition_never_serves_and_makes_the_member_unready() -> None:
    from consumers.node.gate import PartitionGate
    from consumers.node.readiness import readiness

    gate = PartitionGate()
    gate.assigned(0, 0, 10)
    gate.assigned(1, 5, 5)  # serving at once
    gate.halt(0, "events partition 0: … halted there")
    gate.applied(0, 10)  # what came before the gap reaches the target: still halted
    assert gate.held() == {0: "halted", 1: "serving"}
    assert gate.halted() == {0: "events partition 0: … halted there"}
    assert gate.serving() == [1] and not gate.wait(0, 5, 0.01)
    gate.halt(1, "events partition 1: … halted there")  # a serving one stops serving
    assert gate.status(1) == "halted" and gate.serving() == []
    ready, details = readiness(joined=True, group="g", held=gate.held(),
                               restore_left=gate.restore_left, failed=[])
    assert not ready and "partition(s) 0, 1 halted" in str(details["why"])
    gate.revoked(0)
    gate.assigned(0, 10, 10)  # assigned again: checked afresh
    assert gate.status(0) == "serving"


def test_a_standby_copy_halted_before_its_promotion_is_reported_halted_once_owned(
        tmp_path: Path) -> None:
    from consumers.node.assignments import Assignments
    from consumers.node.gate import PartitionGate

    tmp = tmp_path
    kept = [record(0, OLD, "a"), record(1, OLD, "b"), record(5, OLD, "a")]
    gate = PartitionGate()  # the copy is a standby: the gate does not hold it
    log = LaggingLog(kept, MemoryChangelog(), "log-1", 6)
    with Projector(log, tmp / "standby", on_halt=gate.halt,
                   from_changelog=False) as projector:
        projector.run(once=True)
        assert list(projector.guard.halted()) == [0] and gate.held() == {}
        Assignments(projector, gate, None, log).assigned([0])  # promoted
        assert gate.status(0) == "halted" and "offsets 2 to 4" in gate.halted()[0]


@st.composite
def thinned_logs(draw: st.DrawFn) -> tuple[list[Record], list[Record], int, int, int]:
    """A partition's records (some offsets markers: no record), their times rising by drawn
    steps; the same after Kafka's cleaner ran at the end with the lag (every record with a
    later one of its key and at least the lag old goes: the most it may remove); where a
    projection starts; the partition's end; and the time it reads."""
    count = draw(st.integers(1, 30))
    stamp, written = NOW_MS - 3 * LAG_MS, []
    for offset in range(count):
        stamp += draw(st.sampled_from((0, 1_000, LAG_MS // 4, LAG_MS)))
        if draw(st.integers(0, 5)) > 0:  # else a transaction marker or an aborted record
            written.append(record(offset, stamp, draw(st.sampled_from("abc"))))
    now = max([NOW_MS, *(r.timestamp_ms for r in written)])
    last = {r.key: r.offset for r in written}
    kept = [r for r in written if last[r.key] == r.offset or r.timestamp_ms > now - LAG_MS]
    return written, kept, draw(st.integers(0, count)), count, now


@settings(max_examples=300, deadline=None)
@given(log=thinned_logs(), cuts=st.lists(st.integers(1, 30), max_size=5))
def test_the_guard_never_applies_past_a_removed_record(
        log: tuple[list[Record], list[Record], int, int, int], cuts: list[int]) -> None:
    """Whatever the times, markers, keys, start and batches: every offset the guard lets the
    projection move past (records admitted, the end reached) holds no record compaction
    removed. (It may halt where nothing was removed: markers look the same.)"""
    written, kept, start, end, now = log
    made = CompactionGuard(Stamped(kept), lag_ms=LAG_MS, clock_ms=lambda: now,
                           on_halt=lambda p, why: None)
    made.start(0, start)
    tail = [r for r in kept if r.offset >= start]
    passed = start - 1
    batches, at = [], 0
    for cut in sorted(set(cuts)):
        batches.append(tail[at:cut])
        at = max(at, cut)
    batches.append(tail[at:])
    for batch in batches:
        admitted = made.admit(0, batch)
        assert admitted == batch[:len(admitted)]
        if admitted:
            passed = admitted[-1].offset
        if len(admitted) < len(batch):
            break
    else:
        if made.reached(0, end):
            passed = max(passed, end - 1)
    removed = {r.offset for r in written} - {r.offset for r in kept}
    assert not [o for o in removed if start <= o <= passed], (removed, start, passed)


def test_a_lower_lag_read_while_running_applies_at_once_and_a_higher_one_never() -> None:
    """The operator lowers ``min.compaction.lag.ms`` under a running serve: records the old lag
    kept may go now, so a gap after them halts; raising it again brings nothing back."""
    made, halts = guard()
    earlier, between = record(0, NOW_MS - 25_000), record(2, NOW_MS - 20_000)
    assert made.admit(0, [earlier, between]) == [earlier, between]  # safe under 60 s
    made.lag_read(LAG_MS // 10)
    made.lag_read(LAG_MS)  # higher again: the lower one stays
    made.lag_read(None)  # no longer compacted: changes nothing
    assert made.lag_ms == LAG_MS // 10
    assert made.admit(0, [record(4, YOUNG)]) == []  # 20 s is old under 6 s
    assert len(halts) == 1 and "offsets 3 to 3" in halts[0] and "(6s)" in halts[0]


def test_a_first_lag_read_guards_the_partitions_started_after_it() -> None:
    made = CompactionGuard(Stamped([]), lag_ms=None, clock_ms=lambda: NOW_MS)
    made.lag_ms = None  # the topic was not compacted when the guard was made
    made.start(0, 0)
    gap = [record(0, OLD), record(2, YOUNG)]
    assert made.admit(0, gap) == gap  # nothing compacted then: nothing to guard
    made.lag_read(LAG_MS)
    made.start(1, 0)
    with pytest.raises(CompactionGap, match="offsets 1 to 1"):
        made.admit(1, [replace(r, partition=1) for r in gap])


class OnePoll(RecordSource):
    """A group source whose polls are given: the tail and its end may come in one poll, as a
    consumer delivers them when the tail fits one fetch."""

    def __init__(self, polls: list[Fetched]) -> None:
        self.polls = polls

    def start(self, listener: AssignmentListener) -> None:
        listener.assigned([0])

    def poll(self, limit: int, timeout_s: float) -> Fetched:
        return self.polls.pop(0) if self.polls else Fetched([], {})

    def seek(self, partition: int, offset: int) -> None:
        pass


class OldLog(Stamped):
    def compaction_lag_ms(self) -> int | None:
        return LAG_MS


@pytest.mark.parametrize("together", [False, True], ids=["end-later", "end-in-same-poll"])
def test_a_gap_halts_the_projector_whether_the_end_comes_in_the_same_poll_or_later(
        tmp_path: Path, together: bool) -> None:
    """The end of a partition reached in the same poll as its records is handed to the
    guard after them: first, it would carry the guard's mark past records it never saw."""
    old = int(time.time() * 1000) - 10 * LAG_MS
    kept = [Record(EVENTS, 0, 0, "k", b"x", old), Record(EVENTS, 0, 5, "k", b"y", old)]
    polls = [Fetched(kept, {0: 6})] if together else [Fetched(kept, {}), Fetched([], {0: 6})]
    halted: dict[int, str] = {}
    with Projector(OldLog(kept), tmp_path, ProjectorSettings(decoder="inline"),
                   follow_swaps=False, from_changelog=False,
                   on_halt=halted.__setitem__) as projector:
        source = OnePoll(polls)
        source.start(projector)
        for _ in range(6):
            projector.step(source)
        assert list(halted) == [0] and projector.next_offsets()[0] == 1


def test_a_request_waiting_on_a_partition_that_halts_is_answered_at_once() -> None:
    """A verdict or fresh read waiting for a partition to catch up hears of its halt at once
    (503), not after its whole wait."""
    import asyncio
    import threading

    from consumers.node.gate import PartitionGate

    gate = PartitionGate()
    gate.assigned(0, 0, 10)
    halter = threading.Timer(0.2, gate.halt, (0, "events partition 0: … halted there"))
    began = time.monotonic()
    halter.start()
    assert not gate.wait(0, 5, 30)
    assert time.monotonic() - began < 10

    gate.assigned(1, 0, 10)

    async def waiting() -> bool:
        asyncio.get_running_loop().call_later(0.2, gate.halt, 1, "halted there")
        return await gate.wait_async(1, 5, 30)

    began = time.monotonic()
    assert not asyncio.run(waiting())
    assert time.monotonic() - began < 10
