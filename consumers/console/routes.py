"""The console's pages on the node's aiohttp application (``build_app(node, extra=...)``).

``GET /``                   counts and lag, then the effects awaiting approval and UNKNOWN
``GET /effects?state=S``    one state's list, oldest first, cursor-paged, filtered by
                            kind (prefix), target (substring) and age (``older_than``)
``GET /effects/{key}``      the key's state, its timeline from the log, what happens next
``POST /effects/{key}``     retry or abandon (session + CSRF + same origin), recorded under
                            the logged-in person's name
``GET /search?q=Q``, ``GET /runs/{run}``  finding effects (:mod:`consumers.console.search`)
``GET|POST /login``, ``POST /logout``, ``GET /go?key=K``, ``/static/*``

Lists, stats and key states come from the node's query API (which forwards and merges
over the group); timelines and decisions from the console's own log handle.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from aiohttp import web

from consumers.console.api import Answer, ApiClient
from consumers.console.auth import COOKIE, CSRF_FIELD, ConsoleAuth, WriteRefused, is_loopback
from consumers.console.log_access import ConsoleLog
from consumers.console.pages import (
    IN_DOUBT,
    STATE_ORDER,
    environment,
    header,
    key_path,
    list_url,
    next_step,
    payload_text,
    run_of,
)
from consumers.console.search import SearchPages
from consumers.console.users import Users
from consumers.node.http_api import NODE_KEY, RouteHook
from consumers.recovery import RecoverySettings
from effectlog.errors import (
    BackendUnavailable,
    Conflict,
    EffectlogError,
    InvalidInput,
    NotFound,
)
from effectlog.keys import validate_key
from projections.paging import SCAN_BUDGET, parse_cursor

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OVERVIEW_ROWS = 20
MAX_PAGE = 500
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; connect-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """Who may decide: ``users`` (named people, a users file; wins over ``token``) or one
    shared ``token``; neither: read-only. ``reconciles``/``recovery``: whether this serve
    runs a reconciler and its recovery deadlines, for "what happens next". ``refresh_ms``:
    how often pages refresh."""

    token: str | None = None
    users: Users | None = None
    reconciles: bool = False
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    page_size: int = 50
    refresh_ms: int = 2000


def console_routes(settings: ConsoleSettings) -> RouteHook:
    """The hook that adds the console to a node's application."""
    def install(app: web.Application) -> None:
        _Console(app, settings).install(app)
    return install


