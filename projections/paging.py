"""Pages of a state list that hold at any size: cursor paging over the state/time index.

A page is read by one seek past its cursor and at most ``budget`` index entries, whatever
the list's length; filters (kind prefix, target substring) test entries within that range,
so a rare match costs a bounded scan per page and the page says where it stopped. Pages of
several sources (the states of one reader, the members of a cluster) merge without losing
an entry: the merged page stops where the least advanced source stopped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, unquote

from effectlog.errors import InvalidInput
from projections.store import Cursor, ProjectionReader, cursor_of

#: Index entries one page may visit (per state, per member) before it stops short.
SCAN_BUDGET = 5000
#: The most effects one page may ask for: the CLI's ``list --limit`` and the HTTP API agree.
MAX_LIMIT = 10_000
#: A cursor's time (ms) is a signed 64-bit log timestamp.
MAX_CURSOR_MS = 2**63 - 1
_MS = re.compile(r"[0-9]{1,19}")


class Page(NamedTuple):
    """Snapshots (JSON views) in index order, and where the next page starts: after the
    last item of a full page, or after the last entry visited when the budget ran out;
    None when the range ends with this page."""

    items: list[dict[str, Any]]
    next: Cursor | None


class Filters(NamedTuple):
    """What a listed effect must match (None: anything)."""

    kind: str | None = None     # a prefix: ``payment`` matches ``payment.charge``
    target: str | None = None   # a substring of the target
    key: str | None = None      # a prefix of the key: ``agent:run-7.`` is run-7's effects

    def match(self, snapshot: dict[str, Any]) -> bool:
        return (self.kind is None or str(snapshot["kind"]).startswith(self.kind)) and \
            (self.target is None or self.target in str(snapshot["target"])) and \
            (self.key is None or str(snapshot["idempotency_key"]).startswith(self.key))

    @property
    def any(self) -> bool:
        return self.kind is not None or self.target is not None or self.key is not None


ANYTHING = Filters()


def read_page(reader: ProjectionReader, state: str, *, before_ms: int | None = None,
              after: Cursor | None = None, filters: Filters = ANYTHING, limit: int = 100,
              budget: int = SCAN_BUDGET) -> Page:
    """Up to ``limit`` effects of ``state`` past ``after`` matching ``filters``, having
    visited at most ``budget`` index entries (``limit`` of them without filters), and one
    more to tell whether the range ends there."""
    items: list[dict[str, Any]] = []
    visited: Cursor | None = None
    scan = reader.scan_state_json(state, before_ms, None, after)
    for steps, snapshot in enumerate(scan, start=1):
        visited = cursor_of(snapshot)
        if filters.match(snapshot):
            items.append(snapshot)
        if len(items) >= limit or steps >= budget:
            more = next(scan, None) is not None  # one look further: is this the end?
            return Page(items, visited if more else None)
    return Page(items, None)


def merge_pages(pages: Iterable[Page], limit: int) -> Page:
    """One page out of pages of disjoint sources read with the same query and ``limit``."""
    pages = list(pages)
    ends = [p.next for p in pages if p.next is not None]
    frontier = min(ends) if ends else None
    items = sorted((s for p in pages for s in p.items), key=cursor_of)
    if frontier is not None:
        items = [s for s in items if cursor_of(s) <= frontier]
    if len(items) > limit or (len(items) == limit and frontier is not None):
        return Page(items[:limit], cursor_of(items[limit - 1]))
    return Page(items, frontier)  # every source ended (None) or stopped short at frontier


def format_cursor(cursor: Cursor) -> str:
    """``MS:KEY`` with the key percent-encoded (ASCII: fit for a header or a URL)."""
    return f"{cursor[0]}:{quote(cursor[1], safe='')}"


def parse_cursor(text: str) -> Cursor:
    """The cursor :func:`format_cursor` wrote; :class:`InvalidInput` for anything else
    (MS is 0 to 2**63-1 in ASCII digits, KEY percent-encoded UTF-8)."""
    ms, sep, key = text.partition(":")
    if not sep or not _MS.fullmatch(ms) or int(ms) > MAX_CURSOR_MS or not key:
        raise InvalidInput(f"a cursor is MS:KEY (MS up to {MAX_CURSOR_MS}), not {text[:80]!r}")
    try:
        decoded = unquote(key, errors="strict")
        decoded.encode("utf-8")
    except UnicodeError:  # percent-escapes that are not UTF-8, or a lone surrogate
        raise InvalidInput(f"a cursor's key is percent-encoded UTF-8, not {text[:80]!r}") from None
    return int(ms), decoded


def page_of(items: Sequence[dict[str, Any]], next_text: str | None) -> Page:
    """A page as a member answered it: its items and its ``Effectlog-Next`` header."""
    return Page(list(items), None if not next_text else parse_cursor(next_text))
