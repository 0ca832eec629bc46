"""The query API client's cost per read, against a bare socket exchange of the same bytes.

One ``serve`` instance on Apache Kafka answers ``GET /v1/effects/{key}`` for a key it does not
hold (a 404 with its headers: what a worker's first read of a new effect gets). Measured in
one thread, each over keep-alive connections to that instance:

- the floor: the same request bytes sent and the whole answer received on a bare socket;
- ``effectlog.http_get.KeepAliveGets``, the client workers use (httptools parsing);
- ``http.client.HTTPConnection``, which the client used before.

Usage: python bench/query_client.py [--reads N]
The last line gives the client's CPU and wall time per read as ratios to the floor, with the
absolute figures.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from _common import kafka_bootstrap, run_topics

from effectlog.http_get import KeepAliveGets
from tests.cluster_support import Serve, wait_until

TARGET = "/v1/effects/agent%3Aop-1%3Aemail.send%3Amailto%3Aa%40example.com"


def per_read(fn: Callable[[], object], reads: int) -> tuple[float, float]:
    """Microseconds of this thread's CPU and of wall time per call, after a warm-up."""
    for _ in range(100):
        fn()
    cpu, wall = time.thread_time(), time.perf_counter()
    for _ in range(reads):
        fn()
    return ((time.thread_time() - cpu) / reads * 1e6,
            (time.perf_counter() - wall) / reads * 1e6)


class BareExchange:
    """The request bytes on a kept-alive socket, reading until the answer's length is in."""

    def __init__(self, port: int, request: bytes, answer_size: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), 5)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.request, self.answer_size = request, answer_size

    def __call__(self) -> None:
        self.sock.sendall(self.request)
        got = 0
        while got < self.answer_size:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            got += len(chunk)


def answer_size(port: int, request: bytes) -> int:
    """Bytes of one whole answer to ``request``: its head and ``Content-Length`` of body."""
    with socket.create_connection(("127.0.0.1", port), 5) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        head = data.split(b"\r\n\r\n", 1)[0]
        lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")]
        return len(head) + 4 + int(lengths[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=3000)
    args = parser.parse_args()
    with kafka_bootstrap() as bootstrap, tempfile.TemporaryDirectory() as tmp:
        if bootstrap is None:
            raise SystemExit("no Kafka broker")
        url = f"kafka://{bootstrap}?prefix=qc{uuid.uuid4().hex[:8]}"
        with run_topics(url):
            node = Serve(Path(tmp), "bench", url, None)
            try:
                wait_until(lambda: len(node.serving()) > 0, 90, "serve is up")
                port = int(node.url.rsplit(":", 1)[1])
                request = (f"GET {TARGET} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                           "Accept-Encoding: identity\r\n\r\n").encode()
                bare = BareExchange(port, request, answer_size(port, request))
                gets = KeepAliveGets()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

                def old_client() -> None:
                    conn.request("GET", TARGET)
                    conn.getresponse().read()

                rows = {}
                for name, fn in (("bare socket", bare), ("KeepAliveGets", lambda: gets.get(
                        node.url, TARGET, connect_timeout_s=2, read_timeout_s=5)),
                                 ("http.client", old_client)):
                    rows[name] = per_read(fn, args.reads)
                gets.close()
                conn.close()
            finally:
                node.stop()
    floor_cpu, floor_wall = rows["bare socket"]
    for name, (cpu, wall) in rows.items():
        print(f"{name:14s} CPU {cpu:6.1f} us, wall {wall:6.1f} us per read "
              f"({cpu / floor_cpu:.2f}x / {wall / floor_wall:.2f}x the bare socket)")
    cpu, wall = rows["KeepAliveGets"]
    print(f"query_client: KeepAliveGets CPU {cpu / floor_cpu:.2f}x the bare socket "
          f"({cpu:.0f} vs {floor_cpu:.0f} us), wall {wall / floor_wall:.2f}x "
          f"({wall:.0f} vs {floor_wall:.0f} us) per read")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
