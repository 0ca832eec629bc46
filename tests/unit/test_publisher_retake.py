"""A member whose changelog writer was fenced takes it again while it still holds the partition.

Before, a fenced writer was let go until the partition's next rebalance. The coordinator also
fences a writer whose publication stayed open past ``transaction.timeout.ms`` (a broker away
that long), and then the member went on owning the partition without publishing it, for as long
as the group stayed stable: a restore after that replayed ever more of the events topic, which
compaction may have thinned by then. Taking the writer again must stay safe when the member was
in fact a zombie: the last test lets two members take the writer from each other in an order
hypothesis draws, and a restore must still equal a full replay.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from consumers.node.publisher import Publisher
from effectlog.errors import BackendUnavailable
from effectlog.log.base import Record
from effectlog.log.changelog import CHECKPOINT_KEY, ChangelogWriter
from projections.checkpoint import Checkpoint
from projections.projector import Projector
from projections.rocksdb.digest import partition_digest
from tests.restore_support import RESTORED
from tests.unit.test_changelog_restore import (
    CompactedLog,
    MemoryChangelog,
    _apply_upto,
    compact_below,
    digest,
)
from tests.unit.test_publisher_during_assignment import records

LOG_ID = "log-1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FlakyChangelog(MemoryChangelog):
    """Refuses ``refusals`` takes of a writer (a broker away)."""

    def __init__(self) -> None:
        super().__init__()
        self.refusals = 0

    def writer(self, partition: int) -> ChangelogWriter:
        if self.refusals:
            self.refusals -= 1
            raise BackendUnavailable("kafka broker unreachable: cannot take the writer")
        return super().writer(partition)


def checkpoints(changelog: MemoryChangelog) -> list[int]:
    return [Checkpoint.decode(v or b"").applied for k, v in changelog.records
            if k == CHECKPOINT_KEY]


class Member:
    """A projector and its publisher over ``log`` (one partition, 0)."""

    def __init__(self, log: CompactedLog, changelog: MemoryChangelog, state: Path,
                 clock: Clock, retake_after_s: float = 60.0) -> None:
        self.projector = Projector(log, state)
        self.publisher = Publisher(changelog, self.projector.writers, LOG_ID,
                                   retake_after_s=retake_after_s, clock=clock)

    def assign(self) -> None:
        self.publisher.take([0])  # as serve does: fence first, then open (and restore)
        self.projector.assigned([0])

    def close(self) -> None:
        self.publisher.close()
        self.projector.close()


def members(tmp: Path, kept: list[Record], changelog: MemoryChangelog, clock: Clock,
            names: str = "a") -> Iterator[Member]:
    log = CompactedLog(kept, changelog, LOG_ID)
    for name in names:
        yield Member(log, changelog, tmp / name, clock)


def test_a_fenced_writer_is_taken_again_once_its_time_came_and_publishes_again(
        tmp_path: Path) -> None:
    tmp = tmp_path
    kept, clock, changelog = records(), Clock(), MemoryChangelog()
    [member] = members(tmp, kept, changelog, clock)
    member.assign()
    _apply_upto(member.projector, len(kept) // 2)
    assert member.publisher.publish(0)
    changelog.writer(0)  # the coordinator (or anyone) fences the member's writer
    _apply_upto(member.projector, len(kept))
    assert not member.publisher.publish(0)
    assert member.publisher.owned() == []
    clock.now = 59.0
    assert member.publisher.retake() == [] and not member.publisher.publish(0)
    clock.now = 60.0
    assert member.publisher.retake() == [0]
    assert member.publisher.publish(0)  # what the fenced publication carried, and more
    assert checkpoints(changelog) == [len(kept) // 2, len(kept)]
    member.close()
    restored = digest(CompactedLog(compact_below(kept, len(kept)), changelog, LOG_ID),
                      tmp / "restored", True)
    assert restored == digest(CompactedLog(kept, MemoryChangelog(), LOG_ID), tmp / "truth",
                              False)


def fenced_member(tmp: Path, changelog: MemoryChangelog, clock: Clock) -> Member:
    """One member that applied three records and whose writer was then fenced from outside
    (its next publication is refused)."""
    [member] = members(tmp, records(), changelog, clock)
    member.assign()
    _apply_upto(member.projector, 3)
    changelog.writer(0)
    assert not member.publisher.publish(0)
    return member


def test_a_partition_let_go_given_to_another_or_not_open_here_is_not_taken_again(
        tmp_path: Path) -> None:
    changelog, clock = MemoryChangelog(), Clock()
    member = fenced_member(tmp_path, changelog, clock)
    member.publisher.release([0], final=True)  # the rebalance that follows a fence
    clock.now = 120.0
    assert member.publisher.retake() == []
    member.publisher.take([0])  # assigned again later: taken at once
    changelog.writer(0)
    assert not member.publisher.publish(0)
    member.publisher.held = lambda partition: False  # the group gave it to another
    clock.now = 240.0
    assert member.publisher.retake() == []
    member.publisher.held = lambda partition: True
    member.projector.revoked([0])  # the projector let it go first
    assert member.publisher.retake() == []
    member.close()


def test_a_take_that_fails_is_tried_again_after_as_long(tmp_path: Path) -> None:
    changelog, clock = FlakyChangelog(), Clock()
    member = fenced_member(tmp_path, changelog, clock)
    clock.now, changelog.refusals = 60.0, 1
    assert member.publisher.retake() == []  # refused: logged, not raised
    clock.now = 119.0
    assert member.publisher.retake() == []
    clock.now = 120.0
    assert member.publisher.retake() == [0] and member.publisher.publish(0)
    member.close()


def test_a_zombie_that_takes_the_writer_again_publishes_nothing_older_than_the_owner(
        tmp_path: Path) -> None:
    """The zombie's copy is behind what the owner published when it takes the writer back:
    it publishes only once it has applied past the owner's last checkpoint."""
    tmp = tmp_path
    kept, clock, changelog = records(), Clock(), MemoryChangelog()
    zombie, owner = members(tmp, kept, changelog, clock, "zo")
    zombie.assign()
    _apply_upto(zombie.projector, 8)
    assert zombie.publisher.publish(0)
    owner.assign()  # fences the zombie
    _apply_upto(owner.projector, 20)
    assert owner.publisher.publish(0)
    _apply_upto(zombie.projector, 12)
    assert not zombie.publisher.publish(0)  # fenced: let go
    clock.now = 60.0
    assert zombie.publisher.retake() == [0]  # fences the owner in turn
    assert not zombie.publisher.publish(0)  # 12 is behind the owner's 20
    _apply_upto(zombie.projector, len(kept))
    assert zombie.publisher.publish(0)
    assert checkpoints(changelog) == [8, 20, len(kept)]
    zombie.close()
    owner.close()


