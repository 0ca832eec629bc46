"""Which keys were written lately: a key-only tail of the events topic, per process.

A worker judges its own append without asking the query API when it can prove that no other
record of the key came in between the state it built on and its own records. Alone on a
partition its records land right where that state ends; on a busy topic other keys' records
land in between, and this tail tells them apart. It follows every partition from the moment
it is first asked (never from the beginning: it is no scan), keeps the offset and key of the
latest ``keep`` records of each, and answers "no record of K in [start, end) but mine" once it
has read up to ``end``.

It errs only towards "cannot tell": a range that starts before what it holds, that it has not
read within the wait, or that spans a gap in the offsets it read (a transaction marker, a
compacted or reset stretch) is answered False, and the caller asks the query API instead.
It reads uncommitted records too, so an aborted record of the key also answers False.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Collection

from confluent_kafka import Consumer, KafkaException, Message
from confluent_kafka import TopicPartition as TP

from effectlog.log.kafka.reader import reader_config
from effectlog.log.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

KEEP = 10_000  # records remembered per partition (offset and key: about 1 MB each)
POLL_S = 0.1


class KeyTail:
    """The keys of each partition's latest records of topic ``name``, read as they land.

    ``ends`` gives every partition's end offset now; the tail starts there. Thread-safe:
    one daemon thread reads, any thread asks.
    """

    def __init__(self, settings: KafkaSettings, name: str,
                 ends: Callable[[], dict[int, int]], keep: int = KEEP) -> None:
        self.name = name
        self.keep = keep
        begin = ends()
        self._lock = threading.Lock()
        # per partition, the askers waiting for it to be read up to an offset: each is woken
        # once that offset is read (not at every batch, as a shared condition would)
        self._waiting: dict[int, list[tuple[int, int, threading.Event]]] = {p: [] for p in begin}
        self._tickets = itertools.count()
        self._floor = dict(begin)  # the lowest offset whose key is known, per partition
        self._reached = dict(begin)  # the next offset to read, per partition
        self._recent: dict[int, deque[tuple[int, bytes | None]]] = {p: deque() for p in begin}
        self._consumer = Consumer({
            **reader_config(settings),
            "isolation.level": "read_uncommitted",  # every record that may be projected
            "enable.partition.eof": False,
            "auto.offset.reset": "latest",  # a reset shows as a gap, and a gap is forgotten
            "fetch.wait.max.ms": 100,
            "error_cb": lambda err: log.debug("kafka key tail error: %s", err.str()),
        })
        self._consumer.assign([TP(name, p, offset) for p, offset in begin.items()])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="effectlog-key-tail",
                                        daemon=True)
        self._thread.start()

    def untouched(self, partition: int, key: bytes, start: int, end: int,
                  own: Collection[int], wait: float) -> bool:
        """True when no record of ``key`` but those at offsets ``own`` sits in
        ``[start, end)`` of ``partition``; False when one does or the tail cannot tell
        within ``wait`` seconds."""
        waiting = self._waiting.get(partition)
        if waiting is None:
            return False
        with self._lock:
            if self._floor[partition] > start:
                return False
            if self._reached[partition] < end:
                reached = threading.Event()
                heapq.heappush(waiting, (end, next(self._tickets), reached))
                self._lock.release()
                try:
                    reached.wait(wait)
                finally:
                    self._lock.acquire()
                if self._reached[partition] < end:
                    return False
            if self._floor[partition] > start:  # forgotten while waiting
                return False
            for offset, written in reversed(self._recent[partition]):
                if offset < start:
                    break
                if offset < end and written == key and offset not in own:
                    return False
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._consumer.close()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:  # poll returns at the first record; consume would wait to fill its batch
                first = self._consumer.poll(POLL_S)
                batch = [] if first is None else [first, *self._consumer.consume(500, 0)]
            except KafkaException as exc:  # a closed or failed consumer: answer "cannot tell"
                log.debug("kafka key tail stopped: %s", exc)
                self._forget_all()
                return
            if batch:
                self._take(batch)

    def _take(self, batch: list[Message]) -> None:
        touched: set[int] = set()
        with self._lock:
            for msg in batch:
                partition, offset = msg.partition(), msg.offset()
                if msg.error() is not None or partition is None or offset is None:
                    continue
                recent = self._recent.get(partition)
                if recent is None:
                    continue
                if offset != self._reached[partition]:
                    recent.clear()  # a gap: nothing before it is known any more
                    self._floor[partition] = offset
                recent.append((offset, msg.key()))
                if len(recent) > self.keep:
                    self._floor[partition] = recent.popleft()[0] + 1
                self._reached[partition] = offset + 1
                touched.add(partition)
            for partition in touched:
                waiting, reached = self._waiting[partition], self._reached[partition]
                while waiting and waiting[0][0] <= reached:
                    heapq.heappop(waiting)[2].set()

    def _forget_all(self) -> None:
        with self._lock:
            for partition, recent in self._recent.items():
                recent.clear()
                self._floor[partition] = self._reached[partition] = 1 << 62
                for _, _, reached in self._waiting[partition]:
                    reached.set()
                self._waiting[partition].clear()
