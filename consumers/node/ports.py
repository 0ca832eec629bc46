"""What the HTTP API, its health check and the web console ask of a node: one protocol, so
they depend on it and not on the concrete :class:`~consumers.node.node.Node` (which builds
them)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from consumers.node.forwarding import Membership
    from consumers.node.health import LogFigures
    from consumers.node.judging import PartitionJudge
    from consumers.node.stale_reads import StandbyCopies
    from effectlog.metrics import Metrics
    from projections.paging import Filters, Page
    from projections.store import Cursor


class ServedNode(Protocol):
    """A serving node as its routes see it."""

    url: str
    """The URL other members and clients reach this node at."""
    log_url: str
    """The log it serves, as given (mask it with ``redact_url`` before showing it)."""
    partition_count: int
    judge: PartitionJudge
    """Reads of keys and verdicts on writes, for the partitions it serves."""
    membership: Membership
    """Who serves which partition, for forwarding."""
    standby_copies: StandbyCopies
    """Its standby copies of other members' partitions, for reads while they have no owner."""
    metrics: Metrics
    last_log_figures: LogFigures | None

    @property
    def http_host(self) -> str:
        """The host its HTTP server listens on (the console answers loopback names only there)."""
        ...

    @property
    def health_wait_s(self) -> float:
        """How long ``/healthz`` waits for the log."""
        ...

    @property
    def failed(self) -> list[str]:
        """The loops that crashed, in order."""
        ...

    def end_offsets(self) -> dict[int, int]:
        """The log's end offset per events partition (blocking)."""
        ...

    def list_local(self, states: Sequence[str], before_ms: int | None, limit: int,
                   after: Cursor | None = None,
                   filters: Filters = ...) -> tuple[Page, set[int]]:
        """A page of the snapshots in ``states`` of the partitions served here."""
        ...

    def stats_local(self) -> tuple[dict[str, int], dict[int, int]]:
        """Counts and applied positions of the partitions served here."""
        ...

    def health_details(self) -> dict[str, object]:
        """What ``/healthz`` reports besides the log's figures."""
        ...

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Whether it serves its share of the partitions, and why not (no I/O)."""
        ...

    def read_log_figures(self, log: str = "api") -> LogFigures:
        """The log's end offsets and the projector lag now (blocking)."""
        ...

    def recover_local(self, deadlines: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One recovery pass now over the partitions served here (blocking)."""
        ...

    def refresh_metrics(self) -> None:
        """Refresh the gauges (blocking)."""
        ...
