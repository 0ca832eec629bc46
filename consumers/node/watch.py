"""A running node stops serving when its log is replaced under it, or stops keeping what
serving rests on.

Replaced: on Kafka, the events topic deleted (and perhaps created again, with another topic
ID); on SQLite, the file swapped. Serving on would re-read the new log from the stored offsets
of the old one, silently wrong; instead the node reports :class:`~effectlog.errors.WrongLog`
(``serve`` exits 4 with one line) and sets the ``effectlog_log_replaced`` gauge. ``effectlog
rebuild`` adopts the new log.

Premises: what ``serve`` checks before it starts (:meth:`EventLog.check_serving`: on Kafka,
records stamped with the brokers' clock, events never deleted by retention, a changelog that
never deletes) is checked again at every look, since a topic's config can be altered under a
running node; a broken one stops it as at the start (:class:`Conflict`, exit 3). The events
topic's ``min.compaction.lag.ms`` read at each look goes to ``on_lag``: the compaction guard
takes a lower one at once, so a lag below serve's floor set under a running node halts what
it may have thinned rather than stopping every partition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from effectlog.errors import BackendUnavailable, Conflict, EffectlogError, LogMissing, WrongLog
from effectlog.log import open_log

logger = logging.getLogger(__name__)


def watch_log(log_url: str, bound: str | None, stop: threading.Event, every_s: float,
              on_lag: Callable[[int | None], None] | None = None) -> EffectlogError | None:
    """Look at the log every ``every_s`` until ``stop``; the error once it was replaced or
    broke a serving premise (None when stopped)."""
    if bound is None:  # the backend cannot tell (memory)
        return None
    while not stop.wait(every_s):
        try:
            with open_log(log_url, create=False) as log:
                now = log.identity()
                if now == bound:
                    log.check_serving(running=True)
                    if on_lag is not None:
                        on_lag(log.compaction_lag_ms())
        except LogMissing:
            now = None
        except BackendUnavailable as exc:  # unreachable is not replaced: look again later
            logger.debug("log check failed: %s", exc)
            continue
        except Conflict as exc:
            return Conflict(f"{exc}; stopped serving (the topic's config changed under it)")
        if now != bound:
            what = "is gone" if now is None else f"was replaced (identity {bound} -> {now})"
            return WrongLog(f"the log {log_url} {what}: stopped serving; restore it, or run "
                            "`effectlog rebuild` to adopt the new one")
    return None
