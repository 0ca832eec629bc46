"""Durations as people type them: ``250ms``, ``90s``, ``15m``, ``2h``, ``1d``, ``1w``, ``1h30m``."""

from __future__ import annotations

import re

from effectlog.errors import InvalidInput

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
             "w": 7 * 86_400_000}
DURATION = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")


MAX_DIGITS = 15  # per number: far beyond any sensible duration, far below int() limits


def parse_duration_ms(text: str) -> int:
    """Milliseconds of a duration; :class:`InvalidInput` for anything else."""
    spec = text.strip().lower()
    parts = DURATION.findall(spec) if len(spec) <= 100 else []
    if not spec or "".join(n + u for n, u in parts) != spec \
            or any(len(n) > MAX_DIGITS for n, _ in parts):
        from effectlog.text import shorten

        raise InvalidInput(f"invalid duration {shorten(text)}: use e.g. 90s, 15m, 2h, 1d, 1h30m")
    return sum(int(n) * _UNITS_MS[u] for n, u in parts)