class _Console:
    def __init__(self, app: web.Application, settings: ConsoleSettings) -> None:
        node = app[NODE_KEY]
        self.node = node
        self.settings = settings
        self.api = ApiClient(node.url)
        self.log = ConsoleLog(node.log_url, node.url)
        self.auth = ConsoleAuth(settings.token, loopback_only=is_loopback(node.http_host),
                                users=settings.users)
        self.env = environment()
        self.search = SearchPages(self.api, self._render)

    def install(self, app: web.Application) -> None:
        add = app.router.add_route
        add("GET", "/", self._guard(self.overview))
        add("GET", "/effects", self._guard(self.effects))
        add("GET", "/effects/{key:.+}", self._guard(self.effect))
        add("POST", "/effects/{key:.+}", self._guard(self.decide))
        add("GET", "/go", self._guard(self.go))
        add("GET", "/search", self._guard(self.search.search))
        add("GET", "/runs/{run:.+}", self._guard(self.search.run))
        add("GET", "/login", self._guard(self.login_form))
        add("POST", "/login", self._guard(self.login))
        add("POST", "/logout", self._guard(self.logout))
        static = resources.files("consumers.console") / "static"
        app.router.add_static("/static/", str(static), append_version=False)
        app.on_cleanup.append(self._close)

    async def _close(self, app: web.Application) -> None:
        await self.api.close()
        await asyncio.to_thread(self.log.close)

    # -- rendering -----------------------------------------------------------------------

    def _guard(self, handler: Handler) -> Handler:
        """Host check, security headers, and one page for any error a handler raises."""
        async def guarded(request: web.Request) -> web.StreamResponse:
            if not self.auth.host_allowed(request):
                return web.Response(status=421, text="this console answers only on a "
                                                     "loopback host name\n")
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # redirects: raised, as aiohttp wants them
                exc.headers.update(SECURITY_HEADERS)
                raise
            except EffectlogError as exc:
                response = await self._problem(request, _status(exc), str(exc))
            response.headers.update(SECURITY_HEADERS)
            return response
        return guarded

    async def _render(self, request: web.Request, template: str, status: int = 200,
                      stats: Answer | None = None, current_state: str | None = None,
                      **context: Any) -> web.Response:
        if stats is None:
            stats = await self.api.stats()
        nonce, user = self.auth.session(request), self.auth.user(request)
        page = self.env.get_template(template).render(
            summary=header(stats.body if stats.status == 200 else None),
            auth={"writable": self.auth.writable, "session": nonce is not None,
                  "csrf": "" if nonce is None else self.auth.csrf(nonce),
                  "named": self.auth.named, "user": user or ""},
            request_path=request.path_qs, node_url=self.node.url,
            refresh_ms=self.settings.refresh_ms, now_ms=int(time.time() * 1000),
            current_state=current_state, **context)
        return web.Response(status=status, text=page, content_type="text/html")

    async def _problem(self, request: web.Request, status: int, message: str) -> web.Response:
        titles = {400: "Bad request", 403: "Refused", 404: "Not found", 409: "Conflict",
                  503: "Unavailable"}
        return await self._render(request, "error.html", status, code=status,
                                  title=titles.get(status, "Error"), message=message)

    # -- reading -------------------------------------------------------------------------

    async def overview(self, request: web.Request) -> web.Response:
        stats, *lists = await asyncio.gather(
            self.api.stats(), *(self.api.effects(s, limit=OVERVIEW_ROWS) for s in IN_DOUBT))
        counts = stats.body.get("states", {}) if stats.status == 200 else {}
        titles = {"AWAITING_APPROVAL": "Awaiting approval", "UNKNOWN": "Unknown"}
        sections = [{"state": state, "title": titles[state], "count": counts.get(state, 0),
                     "effects": answer.body if answer.status == 200 else [],
                     "error": None if answer.status == 200 else answer.error,
                     "more": answer.status == 200 and answer.next is not None}
                    for state, answer in zip(IN_DOUBT, lists, strict=True)]
        return await self._render(request, "overview.html", stats=stats, sections=sections)

    async def effects(self, request: web.Request) -> web.Response:
        query = request.query
        state = query.get("state", "UNKNOWN").upper()
        if state not in STATE_ORDER:
            raise InvalidInput(f"state must be one of {', '.join(STATE_ORDER)}")
        limit = _page_size(query.get("limit"), self.settings.page_size)
        filters = {name: query.get(name, "").strip() or None
                   for name in ("key", "kind", "target", "older_than")}
        after = query.get("after") or None
        after_at = parse_cursor(after)[0] if after else None
        page, stats = await asyncio.gather(
            self.api.effects(state, limit=limit, after=after, **filters), self.api.stats())
        next_url = None
        if page.status == 200 and page.next:
            next_url = list_url(state, limit=str(limit), after=page.next, **filters)
        status = page.status if page.status in (400, 503) else 200
        return await self._render(
            request, "list.html", status, stats=stats,
            current_state=state, state=state, states=STATE_ORDER, limit=limit,
            filters={k: v or "" for k, v in filters.items()}, after=after, after_at=after_at,
            items=page.body if page.status == 200 else [],
            error=None if page.status == 200 else page.error, next_url=next_url,
            first_url=list_url(state, limit=str(limit), **filters), budget=SCAN_BUDGET,
            stopped_short=page.status == 200 and page.next is not None
            and len(page.body) < limit)

    async def effect(self, request: web.Request, *, status: int = 200,
                     form_error: str | None = None,
                     form: dict[str, str] | None = None) -> web.Response:
        key = validate_key(request.match_info["key"])
        answer, history = await asyncio.gather(self.api.effect(key), self._history(key))
        rows, history_error = history
        if answer.status == 404 and not rows and history_error is None:
            raise NotFound(f"no effect with key {key}")
        snapshot = answer.body if answer.status == 200 else None
        recorded = request.query.get("recorded")
        decided = [r for r in rows if recorded and r.get("event", {}).get("event_id") == recorded]
        notice = None
        if decided and decided[0]["event"].get("approval"):
            event = decided[0]["event"]
            notice = (f"Decision recorded: {event['approval']['decision']} by "
                      f"{event['approval']['by']} -> {event['state']} "
                      f"(epoch {event['fencing_epoch']})")
        create = next((r["event"] for r in rows if r.get("event", {}).get("transition")
                       == "CREATE"), None)
        after = None if snapshot is None else next_step(
            snapshot, reconciles=self.settings.reconciles,
            deadline_s=self.settings.recovery.deadline_s(str(snapshot["kind"])),
            poll_s=self.settings.recovery.poll_s, now_ms=int(time.time() * 1000))
        return await self._render(
            request, "effect.html", status, key=key, e=snapshot, next_step=after,
            run=None if snapshot is None else run_of(str(snapshot["operation_id"])),
            snapshot_error=None if answer.status in (200, 404) else answer.error,
            rows=rows, history_error=history_error, recorded=recorded, notice=notice,
            payload=None if create is None else payload_text(create),
            form_error=form_error, form=form or {"by": "", "reason": ""})

    async def _history(self, key: str) -> tuple[list[dict[str, Any]], str | None]:
        try:
            return await asyncio.to_thread(self.log.history, key), None
        except EffectlogError as exc:
            return [], f"the log could not be read: {exc}"

    async def go(self, request: web.Request) -> web.Response:
        key = validate_key(request.query.get("key", "").strip())
        raise web.HTTPSeeOther(key_path(key))

    # -- writing -------------------------------------------------------------------------

    async def decide(self, request: web.Request) -> web.Response:
        key = validate_key(request.match_info["key"])
        form = await request.post()
        fields = {name: str(form.get(name, "")) for name in ("decision", "by", "reason")}
        try:
            self.auth.check_write(request, {CSRF_FIELD: str(form.get(CSRF_FIELD, ""))})
        except WriteRefused as exc:
            return await self._problem(request, 403, str(exc))
        if self.auth.named:  # recorded under the logged-in name, whatever the form says
            fields["by"] = self.auth.user(request) or ""
        kept = {"by": fields["by"], "reason": fields["reason"]}
        try:
            seen_epoch = _seen_epoch(str(form.get("epoch", "")))
            event = await asyncio.to_thread(self.log.decide, key, fields["decision"],
                                            fields["by"], fields["reason"], seen_epoch)
        except (InvalidInput, Conflict) as exc:
            return await self.effect(request, status=_status(exc), form_error=str(exc),
                                     form=kept)
        raise web.HTTPSeeOther(f"{key_path(key)}?recorded={event.event_id}")

    async def login_form(self, request: web.Request) -> web.Response:
        return await self._render(request, "login.html", next=_local_path(request.query),
                                  error=None)

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        target = _local_path(form)
        try:
            self.auth.check_same_origin(request)
            if not self.auth.writable:
                raise WriteRefused("this console is read-only: nobody can log in")
            name = str(form.get("name", "")).strip()
            who = self.auth.log_in(name, str(form.get("password") or form.get("token") or ""))
            if who is None:
                raise WriteRefused("wrong name or password" if self.auth.named
                                   else "wrong console token")
        except WriteRefused as exc:
            return await self._render(request, "login.html", 403, next=target, error=str(exc))
        response = web.HTTPSeeOther(target)
        self.auth.set_cookie(response, request, who)
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        form = await request.post()
        try:
            self.auth.check_write(request, {CSRF_FIELD: str(form.get(CSRF_FIELD, ""))})
        except WriteRefused as exc:
            return await self._problem(request, 403, str(exc))
        response = web.HTTPSeeOther("/")
        response.del_cookie(COOKIE, path="/")
        raise response


def _seen_epoch(text: str) -> int:
    """The epoch of the state the decision form was shown for (required: a decision is
    about the state its page showed, never about whatever the key is when the form lands)."""
    if not text.strip().isdigit():
        raise InvalidInput("the decision form carries no epoch of the state it was made on: "
                           "reload the page and decide again")
    return int(text)


def _status(exc: EffectlogError) -> int:
    if isinstance(exc, InvalidInput):
        return 400
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    return 503 if isinstance(exc, BackendUnavailable) else 500


def _page_size(text: str | None, default: int) -> int:
    if not text:
        return default
    if not text.isdigit() or not 1 <= int(text) <= MAX_PAGE:
        raise InvalidInput(f"limit must be a number from 1 to {MAX_PAGE}")
    return int(text)


def _local_path(params: Any) -> str:
    """A ``next`` path that stays on this server (no scheme, no ``//host``)."""
    path = str(params.get("next", "") or "/")
    if not path.startswith("/") or path.startswith("//") or "\\" in path:
        return "/"
    return path
