"""A lone standby copy passes transaction markers as the owner does, and a standby copy that
halted is opened afresh when the group promotes it, not served halted for good.

A copy read alone (one partition: the log's own wait) used to report no end, so it never
moved past offsets without records; the next record, more than half the compaction lag
later, then made the marker look like a gap after an old record and the copy halted, and
stayed halted once promoted.
"""

from __future__ import annotations

import time
from pathlib import Path

from consumers.node.assignments import Assignments
from consumers.node.gate import PartitionGate
from consumers.node.standby import WithStandbys
from effectlog.log.base import EVENTS, Record
from effectlog.log.memory import MemoryLog
from effectlog.log.source import AssignmentListener, Fetched, LogSource, RecordSource
from projections.projector import Projector, ProjectorSettings

LAG_MS = 10_000


class Marked(MemoryLog):
    """Two compacted partitions whose records are given, with ends past them (markers)."""

    compacted = True
    conditional = False

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[int, list[Record]] = {0: [], 1: []}
        self.ends = {0: 0, 1: 0}

    def partitions(self, topic: str) -> int:
        return 2

    def compaction_lag_ms(self) -> int | None:
        return LAG_MS

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        return [r for r in self.kept[partition] if r.offset >= offset][:limit]

    def read_before(self, topic: str, partition: int, offset: int, limit: int,
                    end: int) -> list[Record]:
        return [r for r in self.kept[partition] if offset <= r.offset < end][:limit]

    def end_offsets(self, topic: str) -> dict[int, int]:
        return dict(self.ends)


class NoGroup(RecordSource):
    """A group that has assigned nothing yet (its listener kept, to promote by hand)."""

    listener: AssignmentListener

    def start(self, listener: AssignmentListener) -> None:
        self.listener = listener

    def poll(self, limit: int, timeout_s: float) -> Fetched:
        return Fetched([], {})

    def seek(self, partition: int, offset: int) -> None:
        pass


def test_a_single_partition_source_reports_the_end_past_a_marker() -> None:
    log = Marked()
    log.kept[0] = [Record(EVENTS, 0, 0, "k", b"x", 1)]
    log.ends[0] = 2  # offset 1: a commit marker
    source = LogSource(log, [0])
    source.start(_Resume())
    polls = [source.poll(100, 0.0) for _ in range(3)]
    assert [r.offset for r in polls[0].records] == [0]
    assert polls[-1].reached == {0: 2} and source._cursors == {0: 2}


class _Resume:
    def assigned(self, partitions: list[int]) -> dict[int, int]:
        return {p: 0 for p in partitions}

    def revoked(self, partitions: list[int], *, lost: bool) -> None:
        pass


def _standbys(tmp: Path, log: Marked, standby: set[int]) -> tuple[Projector, WithStandbys,
                                                                    PartitionGate, NoGroup]:
    gate = PartitionGate()
    projector = Projector(log, tmp, ProjectorSettings(decoder="inline", idle_sleep_s=0.0),
                          follow_swaps=False, from_changelog=False, on_halt=gate.halt)
    group = NoGroup()
    source = WithStandbys(group, log, projector)
    source.start(Assignments(projector, gate, None, log))
    source.want(standby)
    return projector, source, gate, group


def test_a_lone_standby_copy_passes_a_marker_like_two_copies_do(tmp_path: Path) -> None:
    for name, standby in (("two", {0, 1}), ("one", {0})):
        now = int(time.time() * 1000)
        log = Marked()
        for p in (0, 1):  # a transaction long ago: its record at 0, its marker at 1
            log.kept[p] = [Record(EVENTS, p, 0, "k", b"x", now - 3 * LAG_MS)]
            log.ends[p] = 2
        projector, source, _, _ = _standbys(tmp_path / name, log, standby)
        try:
            for _ in range(10):
                projector.step(source)
            for p in (0, 1):  # the next record, much later
                log.kept[p].append(Record(EVENTS, p, 2, "k", b"y", now))
                log.ends[p] = 3
            for _ in range(10):
                projector.step(source)
            assert projector.guard.halted() == {}, name
        finally:
            projector.close()


def test_a_halted_standby_copy_is_opened_afresh_when_promoted(tmp_path: Path) -> None:
    now = int(time.time() * 1000)
    log = Marked()
    # offsets 1 to 3 hold nothing, after a record older than the lag: compaction may have
    # removed records there, and the copy halts
    log.kept[0] = [Record(EVENTS, 0, 0, "k", b"x", now - 3 * LAG_MS),
                   Record(EVENTS, 0, 4, "k", b"y", now)]
    log.ends[0] = 5
    projector, source, gate, group = _standbys(tmp_path, log, {0})
    try:
        for _ in range(10):
            projector.step(source)
        assert list(projector.guard.halted()) == [0] and projector.next_offsets()[0] == 1
        opened: list[int] = []
        reopen = projector.assigned
        projector.assigned = lambda ps: (opened.extend(ps), reopen(ps))[1]  # type: ignore[method-assign]
        group.listener.assigned([0])  # promoted
        # released and assigned again (restored from the changelog, were it behind the
        # last checkpoint), checked afresh from its stored offset by the group's reads
        assert opened == [0] and projector.guard.halted() == {}
        assert gate.status(0) == "restoring" and projector.next_offsets()[0] == 1
    finally:
        projector.close()
