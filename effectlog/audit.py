"""Audit replay: stream the events topic in log order and verify every key's history.

:class:`Replay` reads any :class:`~effectlog.log.base.EventLog` (every partition up to the
end offsets taken at the start, or one key), decodes each record and runs it through
:class:`HistoryVerifier`, which judges it with the state machine's own rules
(:func:`effectlog.machine.check`) against the running fold of its key. Writers turn the
stream into JSON lines or an Avro Object Container File that any Avro tool can read.
"""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import IO, Any

import fastavro

from effectlog.codec import EVENT_SCHEMA, event_codec, load_schema_text
from effectlog.durations import DURATION, parse_duration_ms
from effectlog.errors import CodecError, InvalidInput
from effectlog.keys import validate_key
from effectlog.log.base import EVENTS, EventLog, Position, Record
from effectlog.model import EffectEvent, now_ms
from effectlog.text import json_printable, shorten
from effectlog.verifier import HistoryVerifier, Published, Violation

__all__ = ["HistoryVerifier", "Published", "Replay", "ReplayFilter", "ReplayItem",
           "ReplaySummary", "Violation", "parse_duration_ms", "parse_time", "write_avro",
           "write_jsonl"]

logger = logging.getLogger(__name__)

_PROGRESS_EVERY = 500
MAX_LISTED = 10_000
MAX_EPOCH_DIGITS = 16


