"""Keep-alive GETs for the query API client: one ``http.client`` connection per thread and
server.

A worker reads state once or twice per effect, so the client's own cost counts: urllib3's
URL parsing and pool bookkeeping took about half of a worker's CPU per ``perform``. This
keeps what the worker needs from it: connections kept alive per thread (no pool lock), a
connection the server closed while idle replaced before use, one retry of a GET that met a
connection closed under it, and separate connect and read timeouts.
"""

from __future__ import annotations

import http.client
import select
import threading
import weakref
from collections.abc import Callable
from urllib.parse import urlsplit

#: A reused connection that fails like this was closed by the server while idle: the GET is
#: sent again once on a new connection (it is idempotent).
_CLOSED_UNDER_US = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)

Answer = tuple[int, bytes, dict[str, str]]


class KeepAliveGets:
    """``get(server, target, ...)``: status, body and headers (names in title case).

    Raises ``OSError`` or ``http.client.HTTPException`` when the server does not answer.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: weakref.WeakSet[http.client.HTTPConnection] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self, server: str, target: str, *, connect_timeout_s: float,
            read_timeout_s: float, during: Callable[[], None] | None = None) -> Answer:
        """``during`` is called once the request is sent, before its answer is read (it must
        not raise)."""
        mine: dict[str, http.client.HTTPConnection] = self._local.__dict__.setdefault("by", {})
        conn = mine.get(server)
        reused = conn is not None and conn.sock is not None and not _closed_by_peer(conn)
        if conn is None or not reused:
            if conn is not None:
                conn.close()
            conn = mine[server] = self._new(server)
        try:
            return _exchange(conn, target, connect_timeout_s, read_timeout_s, during)
        except _CLOSED_UNDER_US:
            conn.close()
            if not reused:
                raise
            return _exchange(conn, target, connect_timeout_s, read_timeout_s, during)
        except BaseException:
            conn.close()  # a half-read answer must not be read as the next one's
            raise

    def close(self) -> None:
        with self._lock:
            conns = list(self._all)
        for conn in conns:
            conn.close()

    def _new(self, server: str) -> http.client.HTTPConnection:
        parts = urlsplit(server)
        if parts.hostname is None:
            raise http.client.InvalidURL(f"no host in {server!r}")
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname, parts.port)
        with self._lock:
            self._all.add(conn)
        return conn


def _closed_by_peer(conn: http.client.HTTPConnection) -> bool:
    """An idle keep-alive socket that is readable was closed (or spoken on) by the server."""
    try:
        return bool(select.select([conn.sock], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def _exchange(conn: http.client.HTTPConnection, target: str, connect_timeout_s: float,
              read_timeout_s: float, during: Callable[[], None] | None = None) -> Answer:
    if conn.sock is None:  # reconnects after a retry's close
        conn.timeout = connect_timeout_s
        conn.connect()
    conn.sock.settimeout(read_timeout_s)
    conn.request("GET", target)
    if during is not None:
        during()
    response = conn.getresponse()
    body = response.read()
    headers = {name.title(): value for name, value in response.getheaders()}
    return response.status, body, headers
