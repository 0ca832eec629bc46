"""The query API of ``effectlog serve`` as a client: state by key, lists and stats over HTTP.

Tools (``effectlog get|list|stats --server URL``) read state through a node of the
projection cluster instead of a local RocksDB. :class:`StateClient` takes several server URLs
and fails over: a member that does not answer is skipped, a 503 (partition restoring or
moving) is retried after its ``Retry-After`` until ``retry_for_s`` has passed. Workers ask the
cluster's judge instead (:mod:`effectlog.judge.client`).
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.http_get import KeepAliveGets
from effectlog.judge.client import server_list

Snapshots = list[dict[str, Any]]  # ``list --json``: snapshots, oldest first
#: How long a recovery pass on every member may take (each member's own is bounded below it).
RECOVER_WAIT_S = 70.0


class KeyState(NamedTuple):
    """One key as its partition's owner answered: the snapshot (``get --json``'s JSON, or
    None for an unknown key), the partition, the offset below which everything of the
    partition is applied, the rejection reason of the event at ``min_offset`` (if asked and
    refused), and the member that answered."""

    snapshot: dict[str, Any] | None
    partition: int
    applied_offset: int | None
    rejected: str | None
    served_by: str
    #: None from the owner; from a standby copy (the partition had no reachable owner):
    #: how many records that copy was behind the log's end
    stale_lag: int | None = None


class StateClient:
    """Reads effect state from a group of serve instances (any member answers any key)."""

    def __init__(self, servers: str | Sequence[str], *, timeout_s: float = 10.0,
                 retry_for_s: float = 10.0,
                 on_wait: Callable[[str], None] | None = None) -> None:
        """``on_wait`` is told, once per call, what a call waits for when it has to wait
        (a 503: a partition restoring or moving) before it retries."""
        self.servers = server_list(servers)
        self.on_wait = on_wait
        self.timeout_s = timeout_s
        self.retry_for_s = retry_for_s
        self._http = KeepAliveGets()
        self._prefix = [urlsplit(server).path for server in self.servers]  # behind a proxy path
        self._preferred = 0

    def get(self, key: str, *, fresh: bool = False, min_offset: int | None = None,
            timeout_ms: int | None = None, during: Callable[[], None] | None = None) -> KeyState:
        """The key's state. ``min_offset``: once its partition applied that offset (the
        caller's own append); ``fresh``: once it applied what the log held at the call.
        ``during`` is called while a request is in flight (each attempt's; it must not
        raise, and should do its work once)."""
        params: dict[str, str] = {}
        if fresh:
            params["fresh"] = "1"
        if min_offset is not None:
            params["min_offset"] = str(min_offset)
        if timeout_ms is not None:
            params["timeout_ms"] = str(timeout_ms)
        wait_s = (timeout_ms or 5000) / 1000 if (fresh or min_offset is not None) else 0.0
        status, body, headers = self._request(f"/v1/effects/{quote(key, safe='')}", params,
                                              wait_s, during)
        snapshot = json.loads(body) if status == 200 else None
        applied = headers.get("Effectlog-Applied-Offset")
        lag = headers.get("Effectlog-Lag") if headers.get("Effectlog-Stale") == "1" else None
        return KeyState(snapshot, int(headers.get("Effectlog-Partition", -1)),
                        None if applied is None else int(applied),
                        headers.get("Effectlog-Rejected"), headers.get("Effectlog-Served-By", ""),
                        None if lag is None else int(lag))

    def list(self, state: str | None = None, older_than: str | None = None,
             limit: int = 100) -> list[dict[str, Any]]:
        """Snapshots by state and age over the whole group, oldest first."""
        return self.list_page(state, older_than, limit)[0]

    def list_page(self, state: str | None = None, older_than: str | None = None,
                  limit: int = 100, after: str | None = None) -> tuple[Snapshots, str | None]:
        """One page of :meth:`list` past the cursor ``after``, and the cursor of the next
        page (None when the list ends here)."""
        params = {"limit": str(limit)}
        if state is not None:
            params["state"] = state
        if older_than is not None:
            params["older_than"] = older_than
        if after is not None:
            params["after"] = after
        _, body, headers = self._request("/v1/effects", params)
        found: Snapshots = json.loads(body)
        return found, headers.get("Effectlog-Next") or None

    def stats(self) -> dict[str, Any]:
        """``effectlog stats --json``'s figures over the whole group."""
        _, body, _ = self._request("/v1/stats", {})
        figures: dict[str, Any] = json.loads(body)
        return figures

    def recover(self, deadlines: Mapping[str, Any]) -> dict[str, Any]:
        """One recovery pass now on every member, each over the partitions it serves
        (``POST /v1/recover``): the commands issued and ``uncovered``, partition -> why no
        pass covered it."""
        _, body, _ = self._request("/v1/recover", {}, RECOVER_WAIT_S,
                                   body=json.dumps(deadlines).encode())
        report: dict[str, Any] = json.loads(body)
        return report

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> StateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -----------------------------------------------------------------------

    def _request(self, path: str, params: Mapping[str, str] | Sequence[tuple[str, str]],
                 wait_s: float = 0.0, during: Callable[[], None] | None = None, *,
                 body: bytes | None = None) -> tuple[int, bytes, dict[str, str]]:
        """GET ``path`` (POST ``body``) from the first member that answers it; 200 and 404
        are answers."""
        query = f"?{urlencode(params)}" if params else ""
        deadline = time.monotonic() + self.retry_for_s + wait_s
        problems: list[str] = []
        told = False
        while True:
            retry_after = None
            for step in range(len(self.servers)):
                index = (self._preferred + step) % len(self.servers)
                server = self.servers[index]
                try:
                    status, answer, headers = self._http.request(
                        server, self._prefix[index] + path + query, body,
                        connect_timeout_s=min(2.0, self.timeout_s),
                        read_timeout_s=self.timeout_s + wait_s, during=during)
                except (OSError, http.client.HTTPException) as exc:
                    problems.append(f"{server}: {type(exc).__name__}")
                    continue
                if status in (200, 404):
                    self._preferred = index
                    return status, answer, headers
                message = _message(answer) or f"HTTP {status}"
                if status == 400:
                    raise InvalidInput(message)
                if status == 504:
                    raise BackendUnavailable(f"{server}: {message}")
                problems.append(f"{server}: {message}")
                if status == 503:
                    retry_after = min(float(headers.get("Retry-After", "1") or 1), 5.0)
            left = deadline - time.monotonic()
            if retry_after is None or left <= 0:
                raise BackendUnavailable("no server answered: " + "; ".join(problems[-3:]))
            if self.on_wait is not None and not told:
                told = True
                self.on_wait(f"waiting up to {left:.0f}s: {problems[-1]}")
            time.sleep(min(retry_after, left))


def _message(body: bytes) -> str | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return str(value["error"]) if isinstance(value, dict) and "error" in value else None
