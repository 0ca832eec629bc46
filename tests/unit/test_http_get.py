"""Keep-alive GETs: connections are reused, a connection the server closed is replaced, a
server that is gone is an OSError (which the state client turns into trying the next one)."""

from __future__ import annotations

import http.client
import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from effectlog.http_get import KeepAliveGets


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    peers: list[tuple[str, int]] = []
    close_after_answer = False

    def do_GET(self) -> None:
        Handler.peers.append(self.client_address)
        body = self.path.encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.send_header("effectlog-partition", "3")
        self.end_headers()
        self.wfile.write(body)
        if Handler.close_after_answer:
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.peers, Handler.close_after_answer = [], False
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def get(gets: KeepAliveGets, server: str, target: str) -> tuple[int, bytes, dict[str, str]]:
    return gets.get(server, target, connect_timeout_s=2, read_timeout_s=5)


def test_one_connection_serves_a_thread_s_gets(server: str) -> None:
    gets = KeepAliveGets()
    answers = [get(gets, server, f"/v1/effects/k{i}?fresh=1") for i in range(5)]
    assert [a[:2] for a in answers] == [(200, f"/v1/effects/k{i}?fresh=1".encode()) for i in range(5)]
    assert answers[0][2]["Effectlog-Partition"] == "3"  # header names in title case
    assert len(set(Handler.peers)) == 1
    gets.close()


def test_a_connection_the_server_closed_is_replaced(server: str) -> None:
    gets = KeepAliveGets()
    Handler.close_after_answer = True
    for i in range(3):
        assert get(gets, server, f"/k{i}")[:2] == (200, f"/k{i}".encode())
    assert len(set(Handler.peers)) == 3
    gets.close()


def test_threads_do_not_share_connections(server: str) -> None:
    gets = KeepAliveGets()
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(get(gets, server, "/x")[0]))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert results == [200] * 4 and len(set(Handler.peers)) == 4
    gets.close()


def test_a_server_that_is_gone_is_an_os_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gets = KeepAliveGets()
    with pytest.raises(OSError):
        get(gets, f"http://127.0.0.1:{port}", "/x")


def test_during_runs_while_the_request_is_in_flight(server: str) -> None:
    """``during`` is called after the request went out and before its answer is read: the
    server has the request by then (a worker's ListOffsets overlaps its read this way)."""
    gets = KeepAliveGets()
    seen_by_server: list[int] = []

    def during() -> None:
        deadline = threading.Event()
        for _ in range(100):  # the server takes the request on its own thread
            if Handler.peers:
                break
            deadline.wait(0.02)
        seen_by_server.append(len(Handler.peers))

    status, body, _ = gets.get(server, "/v1/effects/k?min_offset=0", connect_timeout_s=2,
                               read_timeout_s=5, during=during)
    assert (status, body) == (200, b"/v1/effects/k?min_offset=0")
    assert seen_by_server == [1]
    gets.close()


class RawServer:
    """Answers each connection's requests with canned bytes, to show what the parser makes
    of answers no well-behaved server sends."""

    def __init__(self, answers: list[bytes]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        if answers:
            self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            for answer in self.answers:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    request += chunk
                self.requests.append(request)
                conn.sendall(answer)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        if self.answers:
            self.thread.join(5)
        self.sock.close()


def test_an_answer_split_across_packets_and_a_chunked_body_are_read_whole() -> None:
    raw = RawServer([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                     b"effectlog-applied-offset: 7\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"])
    gets = KeepAliveGets()
    assert get(gets, raw.url, "/a") == (200, b"abcde", {"Transfer-Encoding": "chunked",
                                                        "Effectlog-Applied-Offset": "7"})
    assert raw.requests[0].startswith(b"GET /a HTTP/1.1\r\nHost: 127.0.0.1:")
    gets.close()
    raw.close()


def test_a_malformed_or_cut_answer_is_an_http_exception() -> None:
    for answer in (b"HTTP/1.1 2OO OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc"):
        raw = RawServer([answer])
        gets = KeepAliveGets()
        with pytest.raises(http.client.HTTPException):
            get(gets, raw.url, "/a")
        gets.close()
        raw.close()


def test_a_connection_close_answer_is_not_reused() -> None:
    raw = RawServer([b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"])
    gets = KeepAliveGets()
    assert get(gets, raw.url, "/a")[:2] == (404, b"{}")
    gets.close()
    raw.close()


def test_a_target_that_is_not_a_path_is_refused_unsent() -> None:
    raw = RawServer([])
    gets = KeepAliveGets()
    for target in ("/a b", "/a\r\nX: 1", "relative", "/caf\u00e9"):
        with pytest.raises(http.client.InvalidURL):
            get(gets, raw.url, target)
    assert raw.requests == []
    gets.close()
    raw.close()
