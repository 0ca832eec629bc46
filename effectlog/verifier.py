"""Judge a key's records as the projector did, for audits (``replay``, ``history``).

:class:`HistoryVerifier` folds each key's events in log order with the state machine's own
rules (:func:`~effectlog.machine.check`). On a log that keeps every record (SQLite) that
fold is the projector's verdict. On a compacted log (Kafka) it is not: compaction keeps a
key's latest record, which may be one the projector rejected, and folding what survived
would accept it. There the verifier is given what each partition's owner last published to
the changelog (:class:`Published`): the events offset that publication reflects and, per
key, the accepted state and the positions of its accepted events. A record below that offset
was accepted exactly when its position is among its key's accepted positions; from that
offset on, records are folded from the published state, as a projector restored from the
changelog folds them. Either way the verdicts are a full replay's, and the accepted events
whose records compaction removed are known by position (:meth:`HistoryVerifier.removed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from effectlog.errors import Conflict, ExpiresAnother, InvalidInput, NotSettled
from effectlog.keys import make_key
from effectlog.log.base import Position, Record
from effectlog.machine import check, check_expiry
from effectlog.model import EffectEvent, Transition

#: The reason of a record below a publication that its owner did not accept, when the state
#: it was judged against was compacted away (so the rule it broke cannot be named).
NOT_ACCEPTED = "not_accepted"


@dataclass(frozen=True, slots=True)
class Violation:
    """A record whose presence in the log breaks the rules, and why."""

    position: Position
    key: str
    reason: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"position": {"partition": self.position.partition,
                             "offset": self.position.offset},
                "key": self.key, "reason": self.reason, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class PublishedKey:
    """One key as its owner published it: the accepted state, and the (offset, event id) of
    its accepted events, oldest first (``truncated``: older ones were not kept)."""

    event: EffectEvent
    accepted: tuple[tuple[int, str], ...]
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Published:
    """A partition's last publication: every record below ``applied`` was judged, and
    ``keys`` holds each key's accepted state then (a key absent had nothing accepted)."""

    partition: int
    applied: int
    keys: Mapping[str, PublishedKey]
    #: how many keys of the partition expiries removed below ``applied``
    expired: int = 0


def rule_broken(exc: InvalidInput | Conflict) -> str:
    """The reason a rule gives (the projector stores the same): a bare :class:`Conflict`
    from :func:`~effectlog.machine.check` is a repeated event id."""
    if isinstance(exc, InvalidInput):
        return "invalid_event"
    return "duplicate" if type(exc) is Conflict else exc.reason


