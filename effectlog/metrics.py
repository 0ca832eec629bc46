"""Prometheus metrics of a serving process and the HTTP endpoint exposing them.

Each :class:`Metrics` owns its registry (no global state). Counters are bumped by this
process's reconciler as it works; gauges are refreshed by :meth:`Metrics.observe` from the
projection (whose counters cover every worker's events and survive restarts) and the log.
:class:`MetricsServer` serves ``/metrics`` and ``/healthz``.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

logger = logging.getLogger(__name__)

#: A health probe: (healthy, details) where details are shown as JSON.
HealthCheck = Callable[[], tuple[bool, dict[str, object]]]


#: Gauge label -> the projection's counter (see projections.rocksdb.writer.event_metrics).
_PROJECTED = {
    "attempts": "metric:attempts", "confirmed_effects": "metric:confirmed_effects",
    "reconciled": "metric:reconciled", "failed": "metric:recorded:failed",
    "approved_retries": "metric:decisions:retry", "abandoned": "metric:decisions:abandon",
}


class Metrics:
    """The counters and gauges of DESIGN.md's metrics section."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.attempts = Counter("effectlog_dispatch_attempts", "Dispatches to a provider.",
                                registry=r)
        self.confirmed = Counter("effectlog_provider_effects_confirmed",
                                 "Provider effects confirmed (executed or found by lookup).",
                                 registry=r)
        self.reconciliations = Counter("effectlog_reconciliations",
                                       "Reconciliation commands handled, by action.", ["action"],
                                       registry=r)
        self.commands_issued = Counter("effectlog_recovery_commands",
                                       "Reconciliation commands issued by recovery.", registry=r)
        self.unresolved_unknown = Gauge("effectlog_unresolved_unknown",
                                        "Effects in UNKNOWN or AWAITING_APPROVAL.", registry=r)
        self.rejected = Gauge("effectlog_rejected_events", "Events the projector rejected, "
                              "by reason.", ["reason"], registry=r)
        self.projector_lag = Gauge("effectlog_projector_lag",
                                   "Events written to the log but not yet projected.", registry=r)
        self.projected = Gauge("effectlog_projected_events", "Accepted events in the projection, "
                               "by kind: attempts (dispatches), confirmed_effects, reconciled "
                               "(recorded from a lookup), failed, approved_retries, abandoned.",
                               ["kind"], registry=r)

    def observe(self, counts: Mapping[str, int], end_offsets: Mapping[int, int],
                next_offsets: Mapping[int, int]) -> None:
        """Refresh the gauges from projection counts and log/projection offsets."""
        self.unresolved_unknown.set(counts.get("state:UNKNOWN", 0)
                                    + counts.get("state:AWAITING_APPROVAL", 0))
        for name, value in counts.items():
            if name.startswith("rejected:"):
                self.rejected.labels(reason=name.split(":", 1)[1]).set(value)
        self.projector_lag.set(sum(max(0, end - next_offsets.get(p, 0))
                                   for p, end in end_offsets.items()))
        for kind, label in _PROJECTED.items():
            self.projected.labels(kind=kind).set(counts.get(label, 0))

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return bytes(generate_latest(self.registry))


class MetricsServer:
    """``/metrics`` and ``/healthz`` on a background thread; ``close`` stops it."""

    def __init__(self, metrics: Metrics, health: HealthCheck, host: str = "127.0.0.1",
                 port: int = 9464) -> None:
        handler = _handler(metrics, health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics",
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> MetricsServer:
        self._thread.start()
        logger.info("metrics on http://%s:%d/metrics", *self._server.server_address[:2])
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _handler(metrics: Metrics, health: HealthCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, metrics.render())
            elif path == "/healthz":
                try:
                    ok, details = health()
                except Exception as exc:  # a probe must answer, whatever broke
                    ok, details = False, {"error": f"{type(exc).__name__}: {exc}"}
                body = json.dumps({"ok": ok, **details}, default=str).encode()
                self._send(200 if ok else 503, "application/json", body)
            else:
                self._send(404, "text/plain", b"not found\n")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("metrics http: " + format, *args)

    return Handler
