"""The changelog port: a compacted log of a projection's accepted state, per partition.

The events topic holds proposals, accepted or rejected; compaction keeps each key's latest
record, which may be one the projector rejected, so the events topic alone cannot rebuild a
projection. The partition's owner therefore publishes what it accepted to a changelog: each
publication is one transaction holding the latest stored state of every key changed since the
last one (or a tombstone for a key removed) and a checkpoint record, the events offset that
state reflects. A new owner, a standby or a rebuild restores the partition from the changelog
and replays the events topic from the checkpoint on (records younger than the compaction lag,
never compacted), which is exactly a full replay (Kafka Streams and quix-streams restore
their stores the same way, from a changelog of accepted state).

Only one owner may publish a partition at a time: taking a partition's :class:`ChangelogWriter`
fences every earlier writer of it (a paused owner that resumes after a rebalance), and what a
fenced writer had not committed is never read by a restore.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence

#: The key of a publication's checkpoint record (idempotency keys never hold NUL).
CHECKPOINT_KEY = b"\x00checkpoint"

#: One changelog record: a key and its stored state, or None (the key was removed).
Change = tuple[bytes, bytes | None]


class ReadStopped(Exception):
    """A changelog read ended because its ``stop`` event was set (its partition was taken
    away from the reader): what it yielded so far is not the whole partition."""


class ChangelogWriter(ABC):
    """The only publisher of one partition's changelog while it lives."""

    partition: int

    @abstractmethod
    def publish(self, changes: Sequence[Change], checkpoint: bytes) -> None:
        """Publish ``changes`` and then ``checkpoint`` as one transaction: a restore sees all
        of them or none. Raises :class:`~effectlog.errors.Fenced` when a later writer took
        the partition (nothing of this one is published then), and
        :class:`~effectlog.errors.BackendUnavailable` when the log does not answer."""

    @abstractmethod
    def close(self) -> None:
        """Let the partition go (an unfinished publication is aborted)."""


class Changelog(ABC):
    """The changelog of one log's events topic."""

    @abstractmethod
    def writer(self, partition: int) -> ChangelogWriter:
        """Take ``partition`` for publishing, fencing every earlier writer of it."""

    @abstractmethod
    def read(self, partition: int, stop: threading.Event | None = None) -> Iterator[Change]:
        """Every committed record of ``partition`` (compacted: the latest per key, with
        checkpoints among them), oldest first, up to an end that stopped moving (see
        :func:`read_to_settled_end`). Once ``stop`` is set the read raises
        :class:`ReadStopped` promptly, also while the log sends nothing."""

    @abstractmethod
    def last_checkpoint(self, partition: int) -> bytes | None:
        """The latest committed checkpoint of ``partition`` (None: nothing published yet),
        found without reading the whole partition."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the clients."""


#: How many times a read follows an end that moved while it read (publications come about
#: once a second; reading one takes milliseconds).
SETTLE_ROUNDS = 100


def read_to_settled_end(end: Callable[[], int], records: Callable[[int, int], Iterator[Change]],
                        rounds: int = SETTLE_ROUNDS,
                        stop: threading.Event | None = None) -> Iterator[Change]:
    """The records of ``[0, end)``, then of each stretch the end moved by while they were
    read, until it stops moving (at most ``rounds`` times).

    A reader that does not fence the owner (a standby copy, ``rebuild``, ``project``) reads
    while publications go on, and the cleaner may remove a key's record ahead of the reader
    once a later publication of the key exists: stopping at the end seen at the start would
    then miss the key altogether. The later record is in a later stretch, so reading on to
    the end gets it, and the last checkpoint read still covers everything before it.
    """
    start, until = 0, end()
    for _ in range(rounds):
        yield from records(start, until)
        if stop is not None and stop.is_set():
            raise ReadStopped
        start, until = until, end()
        if until <= start:
            return
