"""Durations as people type them: ``250ms``, ``90s``, ``15m``, ``2h``, ``1d``, ``1w``, ``1h30m``."""

from __future__ import annotations

import re

from effectlog.errors import InvalidInput

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
             "w": 7 * 86_400_000}
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w)")


def parse_duration_ms(text: str) -> int:
    """Milliseconds of a duration; :class:`InvalidInput` for anything else."""
    spec = text.strip().lower()
    parts = DURATION.findall(spec)
    if not spec or "".join(n + u for n, u in parts) != spec:
        raise InvalidInput(f"invalid duration {text!r}: use e.g. 90s, 15m, 2h, 1d, 1h30m")
    return sum(int(n) * _UNITS_MS[u] for n, u in parts)
