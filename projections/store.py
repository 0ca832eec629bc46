"""The ports of the projection: a reader for the CLI, workers and recovery, and the store
the projector writes through.

:class:`ProjectionStore` hands out one :class:`PartitionWriter` per partition assigned to
this process (opened on assignment, released on revocation); the projector
(``projections.projector``) is its only user. Everything else reads through
:class:`ProjectionReader`, which is safe to use while the projector runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Self

if TYPE_CHECKING:
    from effectlog.log.base import EventLog, Position, Record
    from effectlog.log.changelog import Change
    from effectlog.model import EffectEvent, State
    from projections.checkpoint import Changes, Checkpoint
    from projections.decoding import Decoded


class Rejection(NamedTuple):
    """An event the projector refused, kept with why and its raw bytes.

    (A named tuple rather than a dataclass: readers such as ``get --json`` import this
    module and should not pay for importing :mod:`dataclasses`.)
    """

    position: Position
    key: str
    reason: str
    detail: str
    raw: bytes
    at_ms: int


#: A position in the state/time index: (log time of the last transition, ms clamped at 0, key).
Cursor = tuple[int, str]


class Logged(NamedTuple):
    """A snapshot and the log's own time of its record (``logged_at``, epoch ms): the
    broker's append time on Kafka, the insertion time on SQLite, never the writer's clock."""

    logged_at: int
    event: EffectEvent


def cursor_of(snapshot: Mapping[str, Any]) -> Cursor:
    """Where the snapshot (JSON view) sits in its state's index (by ``logged_at``; a view
    without it, by the event's own time)."""
    at = snapshot.get("logged_at")
    return max(int(snapshot["occurred_at"] if at is None else at), 0), \
        str(snapshot["idempotency_key"])


class ProjectionReader(ABC):
    """Queries over the projected state; a fresh read sees what the projector committed."""

    @abstractmethod
    def get(self, key: str) -> EffectEvent | None:
        """The current snapshot of ``key``, or None."""

    @abstractmethod
    def scan_logged(self, state: State, older_than_ms: int | None = None,
                    limit: int | None = None, after: Cursor | None = None) -> Iterator[Logged]:
        """Effects in ``state`` whose last transition was logged before ``older_than_ms``
        (epoch milliseconds of the log's own time), oldest first, with that time: a range
        scan over the state/time index.

        ``after`` resumes a scan: only effects ordered after that (log time, key) position
        (see :func:`cursor_of`), so paging costs one seek, never a rescan.
        """

    def scan_state(self, state: State, older_than_ms: int | None = None,
                   limit: int | None = None, after: Cursor | None = None) -> Iterator[EffectEvent]:
        """:meth:`scan_logged`'s snapshots alone."""
        for logged in self.scan_logged(state, older_than_ms, limit, after):
            yield logged.event

    @abstractmethod
    def rejected(self, limit: int | None = None) -> Iterator[Rejection]:
        """Rejected events, in log order (by partition, then offset)."""

    @abstractmethod
    def rejected_at(self, position: Position) -> Rejection | None:
        """The rejection stored for the event at ``position``, if it was rejected."""

    @abstractmethod
    def next_offsets(self) -> dict[int, int]:
        """Per partition of the events topic: the next offset the projector will apply."""

    def log_ids(self) -> dict[int, str | None]:
        """Per partition: the identity of the log it was projected from (None: unknown)."""
        return {}

    @abstractmethod
    def counts(self) -> dict[str, int]:
        """Number of effects per state name, and of rejected events per reason
        (keys ``state:<NAME>`` and ``rejected:<reason>``)."""

    def get_json(self, key: str) -> dict[str, Any] | None:
        """The JSON view of ``key``'s snapshot (``EffectEvent.to_json()`` shape), or None."""
        event = self.get(key)
        return None if event is None else event.to_json()

    def scan_state_json(self, state: str, older_than_ms: int | None = None,
                        limit: int | None = None,
                        after: Cursor | None = None) -> Iterator[dict[str, Any]]:
        """:meth:`scan_state` as JSON views."""
        from effectlog.model import State

        for event in self.scan_state(State(state), older_than_ms, limit, after):
            yield event.to_json()

    def refresh(self) -> None:  # noqa: B027 - optional hook
        """Catch up with what the projector committed since the reader opened."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the database handles."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Applied(NamedTuple):
    """What one batch did to a partition."""

    records: int
    accepted: int
    rejected: int
    next_offset: int


class PartitionWriter(ABC):
    """The only writer of one partition's projection.

    ``apply`` judges a batch of consecutive records and commits the resulting state
    together with the partition's next offset, all or nothing: a writer killed at any
    instant resumes at ``next_offset`` and ends with the state of a clean rebuild.
    """

    partition: int
    next_offset: int
    #: The log is compacted and read from its start without a changelog, so a key's oldest
    #: surviving record may be any event: it is taken as the key's starting point.
    trust_first: bool = False

    @abstractmethod
    def apply(self, records: Sequence[Record],
              decoded: Sequence[Decoded] | None = None) -> Applied:
        """Judge and commit ``records``; those below ``next_offset`` are skipped."""

    @abstractmethod
    def bind_log(self, log: EventLog) -> None:
        """Refuse (:class:`~effectlog.errors.WrongLog`) to continue on a log other than the
        one this partition was projected from, or one shorter than its stored offset;
        record ``log``'s identity when none is recorded yet (see :mod:`projections.lineage`)."""

    @abstractmethod
    def take_changes(self) -> Changes | None:
        """The states of the keys changed since the last publication, as of one applied
        offset (None: nothing to publish); see :mod:`effectlog.log.changelog`."""

    @abstractmethod
    def publish_all(self) -> None:
        """Make the next publication carry every key of the partition."""

    @abstractmethod
    def published(self, changes: Changes, ok: bool) -> None:
        """``changes`` were published (``ok``), or their publication failed: their keys go
        with the next one."""

    @abstractmethod
    def restore(self, records: Iterable[Change], log_id: str | None) -> Checkpoint | None:
        """Write a changelog's records into this (empty) partition and continue at its last
        checkpoint; None when it held none. Raises :class:`~effectlog.errors.WrongLog` for a
        changelog of another events log."""

    @abstractmethod
    def skip_to(self, next_offset: int) -> None:
        """Move the stored offset over offsets that hold no records (Kafka's transaction
        markers, compacted tails), so "applied up to the log end" can be true."""


class ProjectionStore(ABC):
    """Where one process keeps the projection of the partitions assigned to it."""

    @abstractmethod
    def open_writer(self, partition: int, *, partitions: int) -> PartitionWriter:
        """Open ``partition`` (of ``partitions`` in all) for writing, creating it if needed.

        Raises :class:`~effectlog.errors.BackendUnavailable` when another process writes it
        already.
        """

    @abstractmethod
    def reset_writer(self, partition: int, *, partitions: int) -> PartitionWriter:
        """``partition``'s writer (opened if need be), emptied, to be restored."""

    @abstractmethod
    def release(self, partition: int) -> None:
        """Close ``partition``'s writer (revoked or lost); its state stays on disk."""

    @abstractmethod
    def reader(self) -> ProjectionReader:
        """A reader over the partitions open for writing here, seeing each commit at once."""

    def outdated(self) -> bool:
        """Whether the projection was replaced under the open writers (a rebuild swapped a
        new one in); the projector then releases and reopens its partitions."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Release every partition."""
