"""A serving node restores a partition from the changelog on a thread of its own: its other
partitions go on being applied meanwhile, the restored partition serves only once it is
opened, and one taken away mid-restore stops it and leaves nothing behind.

The changelog here holds its read back after a number of records until the test lets it go,
the way a long restore keeps a real one busy.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from consumers.node.assignments import Assignments
from consumers.node.gate import PartitionGate
from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable, LogMissing
from effectlog.log.base import EVENTS, Record
from effectlog.log.changelog import (
    CHECKPOINT_KEY,
    Change,
    Changelog,
    ChangelogWriter,
    ReadStopped,
)
from effectlog.log.memory import MemoryLog
from effectlog.log.source import LogSource
from effectlog.machine import advance, new_effect
from effectlog.model import Transition
from projections.projector import Projector, ProjectorSettings
from projections.rocksdb.digest import partition_digest
from tests.restore_support import RESTORED

LOG_ID = "log-1"
SETTINGS = ProjectorSettings(decoder="inline", idle_sleep_s=0.0)


class HeldChangelog(Changelog):
    """Publications per partition; a read stops after ``hold_after`` records until
    ``release`` is set (at most 10 s), as a silent broker would, and fails ``failures``
    times first. Like every changelog, it ends a read whose ``stop`` is set."""

    def __init__(self) -> None:
        self.records: dict[int, list[Change]] = {0: [], 1: []}
        self.hold_after = 10**9
        self.holding = threading.Event()
        self.release = threading.Event()
        self.failures: list[Exception] = []
        self.reads = 0

    def writer(self, partition: int) -> ChangelogWriter:
        raise NotImplementedError

    def read(self, partition: int, stop: threading.Event | None = None) -> Iterator[Change]:
        self.reads += 1
        if self.failures:
            raise self.failures.pop(0)
        for index, change in enumerate(list(self.records[partition])):
            if index == self.hold_after:
                self.holding.set()
                for _ in range(1000):
                    if self.release.wait(0.01):
                        break
                    if stop is not None and stop.is_set():
                        raise ReadStopped
                else:
                    raise AssertionError("the test never let the read go")
            yield change

    def last_checkpoint(self, partition: int) -> bytes | None:
        found = [v for k, v in self.records[partition] if k == CHECKPOINT_KEY]
        return found[-1] if found else None


class TwoPartitions(MemoryLog):
    """Two partitions of records given by the test, and a changelog."""

    def __init__(self, changelog: Changelog | None) -> None:
        super().__init__()
        self.kept: dict[int, list[Record]] = {0: [], 1: []}
        self._changelog = changelog

    def identity(self) -> str:
        return LOG_ID

    def changelog(self) -> Changelog | None:
        return self._changelog

    def partitions(self, topic: str) -> int:
        return 2

    def add(self, partition: int, prefix: str, keys: int) -> None:
        codec = event_codec()
        for n in range(keys):
            created = new_effect(f"{prefix}-{n}", "email.send", f"to:{n}", {"n": n}, "w1")
            for event in (created, advance(created, Transition.RESERVE, "w1")):
                kept = self.kept[partition]
                kept.append(Record(EVENTS, partition, len(kept), event.idempotency_key,
                                   codec.encode(event.to_record()), int(time.time() * 1000)))

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        return [r for r in self.kept[partition] if r.offset >= offset][:limit] \
            if topic == EVENTS else []

    def end_offsets(self, topic: str) -> dict[int, int]:
        return {p: len(kept) for p, kept in self.kept.items()} if topic == EVENTS else {}


def publish(log: TwoPartitions, changelog: HeldChangelog, state: Path,
            partitions: tuple[int, ...]) -> dict[int, int]:
    """Project ``log`` under ``state`` and publish ``partitions`` to ``changelog``, as their
    owner would; the offset each checkpoint was published at."""
    published = {}
    with Projector(log, state, SETTINGS, follow_swaps=False) as owner:
        owner.run(once=True)
        for partition in partitions:
            writer = owner.store.writers()[partition]  # type: ignore[attr-defined]
            changes = writer.take_changes()
            assert changes is not None
            changelog.records[partition] = [*changes.changes,
                                            (CHECKPOINT_KEY, changes.checkpoint(LOG_ID))]
            published[partition] = writer.next_offset
    return published


def published_log(tmp: Path) -> tuple[TwoPartitions, HeldChangelog, int]:
    """A log whose partition 0 was published (then got a tail), partition 1 never; the
    offset partition 0's checkpoint was published at."""
    changelog = HeldChangelog()
    log = TwoPartitions(changelog)
    log.add(0, "p0", 1500)
    log.add(1, "p1", 5)
    published = publish(log, changelog, tmp / "owner", (0,))[0]
    log.add(0, "tail0", 5)
    log.add(1, "more1", 5)
    return log, changelog, published


