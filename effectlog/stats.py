"""The figures ``effectlog stats`` shows, from projection counts and offsets.

One pure function, so the CLI (reading a local projection) and the query API (merging
the partitions of a cluster) print the same JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

STATES = ("CREATED", "RESERVED", "DISPATCHED", "UNKNOWN", "AWAITING_APPROVAL", "SUCCEEDED",
          "FAILED", "ABANDONED")
#: The counter of settled effects an expiry removed (see ``effectlog expire``).
EXPIRED = "metric:expired"


def effect_metrics(counts: Mapping[str, int]) -> dict[str, int]:
    """Attempts, confirmed effects, reconciliations, unresolved UNKNOWN and rejected events,
    kept apart (the projector counts them from accepted events)."""
    return {
        "attempts (dispatches)": counts.get("metric:attempts", 0),
        "confirmed provider effects": counts.get("metric:confirmed_effects", 0),
        "failed outcomes": counts.get("metric:recorded:failed", 0),
        "reconciled by lookup": counts.get("metric:reconciled", 0),
        "approved retries": counts.get("metric:decisions:retry", 0),
        "abandoned": counts.get("metric:decisions:abandon", 0),
        "unresolved UNKNOWN": counts.get("state:UNKNOWN", 0)
        + counts.get("state:AWAITING_APPROVAL", 0),
        "rejected events": sum(n for label, n in counts.items() if label.startswith("rejected:")),
    }


def stats_figures(counts: Mapping[str, int], next_offsets: Mapping[int, int],
                  end_offsets: Mapping[int, int], projection: str, log: str) -> dict[str, Any]:
    """States, metrics, rejections by reason and lag per partition, as ``stats --json``."""
    states = {name: counts.get(f"state:{name}", 0) for name in STATES}
    rejected = {label.split(":", 1)[1]: n for label, n in counts.items()
                if label.startswith("rejected:")}
    return {
        "states": states,
        # keys the projection holds, and settled ones expiries removed (bounded state)
        "held": sum(states.values()),
        "expired": counts.get(EXPIRED, 0),
        "metrics": effect_metrics(counts),
        "rejected": rejected,
        "rejected_total": sum(rejected.values()),
        # records written by earlier versions with the fingerprint byte-reversed (still read)
        "legacy_records": counts.get("legacy:fingerprint_order", 0),
        "end_offsets": {str(p): n for p, n in sorted(end_offsets.items())},
        "next_offsets": {str(p): n for p, n in sorted(next_offsets.items())},
        "lag": {str(p): max(0, n - next_offsets.get(p, 0)) for p, n in sorted(end_offsets.items())},
        "projection": projection,
        "log": log,
    }
