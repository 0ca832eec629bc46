"""Finding effects in the console: one box for a key, a key or operation prefix, a run id, a
kind or a target; and a run's effects together.

``GET /search?q=Q``  a whole key that exists opens its page; anything else lists, over every
                     state, the effects whose key starts with Q (``agent:`` added when Q lacks
                     it: an operation id or its prefix), whose kind starts with Q, and whose
                     target contains Q, each list linking on to its full, paged form; the runs
                     among the matches are named.
``GET /runs/{run}``  every effect of a run of ``effectlog.run`` (operation ids ``{run}.{n}``),
                     in call order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from consumers.console.api import Answer, ApiClient
from consumers.console.pages import call_number, key_path, run_key_prefix, run_of
from effectlog.errors import InvalidInput
from effectlog.keys import validate_key

Render = Callable[..., Awaitable[web.Response]]
#: Effects each search list shows before linking on.
SEARCH_ROWS = 50
#: The most effects a run's page shows.
RUN_ROWS = 500


class SearchPages:
    """The search and run pages, rendered by the console's ``render``."""

    def __init__(self, api: ApiClient, render: Render) -> None:
        self.api = api
        self.render = render

    async def search(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "").strip()
        if not q:
            return await self.render(request, "search.html", q="", sections=[], runs=[])
        if len(q) > 1000 or any(ord(c) < 32 for c in q):
            raise InvalidInput("search for at most 1,000 printable characters")
        if q.startswith("agent:") and await self._exists(q):
            raise web.HTTPSeeOther(key_path(q))
        prefix = q if q.startswith("agent:") else f"agent:{q}"
        asked = {"key": {"key": prefix}, "kind": {"kind": q}, "target": {"target": q}}
        answers = await asyncio.gather(*(self.api.effects(None, limit=SEARCH_ROWS, **filters)
                                         for filters in asked.values()))
        titles = {"key": f"key, operation or run starting with {prefix}",
                  "kind": f"kind starting with {q}", "target": f"target containing {q}"}
        sections = [_section(name, titles[name], answer, filters)
                    for (name, filters), answer in zip(asked.items(), answers, strict=True)]
        runs = sorted({run for s in sections for e in s["effects"]
                       if (run := run_of(str(e["operation_id"]))) is not None})
        return await self.render(request, "search.html", q=q, sections=sections, runs=runs)

    async def run(self, request: web.Request) -> web.Response:
        run_id = request.match_info["run"]
        if not run_id or len(run_id) > 500 or any(ord(c) < 32 for c in run_id):
            raise InvalidInput("a run id is 1 to 500 printable characters")
        answer = await self.api.effects(None, limit=RUN_ROWS, key=run_key_prefix(run_id))
        effects = sorted(answer.body, key=call_number) if answer.status == 200 else []
        states: dict[str, int] = {}
        for effect in effects:
            states[effect["state"]] = states.get(effect["state"], 0) + 1
        return await self.render(
            request, "run.html", 200 if answer.status in (200, 400) else 503, run_id=run_id,
            effects=effects, states=sorted(states.items()),
            error=None if answer.status == 200 else answer.error,
            more=answer.status == 200 and answer.next is not None, limit=RUN_ROWS)

    async def _exists(self, key: str) -> bool:
        try:
            validate_key(key)
        except InvalidInput:
            return False
        return (await self.api.effect(key)).status == 200


def _section(name: str, title: str, answer: Answer, filters: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "title": title,
            "effects": answer.body if answer.status == 200 else [],
            "error": None if answer.status == 200 else answer.error,
            "more": answer.status == 200 and answer.next is not None, "filters": filters}
