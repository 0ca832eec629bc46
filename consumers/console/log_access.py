"""The console's own handle on the event log: key histories and decisions.

A timeline is every record of the key as the log holds it (judged by
:func:`effectlog.history.judge_records`, as ``effectlog history`` does), not the
projection's snapshot. A refreshing page must not rescan a Kafka partition every few
seconds, so a key's records are kept with the partition end they were read up to and only
the records appended since are read again. Decisions go through
:func:`consumers.approvals.approve`, exactly as ``effectlog approve`` records them, judged by
the node's own judge on a log without compare-and-append.
Every call blocks (run it off the event loop); one at a time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from consumers.approvals import approve
from effectlog.history import judge_records
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog, Record
from effectlog.model import EffectEvent

#: Keys whose records are kept between refreshes.
CACHED_KEYS = 64
#: Beyond this many new records in the partition, read the key's records afresh instead.
INCREMENTAL_MAX = 5000


class ConsoleLog:
    """Opens the log at ``log_url`` on first use; :meth:`close` when the server stops."""

    def __init__(self, log_url: str, judge_url: str) -> None:
        self.log_url = log_url
        self.judge_url = judge_url
        self._log: EventLog | None = None
        self._lock = threading.Lock()
        self._records: OrderedDict[str, tuple[list[Record], int]] = OrderedDict()

    def _opened(self) -> EventLog:
        if self._log is None:
            self._log = open_log(self.log_url)
        return self._log

    def history(self, key: str) -> list[dict[str, Any]]:
        """The key's records in log order with their verdicts (empty: no record)."""
        with self._lock:
            log = self._opened()
            partition = log.partition_for(EVENTS, key)
            end = log.end_offsets(EVENTS).get(partition, 0)
            records, seen = self._records.pop(key, ([], -1))
            if seen < 0 or end < seen or end - seen > INCREMENTAL_MAX:
                records = [r for r in log.read_key(EVENTS, key) if r.offset < end]
            elif end > seen:
                records = records + [r for r in log.scan(EVENTS, partition, seen, end)
                                     if r.key == key]
            self._records[key] = (records, end)
            while len(self._records) > CACHED_KEYS:
                self._records.popitem(last=False)
            published = None
            if log.compacted and records:
                from projections.published import read_published

                published = read_published(log, [partition], key)
            return judge_records(records, log.compacted, published)

    def decide(self, key: str, decision: str, by: str, reason: str,
               seen_epoch: int | None = None) -> EffectEvent:
        """Append the decision on the state at ``seen_epoch`` (see
        :func:`consumers.approvals.approve` for its errors)."""
        with self._lock:
            log = self._opened()
            if log.conditional:
                return approve(log, key, decision, by, reason, seen_epoch=seen_epoch)
            from effectlog.judge.client import ClusterJudge

            judge = ClusterJudge(self.judge_url)  # this node's judge, which forwards
            try:
                return approve(log, key, decision, by, reason, judge=judge,
                               seen_epoch=seen_epoch)
            finally:
                judge.close()

    def close(self) -> None:
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
