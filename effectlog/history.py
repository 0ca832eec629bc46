"""One key's history as read from the log: every record, with the verdict the projector gives.

``effectlog history`` prints these rows and the web console shows them as a key's
timeline; both judge the records here, with the state machine's own check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from effectlog.log.base import Record


def judge_records(records: Sequence[Record], compacted: bool) -> list[dict[str, Any]]:
    """One row per record of a key, in log order: ``partition``, ``offset``, ``verdict``
    (``accepted``, ``accepted (baseline)``, ``rejected (<reason>): ...`` or
    ``undecodable: ...``) and the decoded ``event`` (``EffectEvent.to_json()``, payload
    bytes that are not JSON as ``payload_b64``).

    On a ``compacted`` log the oldest surviving record may be any transition: it is the
    baseline (flagged ``compacted_before``), since each event carries the full snapshot.
    """
    from effectlog.audit import event_json
    from effectlog.codec import event_codec
    from effectlog.errors import CodecError, Conflict
    from effectlog.machine import check
    from effectlog.model import EffectEvent, Transition

    rows: list[dict[str, Any]] = []
    current: EffectEvent | None = None
    codec = event_codec()
    for record in records:
        row: dict[str, Any] = {"partition": record.partition, "offset": record.offset}
        try:
            event = EffectEvent.from_record(codec.decode(record.value))
        except (CodecError, KeyError, ValueError, TypeError) as exc:
            rows.append({**row, "verdict": f"undecodable: {exc}"})
            continue
        if current is None and compacted and event.transition is not Transition.CREATE:
            rows.append({**row, "verdict": "accepted (baseline)", "compacted_before": True,
                         "event": event_json(event)})
            current = event
            continue
        try:
            check(current, event)
            verdict = "accepted"
            current = event
        except Conflict as exc:
            verdict = f"rejected ({exc.reason}): {exc}"
        rows.append({**row, "verdict": verdict, "event": event_json(event)})
    return rows
