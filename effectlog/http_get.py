"""Keep-alive requests for the query API client: one connection per thread and server,
answers parsed by httptools (the C parser of llhttp). GETs, and POSTs of queries (the judge's
``POST /v1/judge`` only reads, so it is as safe to send again as a GET).

A worker reads state once or twice per effect, so the client's own cost counts: urllib3's
URL parsing and pool bookkeeping took about half of a worker's CPU per ``perform``, and
``http.client`` then spent most of what was left parsing headers through the ``email``
package. This keeps what the worker needs: connections kept alive per thread (no pool lock),
a connection the server closed while idle replaced before use, one retry of a GET that met a
connection closed under it, and separate connect and read timeouts.
"""

from __future__ import annotations

import http.client
import re
import select
import socket
import ssl
import threading
import weakref
from collections.abc import Callable
from urllib.parse import urlsplit

import httptools

#: A reused connection that fails like this was closed by the server while idle: the GET is
#: sent again once on a new connection (it is idempotent).
_CLOSED_UNDER_US = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
_NOT_IN_A_TARGET = re.compile(rb"[\x00-\x20\x7f]")  # controls and spaces
_READ_SIZE = 65536

Answer = tuple[int, bytes, dict[str, str]]


class KeepAliveGets:
    """``get(server, target, ...)``: status, body and headers (names in title case).

    Raises ``OSError`` or ``http.client.HTTPException`` when the server does not answer.
    """

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._lock = threading.Lock()

    def get(self, server: str, target: str, *, connect_timeout_s: float,
            read_timeout_s: float, during: Callable[[], None] | None = None) -> Answer:
        """``during`` is called once the request is sent, before its answer is read (it must
        not raise)."""
        return self.request(server, target, None, connect_timeout_s=connect_timeout_s,
                            read_timeout_s=read_timeout_s, during=during)

    def post(self, server: str, target: str, body: bytes, *, connect_timeout_s: float,
             read_timeout_s: float) -> Answer:
        """POST ``body`` (JSON) to ``target`` of ``server``."""
        return self.request(server, target, body, connect_timeout_s=connect_timeout_s,
                            read_timeout_s=read_timeout_s)

    def request(self, server: str, target: str, body: bytes | None, *,
                connect_timeout_s: float, read_timeout_s: float,
                during: Callable[[], None] | None = None) -> Answer:
        """A GET (``body`` None) or a POST of JSON ``body``."""
        mine: dict[str, _Connection] = self._local.__dict__.setdefault("by", {})
        conn = mine.get(server)
        reused = conn is not None and conn.sock is not None and not conn.closed_by_peer()
        if conn is None or not reused:
            if conn is not None:
                conn.close()
            conn = mine[server] = self._new(server)
        try:
            return conn.exchange(target, body, connect_timeout_s, read_timeout_s, during)
        except _CLOSED_UNDER_US:
            conn.close()
            if not reused:
                raise
            return conn.exchange(target, body, connect_timeout_s, read_timeout_s, during)
        except BaseException:
            conn.close()  # a half-read answer must not be read as the next one's
            raise

    def close(self) -> None:
        with self._lock:
            conns = list(self._all)
        for conn in conns:
            conn.close()

    def _new(self, server: str) -> _Connection:
        parts = urlsplit(server)
        if parts.hostname is None:
            raise http.client.InvalidURL(f"no host in {server!r}")
        tls = parts.scheme == "https"
        conn = _Connection(parts.hostname, parts.port or (443 if tls else 80), tls)
        with self._lock:
            self._all.add(conn)
        return conn


class _Answer:
    """The parser's callbacks: collects one answer's headers and body."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.chunks: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_headers_complete(self) -> None:
        # asked here: once the message is complete the parser no longer tells
        self.keep_alive = self.parser.should_keep_alive()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").title()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    """One HTTP/1.1 connection to one server, opened on first use and after a close."""

    def __init__(self, host: str, port: int, tls: bool) -> None:
        self.host, self.port, self.tls = host, port, tls
        self.sock: socket.socket | None = None
        self._host_header = (host if port in (80, 443) else f"{host}:{port}").encode("idna")

    def closed_by_peer(self) -> bool:
        """An idle keep-alive socket that is readable was closed (or spoken on) by the
        server."""
        if self.sock is None:
            return True
        try:
            return bool(select.select([self.sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def exchange(self, target: str, body: bytes | None, connect_timeout_s: float,
                 read_timeout_s: float, during: Callable[[], None] | None) -> Answer:
        request_target = target.encode("ascii", "replace")  # "?" is then refused below
        if (not request_target.startswith(b"/") or not target.isascii()
                or _NOT_IN_A_TARGET.search(request_target)):
            raise http.client.InvalidURL(f"not a request target: {target!r}")
        sock = self.sock if self.sock is not None else self._connect(connect_timeout_s)
        sock.settimeout(read_timeout_s)
        if body is None:
            sock.sendall(b"GET " + request_target + b" HTTP/1.1\r\nHost: " + self._host_header
                         + b"\r\nAccept-Encoding: identity\r\n\r\n")
        else:
            sock.sendall(b"POST " + request_target + b" HTTP/1.1\r\nHost: " + self._host_header
                         + b"\r\nAccept-Encoding: identity\r\nContent-Type: application/json"
                         + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        if during is not None:
            during()
        answer = _Answer()
        parser = answer.parser
        received = False
        while not answer.complete:
            data = sock.recv(_READ_SIZE)
            if not data:
                if not received:
                    raise http.client.RemoteDisconnected("the server closed the connection "
                                                         "without answering")
                raise http.client.IncompleteRead(b"".join(answer.chunks))
            received = True
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                raise http.client.HTTPException(f"malformed answer: {exc}") from None
        status = parser.get_status_code()
        if not answer.keep_alive:
            self.close()
        return status, b"".join(answer.chunks), answer.headers

    def close(self) -> None:
        sock, self.sock = self.sock, None
        if sock is not None:
            sock.close()

    def _connect(self, timeout_s: float) -> socket.socket:
        sock = socket.create_connection((self.host, self.port), timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls:
            sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self.host)
        self.sock = sock
        return sock
