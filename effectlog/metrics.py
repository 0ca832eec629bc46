"""Prometheus metrics of a serving process.

Each :class:`Metrics` owns its registry (no global state). Counters are bumped by this
process's reconciler as it works; gauges are refreshed by :meth:`Metrics.observe` from the
projection (whose counters cover every worker's events and survive restarts) and the log.
``effectlog serve`` exposes :meth:`Metrics.render` on ``/metrics``, refreshing the gauges
first so its lag is the one ``/healthz`` reports (see :mod:`consumers.node.http_api`).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["CONTENT_TYPE_LATEST", "Metrics", "projector_lag"]


def projector_lag(end_offsets: Mapping[int, int], next_offsets: Mapping[int, int]) -> int:
    """Events written to the log but not yet projected, over all partitions."""
    return sum(max(0, end - next_offsets.get(p, 0)) for p, end in end_offsets.items())


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
        self.log_replaced = Gauge("effectlog_log_replaced", "1 once the log this node serves "
                                  "was replaced or is gone (serving stopped).", registry=r)
        self.projector_lag = Gauge("effectlog_projector_lag",
                                   "Events written to the log but not yet projected.", registry=r)
        self.projected = Gauge("effectlog_projected_events", "Accepted events in the projection, "
                               "by kind: attempts (dispatches), confirmed_effects, reconciled "
                               "(recorded from a lookup), failed, approved_retries, abandoned.",
                               ["kind"], registry=r)
        self.partitions = Gauge("effectlog_partitions", "Events partitions held by this process, "
                                "by status (serving, restoring, halted, standby).", ["status"],
                                registry=r)
        self.unpublished = Gauge("effectlog_changelog_unpublished_seconds",
                                 "Per partition owned: seconds since its changelog last held "
                                 "everything the projection applied (keep it well below the "
                                 "events topic's min.compaction.lag.ms).", ["partition"],
                                 registry=r)
        self.restore_seconds = Histogram("effectlog_partition_restore_seconds",
                                         "Time from a partition's assignment until it serves.",
                                         buckets=(0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 1800),
                                         registry=r)
        self.restored_records = Counter("effectlog_partition_restored_records",
                                        "Records applied while restoring assigned partitions.",
                                        registry=r)

    def observe(self, counts: Mapping[str, int], end_offsets: Mapping[int, int],
                next_offsets: Mapping[int, int]) -> None:
        """Refresh the gauges from projection counts and log/projection offsets."""
        self.unresolved_unknown.set(counts.get("state:UNKNOWN", 0)
                                    + counts.get("state:AWAITING_APPROVAL", 0))
        for name, value in counts.items():
            if name.startswith("rejected:"):
                self.rejected.labels(reason=name.split(":", 1)[1]).set(value)
        self.projector_lag.set(projector_lag(end_offsets, next_offsets))
        for kind, label in _PROJECTED.items():
            self.projected.labels(kind=kind).set(counts.get(label, 0))

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return bytes(generate_latest(self.registry))