def steps_until(projector: Projector, source: LogSource, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10.0
    for _ in range(10_000):
        if done() or time.monotonic() > deadline:
            break
        projector.step(source)
        time.sleep(0.001)
    assert done()


def assert_equals_a_synchronous_restore(log: TwoPartitions, changelog: HeldChangelog,
                                        tmp: Path) -> None:
    """Partition 0 restored in the background (under ``tmp/node``) equals the same restore
    done in line, then the same tail applied."""
    changelog.hold_after = 10**9
    with Projector(log, tmp / "sync", SETTINGS, follow_swaps=False) as projector:
        projector.run(once=True)
    assert partition_digest(tmp / "node", 0, RESTORED) == \
        partition_digest(tmp / "sync", 0, RESTORED)


class Node:
    """A projector, its gate and the listener between them, as ``serve`` wires them."""

    def __init__(self, log: TwoPartitions, state: Path) -> None:
        self.gate = PartitionGate()
        self.projector = Projector(log, state, SETTINGS, follow_swaps=False,
                                   background_restores=True, on_applied=self.gate.applied,
                                   on_opened=self.gate.opened)
        self.assignments = Assignments(self.projector, self.gate, None, log)
        self.source = LogSource(log, [0, 1])
        self.source.start(self.assignments)


def serving_node(log: TwoPartitions, state: Path) -> tuple[Projector, PartitionGate, LogSource]:
    node = Node(log, state)
    return node.projector, node.gate, node.source


def test_the_other_partitions_are_applied_while_one_restores(tmp_path: Path) -> None:
    log, changelog, published = published_log(tmp_path)
    changelog.hold_after = 700
    projector, gate, source = serving_node(log, tmp_path / "node")
    try:
        assert projector.restoring() == {0: published}
        assert changelog.holding.wait(10.0)
        steps_until(projector, source, lambda: gate.status(1) == "serving")
        assert projector.next_offsets() == {1: 20}  # applied while 0 restores
        assert gate.status(0) == "restoring" and gate.serving() == [1]
        assert not gate.wait(0, 0, 0)  # nothing of a restoring partition is answered
        changelog.release.set()
        steps_until(projector, source, lambda: gate.status(0) == "serving")
        assert projector.restoring() == {}
        assert projector.next_offsets() == {0: published + 10, 1: 20}
    finally:
        projector.close()
    assert_equals_a_synchronous_restore(log, changelog, tmp_path)


def test_a_partition_taken_away_mid_restore_stops_its_restore(tmp_path: Path) -> None:
    log, changelog, published = published_log(tmp_path)
    changelog.hold_after = 100
    node = Node(log, tmp_path / "node")
    projector, gate, source = node.projector, node.gate, node.source
    try:
        assert changelog.holding.wait(10.0)
        # the read sends nothing more (a silent broker): taking the partition away stops it
        # at once, not when the read would have failed (the group waits on this callback)
        revoking = time.monotonic()
        node.assignments.revoked([0], lost=False)  # waits until the restore stopped writing
        assert time.monotonic() - revoking < 5.0 and not changelog.release.is_set()
        assert gate.status(0) is None
        assert projector.restoring() == {} and projector.assignment == [1]
        assert 0 not in projector.store.writers()  # type: ignore[attr-defined]
        for _ in range(50):
            projector.step(source)
        assert 0 not in projector.next_offsets()  # the stopped restore is never opened
        changelog.hold_after = 10**9
        node.assignments.assigned([0])  # given back: restored afresh, completely
        assert gate.status(0) == "restoring"
        steps_until(projector, source, lambda: gate.status(0) == "serving")
        assert changelog.reads == 2
        assert projector.next_offsets()[0] == published + 10
    finally:
        projector.close()
    assert_equals_a_synchronous_restore(log, changelog, tmp_path)


def test_an_unreachable_changelog_is_retried_in_the_background(tmp_path: Path) -> None:
    log, changelog, published = published_log(tmp_path)
    changelog.failures = [BackendUnavailable("broker away"), BackendUnavailable("still away")]
    projector, gate, source = serving_node(log, tmp_path / "node")
    try:
        steps_until(projector, source, lambda: gate.status(0) == "serving")
        assert changelog.reads == 3 and projector.next_offsets()[0] == published + 10
    finally:
        projector.close()


def test_what_a_restore_fails_with_is_raised_on_the_projector_thread(tmp_path: Path) -> None:
    log, changelog, _ = published_log(tmp_path)
    changelog.failures = [LogMissing("no changelog topic effects.changelog")]
    projector, gate, source = serving_node(log, tmp_path / "node")
    try:
        with pytest.raises(LogMissing, match="no changelog topic"):
            for _ in range(1000):
                projector.step(source)
                time.sleep(0.005)
        assert gate.status(0) == "restoring"  # never served
    finally:
        projector.close()


def test_a_pending_partition_serves_only_once_opened() -> None:
    gate = PartitionGate()
    gate.assigned(0, 10, 5, pending=True)  # its position alone would serve it
    assert gate.status(0) == "restoring"
    gate.applied(0, 12)
    assert gate.status(0) == "restoring" and not gate.wait(0, 1, 0)
    gate.opened(0, 12)
    assert gate.status(0) == "serving" and gate.wait(0, 12, 0)
    gate.opened(7, 3)  # not ours: nothing happens
    assert gate.status(7) is None
