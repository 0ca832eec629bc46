"""``POST /v1/judge``: many queries about keys, each answered by the owner of its partition.

Queries about partitions served here are answered by this node's
:class:`~consumers.node.judging.PartitionJudge` (each waiting, at most ``timeout_ms``, until
its partition has applied what it needs); the others are sent to their owners, one request
per owner, and a query nobody could answer in time is listed in ``unanswered`` for the asker
to ask again. A forwarded request is never forwarded again. The body is described in
:mod:`effectlog.judge.wire`; an asker whose fingerprint this release cannot judge gets 409.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from consumers.node.forwarding import FORWARDED, Forwarder, Membership
from consumers.node.judging import PartitionJudge, Unanswered
from effectlog.errors import InvalidInput
from effectlog.judge.premises import CannotJudge
from effectlog.judge.query import Answer, Query
from effectlog.judge.wire import answer_json, parse_request, query_json

DEFAULT_TIMEOUT_MS = 5000
PATH = "/v1/judge"


class JudgeRoute:
    """The route's handler over one node's judge."""

    def __init__(self, judge: PartitionJudge, membership: Membership,
                 forwarder: Forwarder) -> None:
        self.judge = judge
        self.membership = membership
        self.forwarder = forwarder

    async def answer(self, request: web.Request) -> web.Response:
        try:
            fingerprint, timeout_ms, queries = parse_request(await request.json())
        except (ValueError, InvalidInput) as exc:
            return _reply(400, {"error": str(exc) if isinstance(exc, InvalidInput)
                                else f"the body is not JSON: {exc}"})
        try:
            self.judge.refuse_unknown(fingerprint)
        except CannotJudge as exc:
            return _reply(409, {"error": str(exc), "reason": "cannot_judge"})
        timeout_s = (DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms) / 1000
        found = await asyncio.gather(*(self.judge.answer(q, fingerprint, timeout_s)
                                       for q in queries))
        answers: list[dict[str, Any]] = []
        unanswered: list[dict[str, Any]] = []
        elsewhere: dict[str, list[Query]] = {}
        owners: Mapping[int, str] = self.membership.owners()
        forwarded = FORWARDED in request.headers
        for query, result in zip(queries, found, strict=True):
            if isinstance(result, Answer):
                answers.append(answer_json(result))
                continue
            owner = owners.get(result.partition)
            if result.here or forwarded or owner is None or owner == self.judge.url:
                unanswered.append(result.as_json() if result.here or owner else
                                  Unanswered(query.key, result.partition, "no known owner of "
                                             f"partition {result.partition}").as_json())
                continue
            elsewhere.setdefault(owner, []).append(query)
        for theirs in await asyncio.gather(*(
                self._ask(owner, fingerprint, timeout_s, asked)
                for owner, asked in elsewhere.items())):
            if isinstance(theirs, CannotJudge):  # an owner of another release: said at once
                return _reply(409, {"error": str(theirs), "reason": "cannot_judge"})
            answers.extend(theirs[0])
            unanswered.extend(theirs[1])
        return _reply(200, {"answers": answers, "unanswered": unanswered})

    async def _ask(self, owner: str, fingerprint: str, timeout_s: float, asked: list[Query]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | CannotJudge:
        """The owner's answers to ``asked``; all unanswered when it gives none; its refusal
        when it cannot judge the asker's events (HTTP 409)."""
        body = json.dumps({"judge": fingerprint, "timeout_ms": int(timeout_s * 1000),
                           "queries": [query_json(q) for q in asked]}).encode("utf-8")
        reply = await self.forwarder.post(owner, PATH, body, timeout_s + 5)
        failed = [{"key": q.key, "partition": -1, "reason": f"owner {owner} did not answer"}
                  for q in asked]
        if reply is not None and reply.status == 409:
            try:
                return CannotJudge(str(json.loads(reply.body)["error"]))
            except (ValueError, KeyError, TypeError):
                return CannotJudge(f"owner {owner} cannot judge these events (HTTP 409)")
        if reply is None or reply.status != 200:
            return [], failed
        try:
            theirs = json.loads(reply.body)
            return list(theirs["answers"]), list(theirs["unanswered"])
        except (ValueError, KeyError, TypeError):
            return [], failed


def _reply(status: int, value: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(value, sort_keys=True, default=str),
                        content_type="application/json")
