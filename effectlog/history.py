"""One key's history as read from the log: every record, with the verdict the projector gave.

``effectlog history`` prints these rows and the web console shows them as a key's
timeline; both judge the records with :class:`~effectlog.verifier.HistoryVerifier`, the
verifier ``effectlog replay`` uses, so the three agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from effectlog.log.base import Record
from effectlog.verifier import Published

#: The verdict of an accepted event whose record compaction removed.
REMOVED = "accepted; its record was removed by compaction"
#: The verdict of an accepted tombstone.
EXPIRED = "accepted (expiry: the settled effect was removed; the key used again is a new effect)"
#: The verdict of a record whose verdict cannot be told (see HistoryVerifier.judged).
UNJUDGED = "not judged: older than an expiry of the key or than what its owner kept"


def judge_records(records: Sequence[Record], compacted: bool,
                  published: Mapping[int, Published] | None = None) -> list[dict[str, Any]]:
    """One row per record of a key, in log order: ``partition``, ``offset``, ``verdict``
    (``accepted``, ``accepted (baseline)``, ``rejected (<reason>): ...``, ``undecodable: ...``
    or :data:`REMOVED`) and the decoded ``event`` (``EffectEvent.to_json()``, payload bytes
    that are not JSON as ``payload_b64``).

    With ``published`` (what the key's partition owner last published, on a compacted log)
    the verdicts are the owner's (see :mod:`effectlog.verifier`), and the accepted events
    whose records compaction removed appear as rows of their own (``removed``, with the
    ``event_id``). Without it, on a ``compacted`` log the oldest surviving record is taken as
    the baseline (flagged ``compacted_before``): each event carries the full snapshot, but
    whether the projector accepted that record is not known.
    """
    from effectlog.audit import event_json
    from effectlog.codec import event_codec
    from effectlog.errors import CodecError
    from effectlog.model import EffectEvent
    from effectlog.verifier import HistoryVerifier

    verifier = HistoryVerifier(trust_first=compacted and not published, published=published,
                               named_invariants=False)
    rows: list[dict[str, Any]] = []
    codec = event_codec()
    for record in records:
        row: dict[str, Any] = {"partition": record.partition, "offset": record.offset}
        if not record.value:
            violation = verifier.observe_expiry(record)
            verdict = (UNJUDGED if not verifier.judged else EXPIRED if violation is None
                       else f"rejected ({violation.reason}): {violation.detail}")
            rows.append({**row, "verdict": verdict, "expiry": True})
            continue
        try:
            event = EffectEvent.from_record(codec.decode(record.value))
        except (CodecError, KeyError, ValueError, TypeError) as exc:
            rows.append({**row, "verdict": f"undecodable: {exc}"})
            continue
        was_partial = event.idempotency_key in verifier.partial_keys
        violation = verifier.observe(record, event)
        if not verifier.judged:
            verdict = UNJUDGED
        elif violation is not None:
            verdict = f"rejected ({violation.reason}): {violation.detail}"
        elif not was_partial and event.idempotency_key in verifier.partial_keys:
            verdict = "accepted (baseline)"
            row["compacted_before"] = True
        else:
            verdict = "accepted"
        rows.append({**row, "verdict": verdict, "event": event_json(event)})
    if records and published:
        key, partition = records[0].key, records[0].partition
        for offset, event_id in verifier.removed(key, partition):
            rows.append({"partition": partition, "offset": offset, "verdict": REMOVED,
                         "removed": True, "event_id": event_id})
        rows.sort(key=lambda r: (r["partition"], r["offset"]))
    return rows
