"""Reads as they stand, coalesced: threads asking at once share one request.

A worker's first read of a key asks for its snapshot as it stands. With many threads, each
such read was a request of its own, and its fixed cost (a round trip, the HTTP work on both
sides, a thread switch per answer) was paid once per key. :class:`LookupBatcher` makes it
once per batch, the way group commit shares a disk flush: a thread that asks while no
request is in flight sends its key at once (alone: exactly the single read); threads asking
while one is in flight queue up, and when it returns, the first of them sends every queued
key in one request, while the rest wait for their answer. Nobody waits for a timer, so one
thread alone is as fast as without the batcher.

Each worker has a client of its own, so the queue is shared by every client of the same
servers in the process (:meth:`LookupBatcher.shared`); the thread that sends a batch sends it
with its own client (its connection, its timeouts).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar
from urllib.parse import quote

T = TypeVar("T")

#: Keys in one batch, and the URL-encoded size of their ``key=`` parameters.
MAX_KEYS = 64
MAX_QUERY_CHARS = 6000

#: Answers for the keys of a batch by key (a key left out is asked alone), or None when the
#: server cannot answer batches (every key is then asked alone).
Many = Callable[[Sequence[str]], Mapping[str, T] | None]


class _Ask(Generic[T]):
    """One thread's key, and where its answer (or its turn to send) is handed over."""

    __slots__ = ("alone", "answer", "error", "key", "lead", "ready", "size")

    def __init__(self, key: str) -> None:
        self.key = key
        self.size = len(quote(key, safe="")) + 5  # "&key="
        self.ready = threading.Lock()
        self.ready.acquire()  # released once: an answer, an error, or the turn to send
        self.lead = False
        self.alone = False
        self.answer: T | None = None
        self.error: Exception | None = None


class LookupBatcher(Generic[T]):
    """``get(key, one, many)`` through ``one`` (a single read) or ``many`` (a batch),
    whichever the moment allows; errors of a batch's request reach every thread of that
    batch."""

    _shared: weakref.WeakValueDictionary[tuple[str, ...], LookupBatcher[object]] = (
        weakref.WeakValueDictionary())
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, servers: Sequence[str]) -> LookupBatcher[T]:
        """The process's batcher for ``servers`` (kept while a client holds it)."""
        with cls._shared_lock:
            batcher = cls._shared.get(tuple(servers))
            if batcher is None:
                batcher = cls._shared[tuple(servers)] = LookupBatcher()
            return batcher  # type: ignore[return-value]

    def __init__(self, *, max_keys: int = MAX_KEYS,
                 max_query_chars: int = MAX_QUERY_CHARS) -> None:
        self.max_keys = max_keys
        self.max_query_chars = max_query_chars
        self._lock = threading.Lock()
        self._pending: deque[_Ask[T]] = deque()
        self._sending = False  # a request is in flight, or a queued thread was told to send
        self.batches = 0  # requests carrying more than one key (for tests and benches)
        self.batched = 0  # keys those requests carried

    def get(self, key: str, one: Callable[[str], T], many: Many[T]) -> T:
        ask: _Ask[T] = _Ask(key)
        with self._lock:
            self._pending.append(ask)
            ask.lead = not self._sending
            self._sending = True
        if not ask.lead:
            ask.ready.acquire()
        if ask.lead:
            self._send(ask, one, many)
        if ask.error is not None:
            raise ask.error
        if ask.alone:
            return one(key)
        assert ask.answer is not None
        return ask.answer

    def _send(self, me: _Ask[T], one: Callable[[str], T], many: Many[T]) -> None:
        """Send what is queued (``me`` first), hand the answers over, and pass the turn to
        the first thread queued meanwhile."""
        batch = self._take()
        try:
            if len(batch) == 1:
                try:
                    me.answer = one(me.key)
                except Exception as exc:
                    me.error = exc
            else:
                self._answer(batch, many)
        finally:
            with self._lock:
                successor = self._pending[0] if self._pending else None
                if successor is None:
                    self._sending = False
                else:
                    successor.lead = True
            for ask in batch:
                if ask is not me:
                    if ask.answer is None and ask.error is None:
                        ask.alone = True  # not answered (or the sender was interrupted)
                    ask.ready.release()
            if successor is not None:
                successor.ready.release()

    def _take(self) -> list[_Ask[T]]:
        with self._lock:
            batch = [self._pending.popleft()]
            size = batch[0].size
            while (self._pending and len(batch) < self.max_keys
                   and size + self._pending[0].size <= self.max_query_chars):
                size += self._pending[0].size
                batch.append(self._pending.popleft())
            return batch

    def _answer(self, batch: list[_Ask[T]], many: Many[T]) -> None:
        self.batches += 1
        self.batched += len(batch)
        try:
            answers = many([ask.key for ask in batch])
        except Exception as exc:
            for ask in batch:
                ask.error = exc
            return
        for ask in batch:
            found = None if answers is None else answers.get(ask.key)
            if found is None:
                ask.alone = True
            else:
                ask.answer = found
