"""Questions from many threads, sent together: group commit for judge requests.

Each question to the judge costs a round trip and the HTTP work on both sides. A thread that
asks while no request is in flight sends its question at once (alone: exactly the single
request); threads asking while one is in flight queue up, and when it returns, the first of
them sends every queued question in one request while the rest wait for their answer. Nobody
waits for a timer, so one thread alone is as fast as without batching. One request never
carries two questions about the same key (a second one waits for the next request), so
answers are told apart by key.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Generic, TypeVar

Q = TypeVar("Q")
A = TypeVar("A")

#: Questions in one request.
MAX_BATCH = 64


class _Ask(Generic[Q, A]):
    """One thread's question, and where its answer (or its turn to send) is handed over."""

    __slots__ = ("answer", "error", "lead", "question", "ready")

    def __init__(self, question: Q) -> None:
        self.question = question
        self.ready = threading.Lock()
        self.ready.acquire()  # released once: an answer, an error, or the turn to send
        self.lead = False
        self.answer: A | None = None
        self.error: BaseException | None = None


class Batcher(Generic[Q, A]):
    """``ask(question)`` through ``send`` (one request for every question queued): ``send``
    returns an answer per question by key; a question it leaves out raises ``missing``."""

    def __init__(self, send: Callable[[Sequence[Q]], Mapping[str, A]],
                 key: Callable[[Q], str], *, max_batch: int = MAX_BATCH) -> None:
        self._send = send
        self._key = key
        self.max_batch = max_batch
        self._lock = threading.Lock()
        self._pending: deque[_Ask[Q, A]] = deque()
        self._sending = False  # a request is in flight, or a queued thread was told to send
        self.batches = 0  # requests carrying more than one question (for tests and benches)
        self.batched = 0  # questions those requests carried

    def ask(self, question: Q) -> A:
        ask: _Ask[Q, A] = _Ask(question)
        with self._lock:
            self._pending.append(ask)
            ask.lead = not self._sending
            self._sending = True
        if not ask.lead:
            ask.ready.acquire()
        if ask.lead:
            self._lead(ask)
        if ask.error is not None:
            raise ask.error
        assert ask.answer is not None
        return ask.answer

    def _lead(self, me: _Ask[Q, A]) -> None:
        """Send what is queued (``me`` first), hand the answers over, and pass the turn to
        the first thread queued meanwhile."""
        batch = self._take(me)
        try:
            self._answer(batch)
        finally:
            with self._lock:
                successor = self._pending[0] if self._pending else None
                if successor is None:
                    self._sending = False
                else:
                    successor.lead = True
            for ask in batch:
                if ask is not me:
                    ask.ready.release()
            if successor is not None:
                successor.ready.release()

    def _take(self, me: _Ask[Q, A]) -> list[_Ask[Q, A]]:
        with self._lock:
            self._pending.remove(me)
            batch, keys, kept = [me], {self._key(me.question)}, deque[_Ask[Q, A]]()
            while self._pending and len(batch) < self.max_batch:
                ask = self._pending.popleft()
                key = self._key(ask.question)
                if key in keys:
                    kept.append(ask)  # one question per key and request
                    continue
                keys.add(key)
                batch.append(ask)
            self._pending.extendleft(reversed(kept))
            return batch

    def _answer(self, batch: list[_Ask[Q, A]]) -> None:
        if len(batch) > 1:
            self.batches += 1
            self.batched += len(batch)
        try:
            answers = self._send([ask.question for ask in batch])
        except BaseException as exc:  # every thread of the batch raises it
            for ask in batch:
                ask.error = exc
            return
        for ask in batch:
            found = answers.get(self._key(ask.question))
            if found is None:
                ask.error = LookupError(f"no answer about {self._key(ask.question)}")
            else:
                ask.answer = found