steps = st.lists(st.tuples(st.sampled_from(("apply", "round", "fence")),
                           st.integers(0, 1), st.integers(8, 24)), min_size=10, max_size=30)


@settings(max_examples=60, deadline=None)
@given(plan=steps)
def test_two_members_taking_the_writer_from_each_other_never_set_the_changelog_back(
        plan: list[tuple[str, int, int]]) -> None:
    """A zombie and the owner (each with its own copy, at its own offset) publish, are
    fenced (by each other, or by the coordinator) and take the writer again, in any order:
    the checkpoints only go forward, and a restore from what they left equals a full replay."""
    tmp = Path(tempfile.mkdtemp(prefix="retake-"))
    try:
        kept, clock, changelog = records(), Clock(), MemoryChangelog()
        zombie, owner = members(tmp, kept, changelog, clock, "zo")
        zombie.publisher.retake_after_s = owner.publisher.retake_after_s = 0.0
        zombie.assign()
        _apply_upto(zombie.projector, len(kept) // 3)
        zombie.publisher.publish(0)
        owner.assign()  # fences the zombie, restores from what it published
        both = (zombie, owner)
        for action, who, cut in plan:
            member = both[who]
            if action == "apply":
                _apply_upto(member.projector, min(cut, len(kept)))
            elif action == "round":  # one round of the publisher's loop
                member.publisher.retake()
                member.publisher.publish(0)
            else:
                changelog.writer(0)  # the coordinator ends whichever writer holds it
        for member in both:
            _apply_upto(member.projector, len(kept))
            member.publisher.retake()
            member.publisher.publish(0)
            member.close()
        found = checkpoints(changelog)
        assert found == sorted(found)
        last = found[-1]
        restored = digest(CompactedLog(compact_below(kept, last), changelog, LOG_ID,
                                       len(kept)), tmp / "restored", True)
        truth = digest(CompactedLog(kept, MemoryChangelog(), LOG_ID), tmp / "truth", False)
        assert restored == truth
        assert partition_digest(tmp / "o", 0, RESTORED) == truth
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_partition_fenced_and_unpublished_is_seen_aging_until_published_again(
        tmp_path: Path) -> None:
    """``unpublished_s`` (the metric effectlog_changelog_unpublished_seconds) counts from the
    last time the changelog held everything applied here, through a fence and a retake."""
    tmp = tmp_path
    kept, clock, changelog = records(), Clock(), MemoryChangelog()
    [member] = members(tmp, kept, changelog, clock)
    member.assign()
    assert member.publisher.unpublished_s() == {0: 0.0}
    _apply_upto(member.projector, 5)
    clock.now = 10.0
    assert member.publisher.unpublished_s() == {0: 10.0}  # applied, not yet published
    assert member.publisher.publish(0) and member.publisher.unpublished_s() == {0: 0.0}
    clock.now = 12.0
    assert not member.publisher.publish(0)  # nothing new: still current
    changelog.writer(0)
    _apply_upto(member.projector, 9)
    assert not member.publisher.publish(0)  # fenced
    clock.now = 80.0
    assert member.publisher.unpublished_s() == {0: 68.0}
    assert member.publisher.retake() == [0]
    assert member.publisher.unpublished_s() == {0: 68.0}  # taken again, not yet published
    assert member.publisher.publish(0) and member.publisher.unpublished_s() == {0: 0.0}
    member.publisher.release([0], final=True)
    assert member.publisher.unpublished_s() == {}
    member.close()


def test_a_member_stopped_before_its_first_round_still_publishes_what_it_applied(
        tmp_path: Path) -> None:
    changelog = MemoryChangelog()
    [member] = members(tmp_path, records(), changelog, Clock())
    member.publisher.interval_s = 3600.0  # stopped long before the first round is due
    member.assign()
    _apply_upto(member.projector, 4)
    stop = threading.Event()
    stop.set()
    member.publisher.run(stop)
    assert checkpoints(changelog) == [4]
    member.close()
