"""``POST /v1/recover``: one recovery pass now, on every member, over the partitions each serves.

The body carries the pass's deadlines (:meth:`RecoverySettings.deadlines_json`). The member
asked runs the pass over its own partitions, asks every other member to do the same
(``Effectlog-Forwarded``: that member's own partitions only) and merges the answers: the
commands issued, and ``uncovered``, each partition no pass covered with why (restoring, its
owner runs no recovery, did not answer, or nobody serves it while the group rebalances).
``effectlog recover --server`` asks it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web

from consumers.node.forwarding import FORWARDED, Forwarder
from consumers.recovery import RecoverySettings
from effectlog.errors import InvalidInput

if TYPE_CHECKING:
    from consumers.node.ports import ServedNode

PATH = "/v1/recover"
#: How long a member's pass may take before it counts as not answering.
MEMBER_TIMEOUT_S = 60.0


class RecoverRoute:
    """The handler of ``POST /v1/recover`` on one node."""

    def __init__(self, node: ServedNode, forwarder: Forwarder) -> None:
        self.node = node
        self.forwarder = forwarder

    async def answer(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise InvalidInput("the body must be a JSON object of deadlines")
            RecoverySettings().with_deadlines(body)  # refused here, before any member acts
        except (ValueError, InvalidInput) as exc:
            return _json(400, {"error": str(exc)})
        mine = await asyncio.to_thread(self.node.recover_local, body)
        if FORWARDED in request.headers:
            return _json(200, mine)
        others = [m for m in self.node.membership.members() if m != self.node.url]
        raw = json.dumps(body).encode()
        replies = await asyncio.gather(*(self.forwarder.post(m, PATH, raw, MEMBER_TIMEOUT_S)
                                         for m in others))
        reports = [mine]
        silent: list[str] = []
        for member, reply in zip(others, replies, strict=True):
            if reply is not None and reply.status == 200:
                reports.append(json.loads(reply.body))
            else:
                silent.append(member)
        return _json(200, merge(reports, silent, self.node.partition_count,
                                self.node.membership.owners()))


def merge(reports: list[dict[str, Any]], silent: list[str], partitions: int,
          owners: Mapping[int, str]) -> dict[str, Any]:
    """One answer from the members' ``reports`` (``silent``: members that did not answer):
    what was issued, which member covered which partitions, and why each other partition
    was not covered."""
    covered: dict[int, str] = {}
    why: dict[int, str] = {}
    for report in reports:
        member = report["served_by"]
        for partition in report["covered"]:
            covered[int(partition)] = member
        for partition, status in report["held"].items():
            if int(partition) in covered:
                continue
            if status == "restoring":
                why[int(partition)] = f"restoring on {member}"
            elif not report["recovers"]:
                why[int(partition)] = f"its owner {member} runs with --no-recovery"
            elif "error" in report:
                why[int(partition)] = f"the pass on {member} failed: {report['error']}"
    for partition in range(partitions):
        if partition in covered or partition in why:
            continue
        owner = owners.get(partition)
        why[partition] = f"its owner {owner} did not answer" if owner in silent else \
            "no member serves it now (the group is rebalancing)"
    return {"issued": [c for r in reports for c in r["issued"]],
            "outstanding": sum(r["outstanding"] for r in reports),
            "backing_off": sum(r["backing_off"] for r in reports),
            "truncated": any(r["truncated"] for r in reports),
            "members": {r["served_by"]: sorted(p for p, m in covered.items()
                                               if m == r["served_by"]) for r in reports},
            "uncovered": {str(p): w for p, w in sorted(why.items()) if p not in covered}}


def _json(status: int, value: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(value, sort_keys=True),
                        content_type="application/json")
