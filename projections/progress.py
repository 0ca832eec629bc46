"""Progress of a long read, logged every few seconds (restores that take minutes say so)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

#: How often a long read logs its progress (INFO).
EVERY_S = 5.0


def logged(items: Iterable[T], what: str, logger: logging.Logger,
           every_s: float = EVERY_S) -> Iterator[T]:
    """``items`` as they come; every ``every_s`` seconds an INFO line ``{what}: N records read
    so far (R/s)``."""
    started = reported = time.monotonic()
    for count, item in enumerate(items, 1):
        yield item
        now = time.monotonic()
        if now - reported >= every_s:
            reported = now
            logger.info("%s: %d records read so far (%.0f/s)", what, count,
                        count / (now - started), extra={"records": count})
