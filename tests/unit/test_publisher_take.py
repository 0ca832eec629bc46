"""A takeover takes the changelog writers of its partitions side by side.

Each take is a round trip to the transaction coordinator (which fences the earlier owner) and
one to the partition's leader (the last checkpoint); taken one after another, a member given
twelve partitions held its rebalance up for twelve of each. The changelog below lets no writer
be taken until every partition of the takeover asks for one, so a take one at a time fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

from consumers.node.publisher import Publisher
from effectlog.errors import BackendUnavailable
from effectlog.log.changelog import Change, Changelog, ChangelogWriter

PARTITIONS = [0, 1, 2, 3, 4, 5]


class _Writer(ChangelogWriter):
    def __init__(self, changelog: TogetherChangelog, partition: int) -> None:
        self.changelog = changelog
        self.partition = partition

    def publish(self, changes: Sequence[Change], checkpoint: bytes) -> None:
        raise AssertionError("nothing is published here")

    def close(self) -> None:
        self.changelog.note("closed", self.partition)


class TogetherChangelog(Changelog):
    """Gives writers only once ``together`` partitions ask at the same time; ``broken``
    partitions' writers (or last checkpoints) fail as a broker that went away."""

    def __init__(self, together: int, broken_writers: Sequence[int] = (),
                 broken_checkpoints: Sequence[int] = ()) -> None:
        self.barrier = threading.Barrier(together, timeout=5)
        self.broken_writers = set(broken_writers)
        self.broken_checkpoints = set(broken_checkpoints)
        self.events: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def note(self, what: str, partition: int) -> None:
        with self._lock:
            self.events.append((what, partition))

    def writer(self, partition: int) -> ChangelogWriter:
        self.barrier.wait()  # BrokenBarrierError unless the others ask meanwhile
        if partition in self.broken_writers:
            raise BackendUnavailable(f"no transaction coordinator for partition {partition}")
        self.note("writer", partition)
        return _Writer(self, partition)

    def last_checkpoint(self, partition: int) -> bytes | None:
        if partition in self.broken_checkpoints:
            raise BackendUnavailable(f"no leader for partition {partition}")
        self.note("checkpoint", partition)
        return None

    def read(self, partition: int, stop: threading.Event | None = None) -> Iterator[Change]:
        return iter(())


def test_the_writers_of_a_takeover_are_taken_side_by_side_each_before_its_checkpoint() -> None:
    changelog = TogetherChangelog(together=len(PARTITIONS))
    publisher = Publisher(changelog, lambda: {}, "log-1")
    publisher.take(PARTITIONS)
    assert publisher.owned() == PARTITIONS
    for partition in PARTITIONS:  # fenced first, then read: no earlier owner moves it since
        assert changelog.events.index(("writer", partition)) < \
            changelog.events.index(("checkpoint", partition))
    publisher.take(PARTITIONS)  # taken already: nothing is asked again
    assert len(changelog.events) == 2 * len(PARTITIONS)


def test_a_take_that_fails_keeps_the_others_and_the_next_take_asks_only_for_the_rest() -> None:
    changelog = TogetherChangelog(together=len(PARTITIONS), broken_writers=[2],
                                  broken_checkpoints=[4])
    publisher = Publisher(changelog, lambda: {}, "log-1")
    with pytest.raises(BackendUnavailable, match="partition 2"):
        publisher.take(PARTITIONS)
    assert publisher.owned() == [0, 1, 3, 5]
    assert ("closed", 4) in changelog.events  # its writer is let go with its checkpoint unread
    # the caller tries again (the group's assignment callback does, while the broker is away)
    changelog.barrier = threading.Barrier(2, timeout=5)
    changelog.broken_writers.clear()
    changelog.broken_checkpoints.clear()
    changelog.events.clear()
    publisher.take(PARTITIONS)
    assert publisher.owned() == PARTITIONS
    assert sorted(p for what, p in changelog.events if what == "writer") == [2, 4]
