"""The query API of a node (aiohttp): effects by key, the judge, lists and stats.

``GET /v1/effects/{key}`` answers from the partition's owner (forwarding when that is
another member) with one consistent read of the key and its partition's applied offset, with
``?min_offset=N`` (answer once offset N is applied) and ``?fresh=1`` (answer once everything
in the log at arrival is applied), 504 when that takes longer than ``timeout_ms``, 503 +
``Retry-After`` while the partition restores, moves or has no owner. Every answer about a key
names its partition (``Effectlog-Partition``), an offset below which every record of that
partition is in the snapshot (``Effectlog-Applied-Offset``, read with it), the events topic
and projection generation it comes from (``Effectlog-Topic-Id``, ``Effectlog-Generation``)
and the member (``Effectlog-Served-By``); the body is exactly what ``effectlog get KEY
--json`` prints; with ``min_offset``, ``Effectlog-Rejected`` names the reason when the event
at that offset was refused. ``POST /v1/judge`` answers writers' questions, verdicts on their
own events included (:mod:`consumers.node.judge_route`). ``GET /v1/effects`` and
``GET /v1/stats`` ask every member and merge; a list pages by cursor (``after=`` the
``Effectlog-Next`` header of the page before, see :mod:`projections.paging`) and filters by
``kind`` (prefix), ``target`` (substring) and ``key`` (prefix). ``POST /v1/recover`` runs a
recovery pass on every member (:mod:`consumers.node.recover_route`). ``/metrics``,
``/healthz`` (alive) and ``/readyz`` (serving its share) live here too.

Other routes (the web console) plug in through ``build_app(node, extra=...)``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web

from consumers.node.forwarding import FORWARDED, NEXT, NOT_OWNER, Forwarder
from consumers.node.health import HealthCheck
from consumers.node.judge_route import PATH as JUDGE_PATH
from consumers.node.judge_route import JudgeRoute
from consumers.node.judging import Unanswered
from consumers.node.recover_route import PATH as RECOVER_PATH
from consumers.node.recover_route import RecoverRoute
from consumers.node.stale_reads import STALE, STANDBY
from effectlog.errors import EffectlogError, InvalidInput
from effectlog.judge.premises import worker_fingerprint
from effectlog.judge.query import Answer, Query
from effectlog.keys import validate_key
from effectlog.metrics import CONTENT_TYPE_LATEST
from effectlog.redact import redact_url
from effectlog.stats import STATES, stats_figures
from projections.paging import (
    MAX_LIMIT,
    Filters,
    format_cursor,
    merge_pages,
    page_of,
    parse_cursor,
)

if TYPE_CHECKING:
    from consumers.node.ports import ServedNode

logger = logging.getLogger(__name__)

#: Registers extra routes (or sub-applications) on the node's application.
RouteHook = Callable[[web.Application], None]
NODE_KEY: web.AppKey[ServedNode] = web.AppKey("effectlog_node")
DEFAULT_TIMEOUT_MS = 5000
MAX_TIMEOUT_MS = 60_000
RETRY_AFTER_S = "1"
STANDBY_ASK_S = 1.0  # how long a member is given to answer from its standby copy


def build_app(node: ServedNode, extra: RouteHook | None = None) -> web.Application:
    """The node's aiohttp application; ``extra`` adds routes (``app[NODE_KEY]`` is the node)."""
    app = web.Application()
    api = _Api(node)
    app[NODE_KEY] = node
    app.router.add_get("/v1/effects/{key:.+}", api.effect)
    app.router.add_get("/v1/effects", api.effects)
    app.router.add_post(JUDGE_PATH, JudgeRoute(node.judge, node.membership, api.forwarder).answer)
    app.router.add_post(RECOVER_PATH, RecoverRoute(node, api.forwarder).answer)
    app.router.add_get("/v1/stats", api.stats)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/healthz", api.health)
    app.router.add_get("/readyz", api.ready)
    app.on_cleanup.append(api.close)
    if extra is not None:
        extra(app)
    return app


