"""In-process event log for unit tests: ``memory://``. One partition per topic."""

from __future__ import annotations

import threading
import time

from effectlog.log.base import TOPICS, EventLog, Position, Record


class MemoryLog(EventLog):
    """A list per topic guarded by a condition variable; nothing survives the process."""

    conditional = True

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._records: dict[str, list[Record]] = {topic: [] for topic in TOPICS}
        self._changed = threading.Condition()

    def partitions(self, topic: str) -> int:
        return 1

    def partition_for(self, topic: str, key: str) -> int:
        return 0

    def append(self, topic: str, key: str, value: bytes) -> Position:
        with self._changed:
            records = self._records.setdefault(topic, [])
            record = Record(topic, 0, len(records), key, bytes(value), int(time.time() * 1000))
            records.append(record)
            self._changed.notify_all()
            return record.position

    def append_after(self, topic: str, key: str, value: bytes,
                     last_offset: int | None) -> Position | None:
        with self._changed:
            mine = [r.offset for r in self._records.setdefault(topic, []) if r.key == key]
            if (mine[-1] if mine else None) != last_offset:
                return None
            return self.append(topic, key, value)

    def read(self, topic: str, partition: int, offset: int, limit: int = 1000,
             timeout: float = 0.0) -> list[Record]:
        with self._changed:
            records = self._records.setdefault(topic, [])
            if offset >= len(records) and timeout > 0:
                self._changed.wait_for(lambda: offset < len(records), timeout)
            return records[offset:offset + limit]

    def end_offsets(self, topic: str) -> dict[int, int]:
        with self._changed:
            return {0: len(self._records.setdefault(topic, []))}

    def read_key(self, topic: str, key: str) -> list[Record]:
        with self._changed:
            return [r for r in self._records.setdefault(topic, []) if r.key == key]
