"""LookupBatcher: threads that ask while a read is in flight share the next request."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from effectlog.errors import BackendUnavailable
from effectlog.lookups import LookupBatcher

pytestmark = pytest.mark.timeout(60)


class _Server:
    """Answers ``value:KEY``; the first single read can be held until released."""

    def __init__(self, hold_first: bool = False, leave_out: frozenset[str] = frozenset(),
                 batches: bool = True, fail_batches: bool = False) -> None:
        self.singles: list[str] = []
        self.batches: list[list[str]] = []
        self.leave_out = leave_out
        self.can_batch = batches
        self.fail_batches = fail_batches
        self.in_flight = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()
        self._lock = threading.Lock()

    def one(self, key: str) -> str:
        with self._lock:
            self.singles.append(key)
            first = len(self.singles) == 1
        if first:
            self.in_flight.set()
            assert self.release.wait(10), "the test did not release the first read"
        return f"value:{key}"

    def many(self, keys: Sequence[str]) -> Mapping[str, str] | None:
        with self._lock:
            self.batches.append(list(keys))
        if self.fail_batches:
            raise BackendUnavailable("no server answered")
        if not self.can_batch:
            return None
        return {k: f"value:{k}" for k in keys if k not in self.leave_out}


class _Asking:
    """Threads each getting one key; ``results()`` once they are done."""

    def __init__(self, batcher: LookupBatcher[str], server: _Server, keys: list[str]) -> None:
        self.answers: dict[str, object] = {}
        self.threads = [threading.Thread(target=self._ask, args=(batcher, server, k))
                        for k in keys]
        for thread in self.threads:
            thread.start()

    def _ask(self, batcher: LookupBatcher[str], server: _Server, key: str) -> None:
        try:
            self.answers[key] = batcher.get(key, server.one, server.many)
        except Exception as exc:
            self.answers[key] = exc

    def results(self) -> dict[str, object]:
        for thread in self.threads:
            thread.join(10)
            assert not thread.is_alive()
        return self.answers


def _queued(batcher: LookupBatcher[str], n: int) -> None:
    deadline = time.monotonic() + 10
    while len(batcher._pending) < n:
        assert time.monotonic() < deadline, "threads did not queue"
        time.sleep(0.001)


def _held(server: _Server, batcher: LookupBatcher[str], keys: list[str]) -> dict[str, object]:
    """The first key's read in flight and held, the other keys queued behind it."""
    first = _Asking(batcher, server, keys[:1])
    assert server.in_flight.wait(10)
    rest = _Asking(batcher, server, keys[1:])
    _queued(batcher, len(keys) - 1)
    server.release.set()
    return first.results() | rest.results()


def test_one_thread_alone_sends_single_reads() -> None:
    server = _Server()
    batcher: LookupBatcher[str] = LookupBatcher()
    assert [batcher.get(k, server.one, server.many) for k in ("a", "b", "a")] == \
        ["value:a", "value:b", "value:a"]
    assert server.singles == ["a", "b", "a"] and server.batches == [] and batcher.batches == 0


def test_reads_queued_behind_one_in_flight_go_in_one_request() -> None:
    server = _Server(hold_first=True)
    batcher: LookupBatcher[str] = LookupBatcher()
    keys = [f"k{i}" for i in range(8)]
    results = _held(server, batcher, keys)
    assert results == {k: f"value:{k}" for k in keys}
    assert server.singles == ["k0"]
    assert len(server.batches) == 1 and sorted(server.batches[0]) == keys[1:]
    assert batcher.get("after", server.one, server.many) == "value:after" and server.singles[-1] == "after"


@pytest.mark.parametrize(("max_keys", "max_chars", "sizes"), [(3, 40, [3, 3]),
                                                               (10, 25, [2, 2, 2])])
def test_a_batch_is_split_by_key_count_and_query_size(max_keys: int, max_chars: int,
                                                      sizes: list[int]) -> None:
    server = _Server(hold_first=True)
    batcher: LookupBatcher[str] = LookupBatcher(max_keys=max_keys, max_query_chars=max_chars)
    keys = ["first"] + [f"key-{i:02d}" for i in range(7)]  # each "&key=key-NN" counts 11
    assert _held(server, batcher, keys) == {k: f"value:{k}" for k in keys}
    assert [len(b) for b in server.batches] == sizes  # and the one left over goes alone
    assert sorted([k for b in server.batches for k in b] + server.singles) == sorted(keys)
    assert len(server.singles) == 2


def test_keys_left_out_or_a_server_without_batches_are_asked_alone() -> None:
    server = _Server(hold_first=True, leave_out=frozenset({"k2", "k3"}))
    batcher: LookupBatcher[str] = LookupBatcher()
    keys = [f"k{i}" for i in range(5)]
    assert _held(server, batcher, keys) == {k: f"value:{k}" for k in keys}
    assert sorted(server.singles) == ["k0", "k2", "k3"]

    old = _Server(hold_first=True, batches=False)
    assert _held(old, LookupBatcher(), keys) == {k: f"value:{k}" for k in keys}
    assert sorted(old.singles) == keys and len(old.batches) == 1


def test_a_failed_batch_fails_each_of_its_reads_and_the_next_read_is_sent() -> None:
    server = _Server(hold_first=True, fail_batches=True)
    batcher: LookupBatcher[str] = LookupBatcher()
    results = _held(server, batcher, ["k0", "k1", "k2"])
    assert results["k0"] == "value:k0"
    assert all(isinstance(results[k], BackendUnavailable) for k in ("k1", "k2"))
    assert batcher.get("k3", server.one, server.many) == "value:k3" and not batcher._sending


@settings(max_examples=25, deadline=None)
@given(st.lists(st.sampled_from([f"key{i}" for i in range(12)]), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=8))
def test_every_thread_gets_its_own_answer_under_contention(keys: list[str],
                                                           max_keys: int) -> None:
    answered: list[tuple[str, object]] = []
    lock = threading.Lock()

    def slow_one(key: str) -> str:
        time.sleep(0.0005)
        return f"value:{key}"

    def slow_many(asked: Sequence[str]) -> Mapping[str, str]:
        time.sleep(0.0005)
        return {k: f"value:{k}" for k in asked if k != "key7"}  # one key always asked alone

    batcher: LookupBatcher[str] = LookupBatcher(max_keys=max_keys)

    def ask(key: str) -> None:
        value = batcher.get(key, slow_one, slow_many)
        with lock:
            answered.append((key, value))

    threads = [threading.Thread(target=ask, args=(k,)) for k in keys]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive()
    assert sorted(answered) == sorted((k, f"value:{k}") for k in keys)
    assert not batcher._sending and not batcher._pending


def test_clients_of_the_same_servers_share_one_batcher() -> None:
    first: LookupBatcher[str] = LookupBatcher.shared(["http://127.0.0.1:1"])
    assert LookupBatcher.shared(["http://127.0.0.1:1"]) is first
    assert LookupBatcher.shared(["http://127.0.0.1:2"]) is not first
