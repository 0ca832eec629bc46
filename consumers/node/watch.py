"""A running node stops serving when its log is replaced under it: on Kafka, the events topic
deleted (and perhaps created again, with another topic ID); on SQLite, the file swapped.

Serving on would re-read the new log from the stored offsets of the old one, silently wrong;
instead the node reports :class:`~effectlog.errors.WrongLog` (``serve`` exits 4 with one line)
and sets the ``effectlog_log_replaced`` gauge. ``effectlog rebuild`` adopts the new log.
"""

from __future__ import annotations

import logging
import threading

from effectlog.errors import BackendUnavailable, LogMissing, WrongLog
from effectlog.log import open_log

logger = logging.getLogger(__name__)


def watch_log(log_url: str, bound: str | None, stop: threading.Event,
              every_s: float) -> WrongLog | None:
    """Check the log's identity every ``every_s`` until ``stop``; the error once it changed."""
    if bound is None:  # the backend cannot tell (memory)
        return None
    while not stop.wait(every_s):
        try:
            with open_log(log_url, create=False) as log:
                now = log.identity()
        except LogMissing:
            now = None
        except BackendUnavailable as exc:  # unreachable is not replaced: check again later
            logger.debug("log identity check failed: %s", exc)
            continue
        if now != bound:
            what = "is gone" if now is None else f"was replaced (identity {bound} -> {now})"
            return WrongLog(f"the log {log_url} {what}: stopped serving; restore it, or run "
                            "`effectlog rebuild` to adopt the new one")
    return None
