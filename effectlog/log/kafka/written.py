"""The offsets this process's own producer was given, and the key of the record at each.

A delivery report names the exact offset of a record, and no other record can sit at that
offset. So when every offset of a range ``[start, end)`` of a partition holds a record this
process wrote, this ledger alone proves which keys the range holds, with no read and no wait:
that is the common case of one worker process (many threads) writing a topic. A range with any
offset this process did not write (another writer's record, a transaction marker) cannot be
told here, and the caller falls back to :class:`~effectlog.log.kafka.tail.KeyTail`.

Delivery reports of one partition arrive in offset order, so each partition's ledger is one
ascending run; a report at or below the last one (the topic was replaced, or two producers
overlapped) makes the ledger forget that partition rather than guess.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection

KEEP = 10_000  # records remembered per partition (offset and key)


class WrittenKeys:
    """Per topic partition, the offsets and keys of this process's latest delivered records."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._lock = threading.Lock()  # reports come from the poll thread, asks from any
        self._recent: dict[tuple[str, int], deque[tuple[int, bytes]]] = {}

    def note(self, topic: str, partition: int, offset: int, key: bytes) -> None:
        """Record that this process's record of ``key`` sits at ``offset`` of a partition."""
        with self._lock:
            recent = self._recent.get((topic, partition))
            if recent is None:
                recent = self._recent[topic, partition] = deque(maxlen=self.keep)
            elif recent and recent[-1][0] >= offset:
                recent.clear()
            recent.append((offset, key))

    def untouched(self, topic: str, partition: int, key: bytes, start: int, end: int,
                  own: Collection[int]) -> bool:
        """True when every offset in ``[start, end)`` holds a record this process wrote and
        none of them is of ``key`` except those at offsets ``own``; False when one is of
        ``key`` or the ledger cannot tell."""
        if start >= end:
            return True
        with self._lock:
            recent = self._recent.get((topic, partition))
            if not recent or recent[0][0] > start or recent[-1][0] < end - 1:
                return False
            expected = end - 1
            for offset, written in reversed(recent):
                if offset > expected:
                    continue
                if offset < expected:
                    return False  # an offset this process did not write
                if written == key and offset not in own:
                    return False
                if offset == start:
                    return True
                expected -= 1
        return False
