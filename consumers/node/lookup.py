"""``GET /v1/lookup?key=A&key=B...``: many keys as they stand, in one request.

A worker's first read of a key asks for its snapshot as it stands (no wait). When many
threads of one process ask at once, :class:`effectlog.lookups.LookupBatcher` sends their keys
together, so the node's per-request work (parsing, routing, answering) is paid once per batch
instead of once per key.

The answer is ``{"found": [...], "unanswered": [...]}``. Each found entry has the ``key``,
its ``partition``, the ``applied_offset`` below which that partition is in the snapshot (read
before the snapshot, as on ``GET /v1/effects/{key}``), ``served_by``, and the ``snapshot``
(``effectlog get KEY --json``'s JSON, or null for an unknown key). Keys of partitions another
member owns are asked of that member in one request per member; a key no member could answer
now (restoring, rebalancing, owner unreachable) is listed in ``unanswered`` with its
``partition`` and ``reason``, and the client asks for it alone with ``GET /v1/effects/{key}``,
which waits and retries. The route only reads: nothing is created or waited for.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from consumers.node.forwarding import FORWARDED, Forwarder
from projections.rocksdb.snapshot import snapshot_json

if TYPE_CHECKING:
    from consumers.node.node import Node

#: Keys one lookup may ask for (a batch of a worker's threads is far smaller).
MAX_KEYS = 256

Entry = dict[str, Any]


class Lookup:
    """The route's handler over one node."""

    def __init__(self, node: Node, forwarder: Forwarder) -> None:
        self.node = node
        self.forwarder = forwarder

    async def answer(self, request: web.Request) -> web.Response:
        keys = request.query.getall("key", [])
        if not keys or len(keys) > MAX_KEYS:
            return _answer(400, {"error": f"a lookup asks for 1 to {MAX_KEYS} keys "
                                          f"(key=...&key=...), not {len(keys)}"})
        found, unanswered, elsewhere = self.local(keys)
        if elsewhere and FORWARDED not in request.headers:
            for theirs in await asyncio.gather(*(self._ask(owner, asked)
                                                 for owner, asked in elsewhere.items())):
                found.extend(theirs[0])
                unanswered.extend(theirs[1])
        else:
            for asked in elsewhere.values():
                unanswered.extend(asked)
        return _answer(200, {"found": found, "unanswered": unanswered})

    def local(self, keys: list[str]) -> tuple[list[Entry], list[Entry], dict[str, list[Entry]]]:
        """Keys this node serves (found), cannot answer now (unanswered), and those of
        partitions another member owns, by that member."""
        node = self.node
        found: list[Entry] = []
        unanswered: list[Entry] = []
        elsewhere: dict[str, list[Entry]] = {}
        owners: Mapping[int, str] = node.membership.owners()
        for key in dict.fromkeys(keys):  # each key once, in the order asked
            partition = node.partition_for(key)
            status = node.gate.status(partition)
            if status is None:
                owner = owners.get(partition)
                entry = {"key": key, "partition": partition, "reason": "no known owner"}
                if owner is None or owner == node.url:
                    unanswered.append(entry)
                else:
                    elsewhere.setdefault(owner, []).append(entry)
                continue
            if status == "restoring":
                unanswered.append({"key": key, "partition": partition,
                                   "reason": f"partition {partition} is restoring"})
                continue
            applied = node.gate.position(partition)  # before the snapshot: never past it
            try:
                raw = node.reader.get_raw(key)
            except Exception:  # released under us (revoked): rocksdict raises bare exceptions
                unanswered.append({"key": key, "partition": partition,
                                   "reason": f"partition {partition} moved to another member"})
                continue
            found.append({"key": key, "partition": partition, "applied_offset": applied,
                          "served_by": node.url,
                          "snapshot": None if raw is None else snapshot_json(raw)})
        return found, unanswered, elsewhere

    async def _ask(self, owner: str, asked: list[Entry]) -> tuple[list[Entry], list[Entry]]:
        """The owner's answer for ``asked``; all of them unanswered when it does not give
        one."""
        query = urlencode([("key", entry["key"]) for entry in asked])
        reply = await self.forwarder.ask(owner, "/v1/lookup?" + query)
        if reply is None or reply.status != 200:
            return [], [{**entry, "reason": f"owner {owner} did not answer"} for entry in asked]
        try:
            theirs = json.loads(reply.body)
            return list(theirs["found"]), list(theirs["unanswered"])
        except (ValueError, KeyError, TypeError):
            return [], [{**entry, "reason": f"owner {owner} answered malformed JSON"}
                        for entry in asked]


def _answer(status: int, value: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(value, sort_keys=True, default=str),
                        content_type="application/json")
