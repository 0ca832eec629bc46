"""A process's own delivery reports prove what a range holds only when it wrote all of it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from effectlog.log.kafka.written import WrittenKeys

K, OTHER = b"agent:k:k:t", b"agent:other:k:t"


def ledger(*records: tuple[int, bytes], keep: int = 100) -> WrittenKeys:
    written = WrittenKeys(keep)
    for offset, key in records:
        written.note("events", 0, offset, key)
    return written


def test_a_range_of_other_keys_it_wrote_holds_no_record_of_the_key() -> None:
    written = ledger((5, OTHER), (6, OTHER), (7, K))
    assert written.untouched("events", 0, K, 5, 7, ())
    assert written.untouched("events", 0, K, 5, 8, {7})  # the key's record is the asker's own
    assert not written.untouched("events", 0, K, 5, 8, ())  # someone else's record of the key
    assert written.untouched("events", 0, K, 6, 6, ())  # an empty range holds nothing


def test_an_offset_it_did_not_write_cannot_be_told() -> None:
    written = ledger((5, OTHER), (7, OTHER))  # 6: another writer's record or a marker
    assert not written.untouched("events", 0, K, 5, 8, ())
    assert written.untouched("events", 0, K, 7, 8, ())
    assert not written.untouched("events", 0, K, 4, 6, ())  # before what it holds
    assert not written.untouched("events", 0, K, 7, 9, ())  # not written (or not reported) yet


def test_partitions_and_topics_are_apart() -> None:
    written = ledger((5, OTHER))
    assert not written.untouched("events", 1, K, 5, 6, ())
    assert not written.untouched("commands", 0, K, 5, 6, ())


def test_offsets_going_back_forget_the_partition() -> None:
    written = ledger((5, OTHER), (6, OTHER), (2, OTHER))  # the topic was replaced
    assert not written.untouched("events", 0, K, 5, 7, ())
    assert written.untouched("events", 0, K, 2, 3, ())


def test_only_the_latest_records_are_kept() -> None:
    written = ledger(*((offset, OTHER) for offset in range(10)), keep=4)
    assert written.untouched("events", 0, K, 6, 10, ())
    assert not written.untouched("events", 0, K, 5, 10, ())


@given(st.lists(st.tuples(st.integers(0, 30), st.booleans()), max_size=40),
       st.integers(0, 32), st.integers(0, 32))
def test_it_answers_true_only_when_every_offset_is_its_own_and_none_of_the_key(
        reports: list[tuple[int, bool]], start: int, end: int) -> None:
    written = WrittenKeys(1000)
    held: dict[int, bytes] = {}
    for offset, of_key in reports:
        key = K if of_key else OTHER
        if held and max(held) >= offset:
            held.clear()
        held[offset] = key
        written.note("events", 0, offset, key)
    truth = all(held.get(offset) == OTHER for offset in range(start, end))
    if written.untouched("events", 0, K, start, end, ()):
        assert truth
    elif start < end and all(offset in held for offset in range(start, end)):
        assert not truth  # everything written and held: it can tell, so False means touched