def parse_time(text: str, now: int | None = None) -> int:
    """Epoch milliseconds of an ISO-8601 time (UTC unless it says otherwise), of epoch
    milliseconds given as digits, or of a duration before ``now`` (``2h`` = two hours ago)."""
    spec = text.strip()
    if spec.isascii() and spec.isdigit():
        if len(spec) > MAX_EPOCH_DIGITS:
            raise InvalidInput(f"invalid time {shorten(text)}: epoch milliseconds have at most "
                               f"{MAX_EPOCH_DIGITS} digits")
        return int(spec)
    if DURATION.match(spec.lower()):
        return (now_ms() if now is None else now) - parse_duration_ms(spec)
    try:
        moment = datetime.fromisoformat(spec)
    except ValueError:
        raise InvalidInput(f"invalid time {shorten(text)}: use ISO-8601 (2024-05-01T12:00:00Z), "
                           "epoch milliseconds or a relative duration (2h, 1d)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which records to stream: one key (its whole history), or several (``keys``: an
    archive of expiring effects), and/or a time window ``[since_ms, until_ms)`` on the log
    timestamp of each record."""

    key: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    keys: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.key is not None:
            validate_key(self.key)
        if self.key is not None and self.keys is not None:
            raise InvalidInput("one key or several, not both")
        if self.since_ms is not None and self.until_ms is not None and self.until_ms <= self.since_ms:
            raise InvalidInput("--until must be later than --since")

    def admits(self, record: Record) -> bool:
        if self.since_ms is not None and record.timestamp_ms < self.since_ms:
            return False
        return self.until_ms is None or record.timestamp_ms < self.until_ms


@dataclass(frozen=True, slots=True)
class ReplayItem:
    """One streamed record: its decoded event, or why it could not be decoded."""

    record: Record
    event: EffectEvent | None
    undecodable: str | None = None
    violation: Violation | None = None
    #: a tombstone: the key's expiry (no event, no bytes)
    expiry: bool = False
    #: False when its verdict cannot be told (see :attr:`HistoryVerifier.judged`)
    judged: bool = True


@dataclass
class ReplaySummary:
    """Counts of one replay; ``violations`` lists at most ``MAX_LISTED`` of them."""

    records: int = 0
    events: int = 0
    undecodable: int = 0
    keys: int = 0
    partial_keys: int = 0
    #: accepted events (of the keys read) whose records compaction removed
    compacted_accepted: int = 0
    #: expiries read (tombstones)
    expiries: int = 0
    #: records whose verdict cannot be told (older than what a publication kept of their
    #: key, or than one of its expiries)
    unjudged: int = 0
    violation_count: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)
    scope: dict[str, Any] = field(default_factory=dict)

    def add(self, violation: Violation) -> None:
        self.violation_count += 1
        self.by_reason[violation.reason] += 1
        if len(self.violations) < MAX_LISTED:
            self.violations.append(violation)

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "events": self.events,
                "undecodable": self.undecodable, "keys": self.keys,
                "partial_keys": self.partial_keys,
                "compacted_accepted": self.compacted_accepted, "expiries": self.expiries,
                "unjudged": self.unjudged,
                "violations": self.violation_count,
                "violations_by_reason": dict(sorted(self.by_reason.items())),
                "violation_list": [v.to_json() for v in self.violations],
                "violations_listed": len(self.violations), "scope": self.scope}


class Replay:
    """One pass over the events topic: iterate it for :class:`ReplayItem` s; the
    :attr:`summary` is complete once the iteration ends.

    ``progress`` is called with the number of offsets advanced (compaction gaps included),
    so its sum reaches :meth:`total`. ``published`` (partition -> what its owner last
    published, on a compacted log) makes the verdicts below each publication the owner's:
    see :mod:`effectlog.verifier`. A time window (``since_ms``) ignores it: the fold from a
    publication needs every record after it.
    """

    def __init__(self, log: EventLog, selection: ReplayFilter | None = None, *,
                 progress: Callable[[int], None] | None = None,
                 published: Mapping[int, Published] | None = None) -> None:
        self.log = log
        self.selection = selection or ReplayFilter()
        self.progress = progress
        windowed = self.selection.since_ms is not None
        published = None if windowed else published
        self.verifier = HistoryVerifier(trust_first=windowed, published=published)
        self.summary = ReplaySummary(scope={
            "key": self.selection.key, "since_ms": self.selection.since_ms,
            "until_ms": self.selection.until_ms,
            "history": "window" if windowed else "full",
            "published": {str(p): pub.applied for p, pub in sorted((published or {}).items())}})
        self._key_records: list[Record] | None = None
        self._ends: dict[int, int] | None = None

    def total(self) -> int:
        """Offsets to scan (all partitions up to their end now), or the key's record count."""
        if self.selection.key is not None or self.selection.keys is not None:
            if self._key_records is None:
                self._key_records = self._read_keys()
            return len(self._key_records)
        if self._ends is None:
            self._ends = self.log.end_offsets(EVENTS)
        return sum(self._ends.values())

    def __iter__(self) -> Iterator[ReplayItem]:
        self.total()
        keys: set[str] = set()
        pending = 0
        for record, advanced in self._records():
            pending += advanced
            if self.progress is not None and pending >= _PROGRESS_EVERY:
                self.progress(pending)
                pending = 0
            if not self.selection.admits(record):
                continue
            keys.add(record.key)
            item = self._judge(record)
            self.summary.records += 1
            if item.violation is not None:
                self.summary.add(item.violation)
            yield item
        if self.progress is not None and pending:
            self.progress(pending)
        self.summary.keys = len(keys)
        self.summary.partial_keys = len(self.verifier.partial_keys)
        self.summary.compacted_accepted = self.verifier.removed_count()
        self.summary.unjudged = self.verifier.unjudged
        logger.debug("replay done: %s", {k: v for k, v in self.summary.to_json().items()
                                         if k != "violation_list"})

    def _read_keys(self) -> list[Record]:
        """The records of the selected key(s), in log order per partition: an index lookup
        per key where the log has one, else one scan of each partition holding them."""
        if self.selection.key is not None:
            return self.log.read_key(EVENTS, self.selection.key)
        keys = self.selection.keys or frozenset()
        if self.log.indexed_keys:
            found = [r for key in sorted(keys) for r in self.log.read_key(EVENTS, key)]
        else:
            partitions = sorted({self.log.partition_for(EVENTS, key) for key in keys})
            found = [r for p in partitions for r in self.log.scan(EVENTS, p) if r.key in keys]
        return sorted(found, key=lambda r: (r.partition, r.offset))

    def _records(self) -> Iterator[tuple[Record, int]]:
        if self._key_records is not None:
            for record in self._key_records:
                yield record, 1
            return
        assert self._ends is not None
        for partition in sorted(self._ends):
            end, last = self._ends[partition], 0
            for record in self.log.scan(EVENTS, partition, 0, end):
                yield record, record.offset + 1 - last
                last = record.offset + 1
            if end > last and self.progress is not None:
                self.progress(end - last)

    def _judge(self, record: Record) -> ReplayItem:
        if not record.value:
            self.summary.expiries += 1
            violation = self.verifier.observe_expiry(record)
            return ReplayItem(record, None, None, violation, expiry=True,
                              judged=self.verifier.judged)
        try:
            event = EffectEvent.from_record(event_codec().decode(record.value))
        except (CodecError, KeyError, ValueError, TypeError) as exc:
            reason = str(exc) if isinstance(exc, CodecError) else f"invalid event record: {exc!r}"
            self.summary.undecodable += 1
            self.verifier.undecodable(record)
            return ReplayItem(record, None, reason,
                              Violation(record.position, record.key, "undecodable", reason))
        self.summary.events += 1
        violation = self.verifier.observe(record, event)
        return ReplayItem(record, event, None, violation, judged=self.verifier.judged)


