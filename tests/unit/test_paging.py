"""Cursor paging of state lists (projections.paging) over real RocksDB stores."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectlog.errors import InvalidInput
from effectlog.machine import new_effect
from projections.paging import (
    Filters,
    Page,
    format_cursor,
    merge_pages,
    parse_cursor,
    read_page,
)
from projections.rocksdb.store import RocksProjectionStore, StoreReader
from projections.store import cursor_of
from projections.testing import records

KINDS = ("email.send", "payment.charge", "payment.refund", "ticket.create")


def _fill(store: RocksProjectionStore, partition: int, numbers: list[int],
          rng: random.Random) -> None:
    events = [replace(new_effect(f"op{n}", rng.choice(KINDS), f"acct:{n % 7}/x{n}", {"n": n}, "w"),
                      occurred_at=1_000 + rng.randrange(40)) for n in numbers]
    store.open_writer(partition, partitions=3).apply(records(events, partition))


@pytest.fixture(scope="module")
def members(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[StoreReader]]:
    """Three stores (as three members of a cluster) of 100 CREATED effects each; many share
    a millisecond, so the key breaks ties."""
    rng = random.Random(7)
    stores = []
    for member in range(3):
        store = RocksProjectionStore(tmp_path_factory.mktemp(f"m{member}") / "state")
        _fill(store, member, list(range(member * 100, member * 100 + 100)), rng)
        stores.append(store)
    yield [s.reader() for s in stores]
    for store in stores:
        store.close()


def _everything(readers: list[StoreReader], filters: Filters) -> list[str]:
    found = [s for r in readers for s in r.scan_state_json("CREATED") if filters.match(s)]
    return [s["idempotency_key"] for s in sorted(found, key=cursor_of)]


def _walk(readers: list[StoreReader], filters: Filters, limit: int,
          budget: int) -> tuple[list[str], int]:
    keys: list[str] = []
    after = None
    for pages in range(1, 2000):
        page = merge_pages([read_page(r, "CREATED", after=after, filters=filters, limit=limit,
                                      budget=budget) for r in readers], limit)
        assert len(page.items) <= limit
        keys.extend(s["idempotency_key"] for s in page.items)
        if page.next is None:
            return keys, pages
        assert after is None or page.next > after  # every page moves on
        after = page.next
    raise AssertionError("paging did not end")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(limit=st.integers(1, 30), budget=st.integers(1, 60),
       kind=st.sampled_from([None, "payment", "payment.refund", "ticket", "nope"]),
       target=st.sampled_from([None, "acct:3/", "x1", "zzz"]))
def test_merged_pages_list_every_match_once_in_index_order(
        members: list[StoreReader], limit: int, budget: int, kind: str | None,
        target: str | None) -> None:
    filters = Filters(kind, target)
    keys, _ = _walk(members, filters, limit, budget)
    assert keys == _everything(members, filters)


def test_a_page_visits_at_most_its_budget_of_index_entries(members: list[StoreReader]) -> None:
    reader = members[0]
    before = reader.index_steps
    page = read_page(reader, "CREATED", filters=Filters(target="zzz"), limit=10, budget=25)
    assert page.items == [] and page.next is not None
    assert reader.index_steps - before <= 27  # the budget, the look at the next one and
    # the iterator's own look-ahead
    rest = read_page(reader, "CREATED", after=page.next, filters=Filters(target="zzz"),
                     limit=10, budget=1000)
    assert rest == Page([], None)  # read to the end: nothing skipped, nothing more


def test_a_rare_match_is_reached_page_by_page(members: list[StoreReader]) -> None:
    whole = list(members[1].scan_state_json("CREATED"))
    rare = whole[73]["target"]
    keys, pages = _walk([members[1]], Filters(target=rare), limit=5, budget=10)
    assert keys == [whole[73]["idempotency_key"]] and pages == 10


def test_unfiltered_pages_read_only_their_own_entries(members: list[StoreReader]) -> None:
    reader = members[2]
    first = read_page(reader, "CREATED", limit=20)
    before = reader.index_steps
    second = read_page(reader, "CREATED", after=first.next, limit=20)
    assert reader.index_steps - before <= 22
    whole = list(reader.scan_state_json("CREATED"))
    assert first.items + second.items == whole[:40]
    assert read_page(reader, "CREATED", before_ms=1_000).items == []


def test_cursors_survive_headers_and_urls() -> None:
    key = "agent:op1:email.send:mailto:é@x.org/a b:%<>"
    text = format_cursor((1234, key))
    assert text.isascii() and " " not in text and parse_cursor(text) == (1234, key)
    for bad in ("", "12", "x:key", "-1:key", "12:"):
        with pytest.raises(InvalidInput):
            parse_cursor(bad)


def test_a_merged_page_that_takes_the_last_entries_says_the_list_ends(
        members: list[StoreReader]) -> None:
    whole = sum(len(list(r.scan_state_json("CREATED"))) for r in members)
    pages = [read_page(r, "CREATED", limit=whole) for r in members]
    assert [p.next for p in pages] == [None, None, None]
    assert merge_pages(pages, whole).next is None  # full, yet nothing follows: no cursor
    assert merge_pages(pages, whole - 1).next is not None
