"""In-process event log for unit tests: ``memory://``. One partition per topic."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence

from effectlog.log.base import TOPICS, EventLog, Position, Record


class MemoryLog(EventLog):
    """A list per topic guarded by a condition variable; nothing survives the process."""

    conditional = True
    concurrent_appends = 1

    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._records: dict[str, list[Record]] = {topic: [] for topic in TOPICS}
        self._changed = threading.Condition()
        self._last: dict[tuple[str, str], int] = {}  # (topic, key) -> offset of its latest
        self._id = uuid.uuid4().hex

    def identity(self) -> str:
        return self._id

    def partitions(self, topic: str) -> int:
        return 1

    def partition_for(self, topic: str, key: str) -> int:
        return 0

    def append(self, topic: str, key: str, value: bytes) -> Position:
        with self._changed:
            records = self._records.setdefault(topic, [])
            record = Record(topic, 0, len(records), key, bytes(value), int(time.time() * 1000))
            records.append(record)
            self._last[(topic, key)] = record.offset
            self._changed.notify_all()
            return record.position

    def append_after(self, topic: str, key: str, values: Sequence[bytes],
                     last_offset: int | None) -> list[Position] | None:
        with self._changed:
            if self._last.get((topic, key)) != last_offset:
                return None
            return [self.append(topic, key, value) for value in values]

    def last_offset(self, topic: str, key: str) -> int | None:
        with self._changed:
            return self._last.get((topic, key))

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
