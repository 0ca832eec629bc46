"""The console's way to the data: the node's own query API, asked over its local socket.

The query API already answers for the whole group (a key from its partition's owner,
lists and stats merged over every member, 503 while a partition restores), so the
console asks it instead of reading the projection a second way.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector
from yarl import URL

from consumers.node.forwarding import NEXT


class Answer(NamedTuple):
    """What the API said: status (0: it did not answer), JSON body, the next-page cursor."""

    status: int
    body: Any
    next: str | None = None

    @property
    def error(self) -> str:
        """The API's error message (or the HTTP status) of an answer that is not 200."""
        if isinstance(self.body, dict) and "error" in self.body:
            return str(self.body["error"])
        return "the query API did not answer" if self.status == 0 else f"HTTP {self.status}"


class ApiClient:
    """GETs from the query API at ``base_url``; opened and closed on the server's loop."""

    def __init__(self, base_url: str, timeout_s: float = 15.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._session: ClientSession | None = None

    async def stats(self) -> Answer:
        return await self._get("/v1/stats", {})

    async def effects(self, state: str | None, *, limit: int, after: str | None = None,
                      kind: str | None = None, target: str | None = None,
                      older_than: str | None = None, key: str | None = None) -> Answer:
        """One page of ``state`` (None: every state; oldest first); ``next`` is the following
        page's cursor. ``key`` is a key prefix, ``kind`` a prefix, ``target`` a substring."""
        params = {"state": state, "limit": str(limit), "after": after, "kind": kind,
                  "target": target, "older_than": older_than, "key": key}
        return await self._get("/v1/effects", {k: v for k, v in params.items() if v})

    async def effect(self, key: str, fresh_ms: int = 3000) -> Answer:
        """The key's snapshot once its partition has applied what the log holds now."""
        return await self._get(f"/v1/effects/{quote(key, safe='')}",
                               {"fresh": "1", "timeout_ms": str(fresh_ms)})

    async def _get(self, path: str, params: dict[str, str]) -> Answer:
        if self._session is None or self._session.closed:
            self._session = ClientSession(connector=TCPConnector(limit=32),
                                          timeout=ClientTimeout(total=self.timeout_s))
        url = self.base_url + path + (f"?{urlencode(params)}" if params else "")
        try:
            async with self._session.get(URL(url, encoded=True)) as response:
                data = await response.read()
                try:
                    body = json.loads(data)
                except ValueError:
                    body = None
                return Answer(response.status, body, response.headers.get(NEXT))
        except (ClientError, TimeoutError, OSError):
            return Answer(0, None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