def _json(status: int, value: Any, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(status=status, text=json.dumps(value, sort_keys=True, default=str),
                        content_type="application/json", headers=headers)


def _error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return _json(status, {"error": message}, headers)


def _unavailable(message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return _error(503, message, {**(headers or {}), "Retry-After": RETRY_AFTER_S})


def _int(query: Mapping[str, str], name: str, low: int, high: int) -> int | None:
    text = query.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise InvalidInput(f"{name} must be an integer, not {text!r}") from None
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be between {low} and {high}")
    return value


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "0").lower() in ("1", "true", "yes")


class _Api:
    """Request handlers over one node."""

    def __init__(self, node: ServedNode) -> None:
        self.node = node
        self.forwarder = Forwarder(node.url)
        self.health_check = HealthCheck(node, node.health_wait_s)
        self.fingerprint = worker_fingerprint()  # a reader's: this release's rules and schema
        self._refreshing: asyncio.Future[None] | None = None

    async def close(self, app: web.Application) -> None:
        await self.forwarder.close()

    # -- one key -------------------------------------------------------------------------

    async def effect(self, request: web.Request) -> web.Response:
        node, query = self.node, request.query
        key = request.match_info["key"]
        try:
            min_offset = _int(query, "min_offset", 0, 2**63 - 1)
            asked = _int(query, "timeout_ms", 0, MAX_TIMEOUT_MS)  # 0: do not wait
            timeout_ms = DEFAULT_TIMEOUT_MS if asked is None else asked
            fresh = _flag(query, "fresh")
            validate_key(key)  # a malformed key is the asker's error (400), not unknown (404)
        except InvalidInput as exc:
            return _error(400, str(exc))
        if _flag(query, STANDBY) and FORWARDED in request.headers:
            return await self._standby_here(key)
        found = await node.judge.answer(Query(key, after=min_offset, fresh=fresh),
                                        self.fingerprint, timeout_ms / 1000)
        if isinstance(found, Unanswered):
            plain = min_offset is None and not fresh  # a read a standby copy may answer
            return await self._unanswered(request, found, timeout_ms, plain)
        headers = _answer_headers(found)
        if min_offset is not None:
            refused = await asyncio.to_thread(node.judge.rejection_at, found.partition,
                                              min_offset)
            if refused is not None:
                headers["Effectlog-Rejected"] = refused
        if found.snapshot is None:
            return _error(404, f"no effect with key {key}", headers)
        return _json(200, found.snapshot, headers)

    async def _unanswered(self, request: web.Request, found: Unanswered,
                          timeout_ms: int, plain: bool) -> web.Response:
        partition = found.partition
        if not found.here:
            return await self._forward(request, partition, timeout_ms / 1000 + 5, plain)
        headers = {"Effectlog-Partition": str(partition), "Effectlog-Served-By": self.node.url}
        if found.late:
            return _error(504, f"{found.reason} within {timeout_ms} ms", headers)
        return _unavailable(found.reason, headers)

    async def _forward(self, request: web.Request, partition: int, timeout_s: float,
                       plain: bool) -> web.Response:
        """Relay to the partition's owner; when it is unknown or does not answer, a
        ``plain`` read is answered by a standby copy at once (marked stale), anything else
        after the membership is read again, or 503 while the group moves the partition."""
        node = self.node
        if FORWARDED in request.headers:  # the asker's view of the group is stale
            return _unavailable(f"partition {partition} is not served by {node.url}",
                                {"Effectlog-Partition": str(partition), NOT_OWNER: "1"})
        for attempt in range(2):
            owner = node.membership.owners().get(partition)
            if owner is not None and owner != node.url:
                reply = await self.forwarder.ask(owner, request.rel_url.raw_path_qs, timeout_s)
                if reply is not None and NOT_OWNER not in reply.headers:
                    return web.Response(status=reply.status, body=reply.body,
                                        headers=reply.headers)
            if attempt == 0 and plain:
                stale = await self._from_standbys(request, partition, owner)
                if stale is not None:
                    return stale
            if attempt == 0:
                await asyncio.to_thread(node.membership.refresh)
                if node.judge.holds(partition):  # assigned here meanwhile
                    return await self.effect(request)
        return _unavailable(f"partition {partition} has no reachable owner (the group is "
                            "rebalancing)", {"Effectlog-Partition": str(partition)})

    async def _standby_here(self, key: str) -> web.Response:
        """A forwarded read for this node's standby copy of the key's partition."""
        read = await asyncio.to_thread(self.node.standby_copies.read, key)
        if read is None:
            return _unavailable(f"no standby copy of {key}'s partition on {self.node.url}",
                                {NOT_OWNER: "1"})
        if read.snapshot is None:
            return _error(404, f"no effect with key {key}", read.headers())
        return _json(200, read.snapshot, read.headers())

    async def _from_standbys(self, request: web.Request, partition: int,
                             owner: str | None) -> web.Response | None:
        """The read answered by a standby copy of ``partition``: this node's, else the first
        other member's that has one (the owner excepted); None when none answers."""
        node = self.node
        if node.standby_copies.holds(partition):
            return await self._standby_here(request.match_info["key"])
        path = request.rel_url.update_query({STANDBY: "1"}).raw_path_qs
        for member in node.membership.members():
            if member in (node.url, owner):
                continue
            reply = await self.forwarder.ask(member, path, STANDBY_ASK_S)
            if reply is not None and STALE in reply.headers:
                return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        return None

    # -- the whole group -----------------------------------------------------------------

    async def effects(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            state = query.get("state")
            if state is not None and state.upper() not in STATES:
                raise InvalidInput(f"state must be one of {', '.join(STATES)}")
            limit = _int(query, "limit", 1, MAX_LIMIT) or 100
            before = _int(query, "before_ms", 0, 2**63 - 1)
            if before is None and query.get("older_than") is not None:
                from effectlog.durations import parse_duration_ms

                before = int(time.time() * 1000) - parse_duration_ms(query["older_than"])
            after = parse_cursor(query["after"]) if query.get("after") else None
            filters = Filters(query.get("kind") or None, query.get("target") or None,
                              query.get("key") or None)
        except InvalidInput as exc:
            return _error(400, str(exc))
        states = [state.upper()] if state else list(STATES)
        page, covered = await asyncio.to_thread(self.node.list_local, states, before, limit,
                                                after, filters)
        if not self._local(request):
            params = {"limit": limit, "local": 1, "state": states[0] if state else None,
                      "before_ms": before, "kind": filters.kind, "target": filters.target,
                      "key": filters.key,
                      "after": None if after is None else format_cursor(after)}
            qs = urlencode({k: v for k, v in params.items() if v is not None})
            pages = [page]
            for reply in await self._ask_others("/v1/effects?" + qs):
                pages.append(page_of(json.loads(reply.body), reply.headers.get(NEXT)))
                covered.update(_partitions(reply.headers))
            missing = sorted(set(range(self.node.partition_count)) - covered)
            if missing:
                return _unavailable(f"partitions {_ranges(missing)} are not being served "
                                    "(restoring or rebalancing)")
            page = merge_pages(pages, limit)
        headers = {"Effectlog-Partitions": _list(covered)}
        if page.next is not None:
            headers[NEXT] = format_cursor(page.next)
        return _json(200, page.items, headers)

    async def stats(self, request: web.Request) -> web.Response:
        node = self.node
        counts, positions = await asyncio.to_thread(node.stats_local)
        if self._local(request):
            return _json(200, {"counts": counts, "positions": {str(p): n for p, n in
                                                               positions.items()}},
                         {"Effectlog-Partitions": _list(positions),
                          "Effectlog-Served-By": node.url})
        members = {node.url: sorted(positions)}
        for reply in await self._ask_others("/v1/stats?local=1"):
            theirs = json.loads(reply.body)
            for label, n in theirs["counts"].items():
                counts[label] = counts.get(label, 0) + n
            mine = {int(p): n for p, n in theirs["positions"].items()}
            positions.update(mine)
            members[reply.headers.get("Effectlog-Served-By", "?")] = sorted(mine)
        try:
            ends = await asyncio.to_thread(node.end_offsets)
        except EffectlogError as exc:
            return _unavailable(f"cannot read the log's end offsets: {exc}")
        figures = stats_figures(counts, positions, ends, node.url,
                                redact_url(node.log_url))
        figures["members"] = members
        figures["unserved"] = sorted(set(range(node.partition_count)) - set(positions))
        return _json(200, figures)

    def _local(self, request: web.Request) -> bool:
        return _flag(request.query, "local") or FORWARDED in request.headers

    async def _ask_others(self, path_qs: str) -> list[Any]:
        others = [m for m in self.node.membership.members() if m != self.node.url]
        replies = await asyncio.gather(*(self.forwarder.ask(m, path_qs) for m in others))
        return [r for r in replies if r is not None and r.status == 200]

    # -- operations ----------------------------------------------------------------------

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text, refreshed first when the log answers within ``/healthz``'s bound;
        else the last figures (a scrape never hangs on a broker outage). Scrapes arriving
        while a refresh is under way share it."""
        if self._refreshing is None or self._refreshing.done():
            refreshing = asyncio.ensure_future(asyncio.to_thread(self.node.refresh_metrics))
            refreshing.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._refreshing = refreshing
        wait_s = self.node.health_wait_s
        try:
            await asyncio.wait_for(asyncio.shield(self._refreshing), wait_s)
        except TimeoutError:
            logger.warning("metrics: the log did not answer within %gs; the last figures", wait_s)
        except EffectlogError as exc:
            logger.warning("metrics refresh failed: %s", exc)
        return web.Response(body=self.node.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def health(self, request: web.Request) -> web.Response:
        alive, details = await self.health_check()
        return _json(200 if alive else 503, {"ok": alive, **details})

    async def ready(self, request: web.Request) -> web.Response:
        ready, details = self.node.readiness()
        return _json(200 if ready else 503, {"ready": ready, "url": self.node.url, **details})


def _answer_headers(answer: Answer) -> dict[str, str]:
    """The headers that say where an answer about a key comes from and how far it reaches."""
    premises = answer.premises
    return {"Effectlog-Partition": str(answer.partition),
            "Effectlog-Applied-Offset": str(answer.applied),
            "Effectlog-Served-By": premises.served_by,
            "Effectlog-Topic-Id": premises.topic_id or "",
            "Effectlog-Generation": premises.generation}


def _partitions(headers: Mapping[str, str]) -> set[int]:
    text = headers.get("Effectlog-Partitions", "")
    return {int(p) for p in text.split(",") if p.strip().isdigit()}


def _list(partitions: Mapping[int, object] | set[int]) -> str:
    return ",".join(str(p) for p in sorted(partitions))


def _ranges(partitions: list[int]) -> str:
    return ", ".join(str(p) for p in partitions)