class HistoryVerifier:
    """Folds each key's events in log order and names every event that breaks the rules.

    Beyond :func:`~effectlog.machine.check` (the projector's verdict), it flags two
    invariants by name: ``payload_hash_changed`` (one key, two payloads) and
    ``epoch_regression`` (a fencing epoch below the key's accepted one). Without
    ``published``, a key's first event must be its CREATE (``missing_create`` otherwise: the
    event is rejected and the fold does not start from it, as the projector's) unless
    ``trust_first`` is set, as for a time window: then the first event, which carries the
    key's full snapshot, becomes the baseline. With ``published`` (partition ->
    :class:`Published`), records of those partitions are judged as described in the module
    docstring. A rejected event never advances the fold.
    """

    def __init__(self, *, trust_first: bool = False,
                 published: Mapping[int, Published] | None = None,
                 named_invariants: bool = True) -> None:
        self.trust_first = trust_first
        self.named_invariants = named_invariants
        self.published = dict(published or {})
        self._current: dict[str, EffectEvent] = {}
        self._current_at: dict[str, int] = {}  # offset of the fold's event, below a publication
        self._first_hash: dict[str, str] = {}
        self._seen: dict[str, set[int]] = {}  # accepted offsets read below the publication
        self._rebased: set[str] = set()
        self._observed: set[str] = set()  # keys read in published partitions
        self.partial_keys: set[str] = set()
        #: records whose verdict cannot be told (see :attr:`judged`)
        self.unjudged = 0
        #: False when the last record observed could not be judged: below a publication,
        #: older than the accepted positions it kept or than an expiry of its key; or a
        #: window's first record of a key, when it is an expiry
        self.judged = True

    def observe(self, record: Record, event: EffectEvent) -> Violation | None:
        """Judge ``event`` (read at ``record``); accepted events advance the key's fold."""
        key = event.idempotency_key
        self.judged = True
        if record.key != key:
            return Violation(record.position, record.key, "key_mismatch",
                             f"event for {key!r} stored under log key {record.key!r}")
        published = self.published.get(record.partition)
        if published is not None:
            self._observed.add(key)
            if record.offset < published.applied:
                return self._by_publication(record, event, published)
            if key not in self._rebased:
                self._rebase(key, published)
        return self._by_rules(record, event, baseline=published is None)

    def observe_expiry(self, record: Record) -> Violation | None:
        """Judge a tombstone (an expiry of ``record.key``); an accepted one ends the key's
        fold, and the key used again is a new effect."""
        key = record.key
        self.judged = True
        published = self.published.get(record.partition)
        if published is not None:
            self._observed.add(key)
            if record.offset < published.applied:
                return self._expiry_by_publication(record, published)
            if key not in self._rebased:
                self._rebase(key, published)
        elif key not in self._first_hash and (self.trust_first or key in self.partial_keys):
            return self._unjudged()  # a window's first record of the key
        try:
            check_expiry(self._current.get(key), key, record.expires)
        except (NotSettled, ExpiresAnother) as exc:
            return Violation(record.position, key, exc.reason, str(exc))
        self._current.pop(key, None)
        self._current_at.pop(key, None)
        self._first_hash.pop(key, None)
        self.partial_keys.discard(key)
        return None

    def undecodable(self, record: Record) -> None:
        """Note a record that could not be decoded (rejected; its key was read)."""
        if record.partition in self.published:
            self._observed.add(record.key)

    def removed(self, key: str, partition: int) -> list[tuple[int, str]]:
        """The (offset, event id) of ``key``'s accepted events below the publication whose
        records were not read (compaction removed them, or they lie outside what was read)."""
        published = self.published.get(partition)
        known = None if published is None else published.keys.get(key)
        if known is None:
            return []
        seen = self._seen.get(key, set())
        return [(offset, event_id) for offset, event_id in known.accepted
                if offset not in seen and offset < published.applied]  # type: ignore[union-attr]

    def removed_count(self) -> int:
        """How many accepted events of the keys read compaction removed."""
        return sum(len(self.removed(key, partition))
                   for partition, published in self.published.items()
                   for key in self._observed & published.keys.keys())

    # -- the fold ---------------------------------------------------------------------------

    def _by_rules(self, record: Record, event: EffectEvent, baseline: bool) -> Violation | None:
        key = event.idempotency_key

        def violation(reason: str, detail: str) -> Violation:
            return Violation(record.position, record.key, reason, detail)

        first_seen = key not in self._first_hash
        first_hash = self._first_hash.setdefault(key, event.payload_hash)
        current = self._current.get(key)
        if self.named_invariants:
            named = self._named(event, first_hash, current)
            if named is not None:
                return violation(*named)
        if baseline and first_seen and event.transition is not Transition.CREATE:
            return self._baseline(record, event)
        try:
            check(current, event)
        except (Conflict, InvalidInput) as exc:
            if current is None and not (baseline and self.trust_first):
                self._first_hash.pop(key, None)  # as the projector: nothing accepted yet
            return violation(rule_broken(exc), str(exc))
        # The fold never needs payload bytes again (later events carry only the hash).
        self._current[key] = replace(event, payload=None) if event.payload else event
        return None

    @staticmethod
    def _named(event: EffectEvent, first_hash: str,
               current: EffectEvent | None) -> tuple[str, str] | None:
        if event.payload_hash != first_hash:
            return ("payload_hash_changed",
                    f"payload_hash {event.payload_hash[:12]}… differs from "
                    f"{first_hash[:12]}… first seen under this key")
        if current is not None and event.fencing_epoch < current.fencing_epoch:
            return ("epoch_regression",
                    f"{event.transition.value} at epoch {event.fencing_epoch} after "
                    f"epoch {current.fencing_epoch} was accepted")
        if current is not None and event.event_id == current.event_id:
            return "duplicate", f"event {event.event_id} delivered twice"
        return None

    def _baseline(self, record: Record, event: EffectEvent) -> Violation | None:
        key = event.idempotency_key
        try:
            bound = make_key(event.operation_id, event.kind, event.target) == key
        except InvalidInput as exc:
            return Violation(record.position, key, "invalid_event", str(exc))
        if not bound:
            return Violation(record.position, key, "payload_mismatch",
                             "key does not match its operation, kind and target")
        self.partial_keys.add(key)
        if self.trust_first:
            self._current[key] = event
            return None
        # As the projector (machine.fold): rejected, so neither the fold nor the payload hash
        # starts from it; the key's CREATE, if it comes later, is judged on its own.
        self._first_hash.pop(key, None)
        return Violation(record.position, key, "missing_create",
                         f"history starts with {event.transition.value}: the earlier events "
                         "were compacted away or never written (rejected: no CREATE before it)")

    # -- below a publication ----------------------------------------------------------------

    def _unjudged(self) -> Violation | None:
        """No verdict (see :attr:`judged`): no violation either."""
        self.unjudged += 1
        self.judged = False
        return None

    @staticmethod
    def _in_life(record: Record, known: PublishedKey | None, published: Published) -> bool:
        """Whether ``record`` is at or after the start of the key's published life (its first
        accepted event); without expiries in the partition every record is."""
        if not published.expired:
            return True
        return known is not None and bool(known.accepted) and not known.truncated \
            and record.offset >= known.accepted[0][0]

    def _expiry_by_publication(self, record: Record, published: Published) -> Violation | None:
        key = record.key
        known = published.keys.get(key)
        if not self._in_life(record, known, published):
            return self._unjudged()  # it may have ended an earlier life of the key
        # Accepted, it would have removed the key: a life that started before it goes on.
        detail = f"expiry of {key}: not accepted by the owner of partition {record.partition}"
        if known is not None and known.accepted and known.accepted[-1][0] < record.offset:
            detail = f"expiry of {key}: it was {known.event.state.value}, not settled"
        return Violation(record.position, key, NotSettled.reason, detail)

    def _by_publication(self, record: Record, event: EffectEvent,
                        published: Published) -> Violation | None:
        key = event.idempotency_key
        known = published.keys.get(key)
        accepted = () if known is None else known.accepted
        if not self._in_life(record, known, published) and (
                known is None or (record.offset, event.event_id) not in accepted):
            return self._unjudged()  # an earlier life of the key, ended by an expiry
        if (record.offset, event.event_id) in accepted or (
                known is not None and not accepted and known.event.event_id == event.event_id):
            self._seen.setdefault(key, set()).add(record.offset)
            self._current[key] = replace(event, payload=None) if event.payload else event
            self._current_at[key] = record.offset
            self._first_hash.setdefault(key, event.payload_hash)
            return None
        if known is not None and known.truncated and record.offset < accepted[0][0]:
            return self._unjudged()  # older than every position its owner kept
        reason, detail = NOT_ACCEPTED, (
            f"not accepted by the owner of partition {record.partition} (published up to "
            f"offset {published.applied}); the state it was judged against was compacted away")
        before = [offset for offset, _ in accepted if offset < record.offset]
        prior: EffectEvent | None
        if known is not None and before and before[-1] == accepted[-1][0]:
            prior, judgeable = known.event, True  # after the key's last accepted event
        elif not before:
            prior, judgeable = None, not (known is not None and known.truncated)
        else:
            prior = self._current.get(key)
            judgeable = self._current_at.get(key) == before[-1]
        if judgeable:
            try:
                check(prior, event)
            except (Conflict, InvalidInput) as exc:
                reason, detail = rule_broken(exc), str(exc)
        return Violation(record.position, key, reason, detail)

    def _rebase(self, key: str, published: Published) -> None:
        """From the publication on, ``key`` folds from its published state."""
        self._rebased.add(key)
        known = published.keys.get(key)
        self._current_at.pop(key, None)
        if known is None:
            self._current.pop(key, None)
            self._first_hash.pop(key, None)
            return
        self._current[key] = known.event
        self._first_hash[key] = known.event.payload_hash
