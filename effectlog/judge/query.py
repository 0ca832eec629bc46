"""What a writer asks the judge and what it answers (pure types, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from effectlog.model import EffectEvent

#: A verdict's ``reason`` when the judge no longer remembers the event (too many accepted
#: events of the key since): not a positive verdict.
FORGOTTEN = "forgotten"
#: A verdict's ``reason`` when the record at the offset is accepted but is another event.
OTHER_EVENT = "other_event"


@dataclass(frozen=True, slots=True)
class Written:
    """One of the asker's own events: where its delivery report put it, and its id."""

    offset: int
    event_id: str


@dataclass(frozen=True, slots=True)
class Query:
    """A question about one key.

    ``written``: the asker's own events of the key, each to be judged; the answer waits until
    the partition has applied all of them. ``after``: answer once the partition has applied
    that offset (read-your-writes). ``fresh``: answer once it has applied the partition's end
    as of the question. With none of them the answer is the key as the judge has it now.
    """

    key: str
    written: tuple[Written, ...] = ()
    after: int | None = None
    fresh: bool = False

    @property
    def applied_at_least(self) -> int:
        """The applied offset an answer must reach (0: any)."""
        floor = 0 if self.after is None else self.after + 1
        return max([floor, *(w.offset + 1 for w in self.written)])


@dataclass(frozen=True, slots=True)
class Verdict:
    """The judge's word on one written event: ``accepted`` only when the judge has it among
    the key's accepted events; else ``reason`` says why not (a rejection reason, another
    event at that offset, or forgotten)."""

    offset: int
    event_id: str
    accepted: bool
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Premises:
    """What an answer rests on: the events topic's ID (the log's identity), the projection
    generation that answered, the fingerprint of the rules and writer schema it judged
    with, and the member that answered."""

    topic_id: str | None
    generation: str
    judge: str
    served_by: str


@dataclass(frozen=True, slots=True)
class Answer:
    """The judge's answer to a :class:`Query`, read from one consistent snapshot: every
    record of ``partition`` below ``applied`` is reflected in ``state`` and ``verdicts``.
    ``snapshot`` is the state's JSON view (what ``effectlog get --json`` prints)."""

    key: str
    partition: int
    applied: int
    state: EffectEvent | None
    verdicts: tuple[Verdict, ...]
    premises: Premises
    snapshot: dict[str, Any] | None = None

    def verdict(self, written: Written) -> Verdict | None:
        """The verdict on ``written``, if the answer has one."""
        for verdict in self.verdicts:
            if verdict.offset == written.offset and verdict.event_id == written.event_id:
                return verdict
        return None


class Judge(Protocol):
    """Where a writer without compare-and-append learns what its writes mean: one method,
    many questions at once (answers in the order asked). Raises
    :class:`~effectlog.errors.BackendUnavailable` when no judge answers in time, never a
    false answer."""

    def ask(self, queries: Sequence[Query]) -> list[Answer]:
        """Answer every query; each answer is checked by the asker (:func:`check_answer`)."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
