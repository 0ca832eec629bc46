"""One contract suite for the EventLog port; each backend's test module subclasses it.

A subclass provides the ``log`` fixture (a fresh, empty log per test).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from effectlog.log import COMMANDS, EVENTS, EventLog


def neighbour(log: EventLog, key: str) -> str:
    """Another key that lands in ``key``'s partition."""
    partition = log.partition_for(EVENTS, key)
    return next(other for n in range(10_000)
                if log.partition_for(EVENTS, other := f"agent:near{n}:k:t") == partition)


def eventually(check: Callable[[], bool], within: float = 10.0) -> bool:
    """``check()`` became true within ``within`` seconds (a log may need to warm up first)."""
    deadline = time.monotonic() + within
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


class LogContract:
    """Behaviour every event log backend must show."""

    @pytest.fixture
    def log(self) -> EventLog:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_append_returns_increasing_positions_per_partition(self, log: EventLog) -> None:
        positions = [log.append(EVENTS, "agent:op1:email.send:a", b"v%d" % i) for i in range(5)]
        assert len({p.partition for p in positions}) == 1
        offsets = [p.offset for p in positions]
        assert offsets == sorted(offsets) and len(set(offsets)) == 5

    def test_read_returns_what_was_appended_in_order(self, log: EventLog) -> None:
        key = "agent:op2:email.send:b"
        first = log.append(EVENTS, key, b"one")
        log.append(EVENTS, key, b"two")
        records = log.read(EVENTS, first.partition, first.offset, 10, timeout=5)
        assert [r.value for r in records if r.key == key][:2] == [b"one", b"two"]
        assert records[0].offset == first.offset and records[0].key == key

    def test_end_offsets_move_past_appended_records(self, log: EventLog) -> None:
        pos = log.append(EVENTS, "agent:op3:k:t", b"x")
        assert log.end_offsets(EVENTS)[pos.partition] == pos.offset + 1

    def test_read_key_returns_only_that_key_in_order(self, log: EventLog) -> None:
        for i in range(3):
            log.append(EVENTS, "agent:a:k:t", b"a%d" % i)
            log.append(EVENTS, "agent:b:k:t", b"b%d" % i)
        assert [r.value for r in log.read_key(EVENTS, "agent:a:k:t")] == [b"a0", b"a1", b"a2"]

    def test_topics_are_separate(self, log: EventLog) -> None:
        log.append(COMMANDS, "agent:c:k:t", b"cmd")
        assert log.read_key(EVENTS, "agent:c:k:t") == []
        assert [r.value for r in log.read_key(COMMANDS, "agent:c:k:t")] == [b"cmd"]

    def test_same_key_always_lands_in_the_same_partition(self, log: EventLog) -> None:
        key = "agent:op4:payment.charge:acct-9"
        assert {log.append(EVENTS, key, b"x").partition for _ in range(4)} == {
            log.partition_for(EVENTS, key)
        }

    def test_append_many_keeps_order(self, log: EventLog) -> None:
        items = [(f"agent:m{i % 3}:k:t", b"%d" % i) for i in range(30)]
        positions = log.append_many(EVENTS, items)
        assert len(positions) == 30
        got = log.read_key(EVENTS, "agent:m1:k:t")
        assert [r.value for r in got] == [v for k, v in items if k == "agent:m1:k:t"]

    def test_scan_stops_at_the_end_seen_at_start(self, log: EventLog) -> None:
        for i in range(7):
            log.append(EVENTS, "agent:s:k:t", b"%d" % i)
        part = log.partition_for(EVENTS, "agent:s:k:t")
        assert len([r for r in log.scan(EVENTS, part) if r.key == "agent:s:k:t"]) == 7

    def test_read_past_the_end_is_empty(self, log: EventLog) -> None:
        end = log.end_offsets(EVENTS)
        for partition, offset in end.items():
            assert log.read(EVENTS, partition, offset, 10, timeout=0.2) == []

    def test_binary_values_round_trip_exactly(self, log: EventLog) -> None:
        value = bytes(range(256)) * 4
        pos = log.append(EVENTS, "agent:bin:k:t", value)
        assert log.read(EVENTS, pos.partition, pos.offset, 1, timeout=5)[0].value == value

    def test_acknowledged_ends_count_every_appended_record(self, log: EventLog) -> None:
        before = log.acknowledged_ends(EVENTS)
        position = log.append(EVENTS, "agent:ack:k:t", b"1")
        after = log.acknowledged_ends(EVENTS)
        assert after[position.partition] == position.offset + 1
        assert after[position.partition] >= before.get(position.partition, 0) + 1
        assert all(after[p] >= n for p, n in log.end_offsets(EVENTS).items())

    def test_conditional_append_is_all_or_nothing_against_the_keys_last_offset(
            self, log: EventLog) -> None:
        if not log.conditional:
            with pytest.raises(NotImplementedError):
                log.append_after(EVENTS, "agent:c:k:t", [b"x"], None)
            return
        key = "agent:cas:k:t"
        log.append(EVENTS, "agent:other:k:t", b"noise")  # other keys do not matter
        first = log.append_after(EVENTS, key, [b"a", b"b", b"c"], None)
        assert first is not None and len(first) == 3
        assert [p.offset for p in first] == sorted(p.offset for p in first)
        assert log.last_offset(EVENTS, key) == first[-1].offset
        # Stale expectations append nothing: "no record yet", and an older offset.
        assert log.append_after(EVENTS, key, [b"late"], None) is None
        assert log.append_after(EVENTS, key, [b"late", b"later"], first[0].offset) is None
        log.append(EVENTS, "agent:other:k:t", b"more noise")
        nxt = log.append_after(EVENTS, key, [b"d"], first[-1].offset)
        assert nxt is not None and nxt[0].offset > first[-1].offset
        assert [r.value for r in log.read_key(EVENTS, key)] == [b"a", b"b", b"c", b"d"]
