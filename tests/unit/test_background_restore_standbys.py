"""Background restores beside standby copies and revokes (found by an audit):

- a standby copy still restoring is never read: its store is emptied and refilled meanwhile,
  and a read from it answered "no effect with key" for a key its owner holds;
- promoting a standby copy that is still restoring opens that partition only (asking every
  open copy's offset used to open every partition of the topic when none was open yet);
- revoking a partition whose restore is only queued does not wait for the restores ahead of it
  (inside the group's callback, as long as the longest restore).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.node.forwarding import SoloMembership
from consumers.node.grouping import Grouping
from consumers.node.standby import WithStandbys
from effectlog.log.changelog import CHECKPOINT_KEY
from effectlog.log.source import AssignmentListener, Fetched, RecordSource
from projections.projector import Projector
from tests.unit.test_background_restore import (
    SETTINGS,
    HeldChangelog,
    Node,
    TwoPartitions,
    publish,
)

pytestmark = pytest.mark.timeout(60)


class NoGroup(RecordSource):
    """A group that assigns nothing by itself: the tests assign by hand."""

    def start(self, listener: AssignmentListener) -> None: ...

    def poll(self, limit: int, timeout_s: float) -> Fetched:
        return Fetched([], {})

    def seek(self, partition: int, offset: int) -> None: ...


@pytest.fixture
def published(tmp_path: Path) -> Iterator[tuple[TwoPartitions, HeldChangelog, str]]:
    """Both partitions published (0 long to restore, 1 short); a key of partition 0. The
    changelog holds the next restore after 100 records, for at most 8 s."""
    changelog = HeldChangelog()
    log = TwoPartitions(changelog)
    log.add(0, "p0", 1500)
    log.add(1, "p1", 50)
    publish(log, changelog, tmp_path / "owner", (0, 1))
    key = sorted(k.decode() for k, v in changelog.records[0] if v and k != CHECKPOINT_KEY)[-1]
    changelog.hold_after = 100
    releaser = threading.Timer(8.0, changelog.release.set)
    releaser.start()
    yield log, changelog, key
    changelog.release.set()
    releaser.cancel()


def member(log: TwoPartitions, state: Path) -> tuple[Projector, WithStandbys]:
    projector = Projector(log, state, SETTINGS, follow_swaps=False, background_restores=True)
    return projector, WithStandbys(NoGroup(), log, projector)


def test_a_standby_copy_still_restoring_is_not_read(
        tmp_path: Path, published: tuple[TwoPartitions, HeldChangelog, str]) -> None:
    log, changelog, key = published
    projector, standby = member(log, tmp_path / "member")
    grouping = Grouping(standby, SoloMembership("http://me", 2))
    try:
        standby.want({0})
        standby._follow_plan()  # this member keeps partition 0 warm for its owner
        assert changelog.holding.wait(10.0) and projector.restoring() == {0: 3000}
        assert grouping.standbys() == {}  # so /v1/effects falls through to 503, never 404
        changelog.release.set()
        deadline = time.monotonic() + 10.0
        while projector.restoring() and time.monotonic() < deadline:
            projector.run(once=True)  # takes the restored copy back between two batches
            time.sleep(0.01)
        assert grouping.standbys() == {0: 3000}
        assert projector.store.reader().get(key) is not None  # type: ignore[attr-defined]
    finally:
        projector.close()


def test_promoting_a_standby_copy_still_restoring_opens_no_other_partition(
        tmp_path: Path, published: tuple[TwoPartitions, HeldChangelog, str]) -> None:
    log, changelog, _ = published
    projector, standby = member(log, tmp_path / "member")
    try:
        standby.want({0})
        standby._follow_plan()
        assert changelog.holding.wait(10.0) and projector.assignment == [0]
        standby._promote([0])  # the group gives this member partition 0 (its owner died)
        assert projector.assignment == [0]
        assert sorted(projector.store.writers()) == [0]  # type: ignore[attr-defined]
    finally:
        projector.close()


def test_revoking_a_queued_restore_does_not_wait_for_the_one_ahead(
        tmp_path: Path, published: tuple[TwoPartitions, HeldChangelog, str]) -> None:
    log, changelog, _ = published
    log.add(0, "tail0", 5)  # both copies behind their checkpoints: both restore
    log.add(1, "tail1", 5)
    node = Node(log, tmp_path / "node")
    try:
        assert changelog.holding.wait(10.0)
        assert sorted(node.projector.restoring()) == [0, 1]  # 1 queued behind 0 (held)
        started = time.monotonic()
        node.assignments.revoked([1], lost=True)  # the group takes partition 1 away
        assert time.monotonic() - started < 4.0  # not the 8 s partition 0 is held for
        assert sorted(node.projector.restoring()) == [0]
        changelog.release.set()
        deadline = time.monotonic() + 10.0
        while node.projector.restoring() and time.monotonic() < deadline:
            node.projector.step(node.source)
        assert node.projector.assignment == [0]
    finally:
        node.projector.close()