# -- output --------------------------------------------------------------------------------

def _position_json(position: Position) -> dict[str, int]:
    return {"partition": position.partition, "offset": position.offset}


def event_json(event: EffectEvent) -> dict[str, Any]:
    """:meth:`EffectEvent.to_json`, with non-JSON payload bytes shown as ``payload_b64``."""
    try:
        return event.to_json()
    except (ValueError, UnicodeDecodeError):
        out = replace(event, payload=None).to_json()
        out["payload_b64"] = base64.b64encode(event.payload or b"").decode("ascii")
        return out


def item_json(item: ReplayItem) -> dict[str, Any]:
    """The JSON-lines object of one streamed record."""
    record = item.record
    out: dict[str, Any] = {"position": _position_json(record.position),
                           "timestamp": record.timestamp_ms, "key": record.key}
    if item.event is not None:
        out["event"] = event_json(item.event)
    elif item.expiry:
        out["expiry"] = True
    else:
        out["undecodable"] = item.undecodable
        out["raw_b64"] = base64.b64encode(record.value).decode("ascii")
    if item.violation is not None:
        out["violation"] = {"reason": item.violation.reason, "detail": item.violation.detail}
    if not item.judged:
        out["judged"] = False
    return out


def write_jsonl(items: Iterator[ReplayItem], out: IO[str]) -> int:
    """Write one JSON object per record; returns how many were written."""
    count = 0
    for item in items:
        out.write(json_printable(json.dumps(item_json(item), sort_keys=True,
                                            separators=(",", ":"), ensure_ascii=False,
                                            default=str)))
        out.write("\n")
        count += 1
    out.flush()
    return count


def audit_schema() -> dict[str, Any]:
    """The Avro schema of an archive: position fields around the current event schema."""
    return {
        "type": "record", "name": "ReplayedRecord", "namespace": "io.effectlog.audit",
        "doc": "One record of the effectlog events topic, as replayed for an audit.",
        "fields": [
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "timestamp", "type": {"type": "long", "logicalType": "timestamp-millis"},
             "doc": "Log timestamp of the record."},
            {"name": "key", "type": "string", "doc": "Log key (the idempotency key)."},
            {"name": "event", "type": ["null", load_schema_text(EVENT_SCHEMA)], "default": None},
            {"name": "undecodable", "type": ["null", "string"], "default": None,
             "doc": "Why the record could not be decoded; the bytes are in raw."},
            {"name": "raw", "type": ["null", "bytes"], "default": None},
            {"name": "expiry", "type": "boolean", "default": False,
             "doc": "A tombstone: the key's expiry (no event)."},
            {"name": "judged", "type": "boolean", "default": True,
             "doc": "False when the record's verdict cannot be told (see effectlog replay)."},
            {"name": "violation", "default": None, "type": ["null", {
                "type": "record", "name": "Violation",
                "fields": [{"name": "reason", "type": "string"},
                           {"name": "detail", "type": "string"}]}]},
        ],
    }


def item_avro(item: ReplayItem) -> dict[str, Any]:
    """The Avro record of one streamed record (see :func:`audit_schema`)."""
    record = item.record
    return {
        "partition": record.partition, "offset": record.offset,
        "timestamp": record.timestamp_ms, "key": record.key,
        "event": item.event.to_record() if item.event is not None else None,
        "undecodable": item.undecodable,
        "raw": record.value if item.event is None and not item.expiry else None,
        "expiry": item.expiry, "judged": item.judged,
        "violation": {"reason": item.violation.reason, "detail": item.violation.detail}
        if item.violation is not None else None,
    }


def write_avro(items: Iterator[ReplayItem], out: IO[bytes],
               metadata: dict[str, str] | None = None) -> int:
    """Write an Avro Object Container File (deflate blocks); returns the record count."""
    count = 0

    def records() -> Iterator[dict[str, Any]]:
        nonlocal count
        for item in items:
            count += 1
            yield item_avro(item)

    schema = fastavro.parse_schema(audit_schema())
    fastavro.writer(out, schema, records(), codec="deflate", metadata=metadata or {})
    out.flush()
    return count
