"""A small HTTP API in front of the fake provider, speaking the Idempotency-Key draft.

``POST /effects/{operation}`` with ``Idempotency-Key`` and ``Fencing-Epoch`` headers and a
JSON body ``{"target", "payload_hash", "payload"}`` performs the effect: 201 with the
result; a replay of a completed request returns the original response (200); 409 while a
request with the key is in flight; 422 when the key was used for another payload, target
or operation; 412 for a stale fencing epoch; 400 for a missing key or a definitive failure
(body ``status: FAILED``); 503 for an injected outage. An injected accept-then-timeout
performs the effect and drops the connection without answering.
``GET /lookup`` with the key header: 200 with the stored outcome, 404, or 503.
``GET /`` describes the API; ``GET /healthz`` answers 200 while the server runs.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from consumers.providers import wire
from consumers.providers.fake import FakeProvider, InFlight
from effectlog.errors import InvalidInput
from effectlog.provider import (
    FencedByProvider,
    LookupStatus,
    ProviderConflict,
    ProviderFailed,
    ProviderTimeout,
    ProviderUnavailable,
)

logger = logging.getLogger(__name__)


class FakeProviderServer:
    """Serves one :class:`FakeProvider` over HTTP; ``port=0`` picks a free port."""

    def __init__(self, provider: FakeProvider, host: str = "127.0.0.1", port: int = 0) -> None:
        self.provider = provider
        self._server = ThreadingHTTPServer((host, port), _handler(provider))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeProviderServer:
        """Serve on a background thread."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-provider",
                                        daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`close` (or KeyboardInterrupt)."""
        self._server.serve_forever()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/":
                self._json(200, {"service": "effectlog fake provider", "endpoints": {
                    f"POST {wire.EFFECTS_PATH}{{operation}}": "perform (Idempotency-Key, "
                                                            "Fencing-Epoch headers)",
                    f"GET {wire.LOOKUP_PATH}": "look a key up (Idempotency-Key header)",
                    f"GET {wire.CAPABILITIES_PATH}": "lookup completeness and retention",
                    "GET /healthz": "liveness"}})
            elif path == "/healthz":
                self._json(200, {"ok": True})
            elif path == wire.CAPABILITIES_PATH:
                self._json(200, {"lookup_complete": provider.lookup_complete,
                                 "retention_s": provider.retention_s})
            elif path == wire.LOOKUP_PATH:
                self._lookup()
            else:
                self._problem(404, "no such resource")

        def do_POST(self) -> None:
            if not self.path.startswith(wire.EFFECTS_PATH):
                self._problem(404, "no such resource")
                return
            try:
                key = wire.decode_key(self.headers.get(wire.KEY_HEADER))
                epoch = int(self.headers.get(wire.EPOCH_HEADER, "0"))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                target, payload_hash = str(body["target"]), str(body["payload_hash"])
            except (InvalidInput, ValueError, KeyError, TypeError) as exc:
                self._problem(400, f"bad request: {exc}")
                return
            before = provider.calls(key)
            try:
                result = provider.execute_operation(wire.operation_from_path(self.path), target,
                                                    payload_hash, key, epoch, body.get("payload"))
            except ProviderTimeout:
                self.close_connection = True  # performed, but the answer never comes
                self.connection.close()
                return
            except ProviderFailed as exc:
                self._json(400, {"status": "FAILED", "result": exc.result}, wire.PROBLEM_JSON)
            except InFlight as exc:
                self._problem(409, str(exc))
            except ProviderConflict as exc:
                self._problem(422, str(exc))
            except FencedByProvider as exc:
                self._problem(412, str(exc))
            except ProviderUnavailable as exc:
                self._problem(503, str(exc))
            else:
                self._json(200 if before else 201, {"status": "SUCCEEDED", "result": result})

        def _lookup(self) -> None:
            try:
                key = wire.decode_key(self.headers.get(wire.KEY_HEADER))
            except InvalidInput as exc:
                self._problem(400, str(exc))
                return
            found = provider.lookup(key)
            if found.status is LookupStatus.NOT_FOUND:
                self._problem(404, "no request with this key")
            elif found.status is LookupStatus.UNAVAILABLE or found.outcome is None:
                self._problem(503, found.detail or "lookup unavailable")
            else:
                self._json(200, {"status": found.outcome.status.value,
                                 "result": found.outcome.result,
                                 "payload_hash": found.payload_hash})

        def _problem(self, status: int, detail: str) -> None:
            self._json(status, {"title": self.responses.get(status, ("",))[0],
                                "detail": detail}, wire.PROBLEM_JSON)

        def _json(self, status: int, body: dict[str, Any],
                  content_type: str = "application/json") -> None:
            data = json.dumps(body, sort_keys=True).encode("utf-8")
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                logger.debug("client went away before the %d answer", status)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("fake provider http: " + format, *args)

    return Handler
