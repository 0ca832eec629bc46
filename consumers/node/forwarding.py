"""Finding a partition's owner and asking it: group membership and request forwarding.

:class:`Membership` says which member URL serves each partition; on Kafka it is read from
the consumer group (each member advertises its URL as its client id), alone it is this
node. :class:`Forwarder` relays a request to another member over one pooled aiohttp
session; a forwarded request carries ``Effectlog-Forwarded`` and is never forwarded again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from aiohttp import ClientError, ClientSession, ClientTimeout, TCPConnector
from yarl import URL

logger = logging.getLogger(__name__)

FORWARDED = "Effectlog-Forwarded"
NOT_OWNER = "Effectlog-Not-Owner"  # on a forwarded request's 503: the asker's map is stale
NEXT = "Effectlog-Next"  # on a list: the cursor of the next page
#: Response headers relayed from the owner (besides the body and status).
RELAYED = ("Content-Type", "Retry-After", "Effectlog-Partition", "Effectlog-Applied-Offset",
           "Effectlog-Rejected", "Effectlog-Served-By", "Effectlog-Partitions",
           "Effectlog-Topic-Id", "Effectlog-Generation", NOT_OWNER, NEXT, "Effectlog-Stale",
           "Effectlog-Lag")


class Membership(Protocol):
    """Who serves which partition, as far as this node knows."""

    def owners(self) -> Mapping[int, str]:
        """Partition -> URL of the member it is assigned to (cached)."""
        ...

    def members(self) -> list[str]:
        """URLs of every member (this node included)."""
        ...

    def refresh(self) -> None:
        """Read the membership again (blocking; call it off the event loop)."""
        ...


class SoloMembership:
    """A node alone (no consumer group): it owns every partition."""

    def __init__(self, url: str, partitions: int) -> None:
        self.url = url
        self._owners = dict.fromkeys(range(partitions), url)

    def owners(self) -> Mapping[int, str]:
        return self._owners

    def members(self) -> list[str]:
        return [self.url]

    def refresh(self) -> None:
        return None


class Reply:
    """A member's answer: status, body and the relayed headers."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = headers


class Forwarder:
    """Relays requests to other members; created and closed on the server's event loop."""

    def __init__(self, self_url: str, timeout_s: float = 30.0) -> None:
        self.self_url = self_url
        self.timeout_s = timeout_s
        self._session: ClientSession | None = None

    def _client(self) -> ClientSession:
        if self._session is None or self._session.closed:
            self._session = ClientSession(connector=TCPConnector(limit=64),
                                          timeout=ClientTimeout(total=self.timeout_s))
        return self._session

    async def ask(self, member: str, path_qs: str, timeout_s: float | None = None) -> Reply | None:
        """GET ``path_qs`` from ``member``; None when it cannot be reached."""
        timeout = ClientTimeout(total=timeout_s or self.timeout_s)
        url = URL(member.rstrip("/") + path_qs, encoded=True)
        try:
            async with self._client().get(url, timeout=timeout,
                                          headers={FORWARDED: self.self_url}) as response:
                body = await response.read()
                headers = {name: response.headers[name] for name in RELAYED
                           if name in response.headers}
                return Reply(response.status, body, headers)
        except (ClientError, TimeoutError, OSError) as exc:
            logger.info("member %s did not answer %s: %s", member, path_qs, exc)
            return None

    async def post(self, member: str, path: str, body: bytes,
                   timeout_s: float | None = None) -> Reply | None:
        """POST ``body`` (JSON) to ``path`` of ``member``; None when it cannot be reached."""
        timeout = ClientTimeout(total=timeout_s or self.timeout_s)
        url = URL(member.rstrip("/") + path, encoded=True)
        try:
            async with self._client().post(url, data=body, timeout=timeout, headers={
                    FORWARDED: self.self_url, "Content-Type": "application/json"}) as response:
                return Reply(response.status, await response.read(),
                             {name: response.headers[name] for name in RELAYED
                              if name in response.headers})
        except (ClientError, TimeoutError, OSError) as exc:
            logger.info("member %s did not answer %s: %s", member, path, exc)
            return None

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
