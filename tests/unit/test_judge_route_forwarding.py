"""``POST /v1/judge`` forwarded to the owner of a key's partition: an owner of another release
that cannot judge the asker's events (HTTP 409) is passed on as such, so the worker fails at
once with CannotJudge instead of retrying an "owner did not answer" until it gives up."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from consumers.node.forwarding import Reply
from consumers.node.judge_route import JudgeRoute
from consumers.node.judging import Unanswered


class NotHere:
    url = "http://a"

    def refuse_unknown(self, judge: str) -> None:
        return None

    async def answer(self, query: Any, judge: str, timeout_s: float) -> Unanswered:
        return Unanswered(query.key, 3, "partition 3 is not served by http://a", here=False)


class Owners:
    def owners(self) -> dict[int, str]:
        return {3: "http://b"}


class Owner:
    def __init__(self, reply: Reply | None) -> None:
        self.reply = reply

    async def post(self, member: str, path: str, body: bytes, timeout_s: float) -> Reply | None:
        return self.reply


class Request:
    headers: dict[str, str] = {}

    async def json(self) -> Any:
        return {"judge": "f", "timeout_ms": 100, "queries": [{"key": "agent:o:k:t"}]}


def answer(reply: Reply | None) -> tuple[int, dict[str, Any]]:
    route = JudgeRoute(NotHere(), Owners(), Owner(reply))  # type: ignore[arg-type]
    response = asyncio.run(route.answer(Request()))  # type: ignore[arg-type]
    return response.status, json.loads(response.text or "{}")


def test_an_owner_that_cannot_judge_is_passed_on_as_409() -> None:
    refusal = {"error": "http://b cannot judge events written with fingerprint f",
               "reason": "cannot_judge"}
    status, body = answer(Reply(409, json.dumps(refusal).encode(), {}))
    assert status == 409 and body == refusal
    status, body = answer(Reply(409, b"not json", {}))
    assert status == 409 and body["reason"] == "cannot_judge" and "http://b" in body["error"]


def test_an_owner_that_does_not_answer_leaves_the_query_unanswered() -> None:
    for reply in (None, Reply(503, b"", {})):
        status, body = answer(reply)
        assert status == 200 and body["answers"] == []
        assert body["unanswered"][0]["reason"] == "owner http://b did not answer"
