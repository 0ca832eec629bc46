"""The serving process: projector, recovery, reconciler, metrics and the query API, wired once.

A :class:`Node` owns the events partitions assigned to it: on a log with consumer groups
(Kafka) the group decides which; otherwise it holds every partition. Each assigned
partition is restored (:mod:`consumers.node.gate`) before it is served, and recovery and
reconciliation act only on partitions being served. ``effectlog serve`` and the demo run
the same node.

Threads: the projector (which also runs the group's rebalance callbacks), recovery and
reconciler (each its own loop, unless ``loops`` is off and the owner calls
:meth:`Node.run_pass`), a metrics observer, and the HTTP server's event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeVar

from consumers.expiry import Expirer, ExpirySettings
from consumers.node.assignments import Assignments
from consumers.node.gate import PartitionGate
from consumers.node.grouping import Grouping, GroupOptions
from consumers.node.health import DEFAULT_WAIT_S as DEFAULT_HEALTH_WAIT_S
from consumers.node.health import LogFigures
from consumers.node.http_api import RouteHook, build_app
from consumers.node.judging import NodeJudge, PartitionJudge
from consumers.node.publisher import RETAKE_AFTER_S, Publisher
from consumers.node.readiness import readiness
from consumers.node.recovering import NodeRecovery
from consumers.node.server import HttpServer
from consumers.node.stale_reads import StandbyCopies
from consumers.node.watch import watch_log
from consumers.reconciler import Handled, Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.codec import event_codec
from effectlog.errors import EffectlogError, WrongLog
from effectlog.judge.premises import known_fingerprints, worker_fingerprint
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog
from effectlog.metrics import Metrics
from effectlog.provider import Provider
from effectlog.redact import redact_url
from projections.checkpoint import check_changelog_partitions, check_partition_count
from projections.paging import ANYTHING, Filters, Page, merge_pages, read_page
from projections.projector import Projector, ProjectorSettings
from projections.rocksdb.layout import current_generation, partition_count
from projections.rocksdb.store import RocksProjectionStore, StoreReader
from projections.store import Cursor

if TYPE_CHECKING:
    pass

logger = logging.getLogger(__name__)
C = TypeVar("C", bound="_Closable")


class _Closable(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class NodeSettings:
    """What a node runs and where. ``http_port`` None: no HTTP server; 0: any free port.
    ``advertise`` is the URL other members reach this node at (default from host/port);
    ``health_wait_s`` how long ``/healthz`` waits for the log (see :mod:`.health`)."""

    state_dir: Path
    http_host: str = "127.0.0.1"
    http_port: int | None = 9464
    advertise: str | None = None
    group: str | None = None
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    reconciler: ReconcilerSettings = field(default_factory=ReconcilerSettings)
    projector: ProjectorSettings = field(default_factory=ProjectorSettings)
    loops: bool = True
    observe_every_s: float = 5.0
    session_timeout_ms: int = 6_000  # the broker's default floor (group.min.session.timeout.ms)
    membership_every_s: float = 2.0
    standbys: int = 0
    expiry: ExpirySettings | None = None  # None: settled effects are kept forever
    recovers: bool = True  # False: no recovery and no reconciler here (projects and answers)
    health_wait_s: float = DEFAULT_HEALTH_WAIT_S  # /healthz answers without the log after it


class Node:
    """One serving process. ``start`` opens and starts everything; ``stop`` then ``close``."""

    def __init__(self, log_url: str, settings: NodeSettings, provider: Provider | None = None,
                 *, extra_routes: RouteHook | None = None, metrics: Metrics | None = None) -> None:
        self.log_url = log_url
        self.settings = settings
        self.provider = provider
        self.extra_routes = extra_routes
        self.metrics = metrics or Metrics()
        self.gate = PartitionGate(on_restored=self._restored)
        self.failures: list[tuple[str, Exception]] = []  # (loop, what it died of), in order
        self.fatal: EffectlogError | None = None  # why the node stopped serving by itself
        self.crashed = threading.Event()
        self._stop = threading.Event()
        self._stop_projector = threading.Event()
        self._threads: list[threading.Thread] = []
        self._closables: list[_Closable] = []
        self._lock_file: IO[str] | None = None
        self.server: HttpServer | None = None
        self.recovering = NodeRecovery.off(self.gate)  # until started
        self.recovery: RecoveryConsumer | None = None
        self.reconciler: Reconciler | None = None
        self.last_log_figures: LogFigures | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> Node:
        """Reach the log, lock the state directory, open the store, bind the HTTP port, join
        the group (or take every partition) and start the loops."""
        s = self.settings
        self.logs: dict[str, EventLog] = {name: self._open(open_log(self.log_url))
                                          for name in ("projector", "work", "api")}
        api_log = self.logs["api"]
        api_log.end_offsets(EVENTS)  # reach the log first: a broker down creates nothing
        api_log.check_serving()
        # the producer id meanwhile (a moment, or a second when librdkafka waits for its
        # timer): no first command or outcome pays it
        with ThreadPoolExecutor(1, thread_name_prefix="connect") as pool:
            connecting = pool.submit(self.logs["work"].connect)
            self._open_and_join(api_log)
        connecting.result()
        logger.info("serving %s (state %s) as %s", redact_url(self.log_url), s.state_dir, self.url)
        return self

    def _open_and_join(self, api_log: EventLog) -> None:
        """Lock the state directory, open the store, bind the HTTP port, join the group and
        start the loops."""
        s = self.settings
        self._lock_state_dir()
        self.partition_count = api_log.partitions(EVENTS)
        # a topic grown since this projection was made is refused before joining the group
        check_partition_count(partition_count(current_generation(s.state_dir)),
                              self.partition_count, f"the projection in {s.state_dir}")
        self.store = RocksProjectionStore(s.state_dir, s.projector.cache_size)
        self.reader: StoreReader = self.store.reader(self.partition_for, self.gate.serving)
        self.projector = self._open(Projector(self.logs["projector"], self.store, s.projector,
                                              on_applied=self.gate.applied,
                                              on_halt=self.gate.halt, background_restores=True,
                                              on_opened=self.gate.opened))
        changelog = self.logs["projector"].changelog()
        if changelog is not None:  # a topic grown since the last publication is refused
            check_changelog_partitions(changelog, self.partition_count)
        self.publisher = None if changelog is None else self._open(
            # the projector's writers, not the store's: a partition still being opened (its
            # copy not yet checked against the changelog, or being restored) is not published
            Publisher(changelog, self.projector.writers, api_log.identity(),
                      retake_after_s=max(RETAKE_AFTER_S, 3 * s.session_timeout_ms / 1000),
                      held=lambda partition: self.membership.owners().get(partition) == self.url,
                      partitions=self.partition_count))
        if s.http_port is not None:
            self.server = HttpServer(s.http_host, s.http_port)
        self.url = s.advertise or (self.server.url if self.server else "local:")
        self.standby_copies = StandbyCopies(
            self.url, self.standbys,
            self.store.reader(self.partition_for, self.standbys).read_consistent,
            self.end_offsets, api_log.identity())
        self.judge = PartitionJudge(self.gate, self.reader, self.url, api_log.identity(),
                                    known_fingerprints(event_codec().writer_fingerprints),
                                    self.fresh_ends)
        self.grouping = Grouping.join(
            self.logs["projector"], self._assignments(), self.url, self.partition_count,
            GroupOptions(s.group, s.session_timeout_ms, s.standbys), self.projector,
            lambda: self._open(open_log(self.log_url)))
        self.source, self.membership = self._open(self.grouping.source), self.grouping.membership
        if self.server is not None:
            self.server.start(lambda: build_app(self, self.extra_routes))
        self.recovering = self._recovering()
        self.recovery, self.reconciler = self.recovering.recovery, self.recovering.reconciler
        self._spawn("projector", self._stop_projector, self._project)
        if self.publisher is not None:
            self._spawn("publisher", self._stop, self.publisher.run)
        if s.loops:
            for name, body in self.recovering.loops():
                self._spawn(name, self._stop, body)
            if s.expiry is not None:
                expirer = Expirer(self.logs["work"], self.reader, s.expiry, self.gate.positions)
                self._spawn("expiry", self._stop, expirer.run)
        self._spawn("metrics", self._stop, self._observe)
        self._spawn("membership", self._stop, lambda stop: self.grouping.follow(
            stop, s.membership_every_s, self.url, s.standbys))
        self._spawn("log-watch", self._stop, self._watch_log(api_log.identity()))

    def stop(self, within_s: float = 60.0) -> list[str]:
        """Stop the loops (the projector last: the others may wait for it) and the HTTP
        server; the names of threads still running."""
        self._stop.set()
        others = [t for t in self._threads if t.name != "projector"]
        running = _join(others, within_s * 0.75)
        self._stop_projector.set()
        running += _join([t for t in self._threads if t.name == "projector"], within_s * 0.25)
        if self.server is not None:
            self.server.close()
        return running

    def close(self) -> None:
        """Release every handle (after :meth:`stop`; never under a live thread)."""
        for closable in reversed(self._closables):
            try:
                closable.close()
            except EffectlogError as exc:
                logger.warning("closing %s: %s", type(closable).__name__, exc)
        self._closables.clear()
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    @property
    def http_host(self) -> str:
        return self.settings.http_host

    @property
    def health_wait_s(self) -> float:
        return self.settings.health_wait_s

    @property
    def failed(self) -> list[str]:
        """The loops that crashed, in order."""
        return [name for name, _ in self.failures]

    # -- what the API asks ---------------------------------------------------------------

    def partition_for(self, key: str) -> int:
        return self.logs["api"].partition_for(EVENTS, key)

    def end_offsets(self) -> dict[int, int]:
        """The log's end offset per events partition (blocking)."""
        return self.logs["api"].end_offsets(EVENTS)

    def fresh_ends(self) -> dict[int, int]:
        """Where each events partition ends now, every acknowledged record included (past
        an open transaction too): what a fresh read waits for (blocking)."""
        return self.logs["api"].acknowledged_ends(EVENTS)

    def list_local(self, states: Sequence[str], before_ms: int | None, limit: int,
                   after: Cursor | None = None,
                   filters: Filters = ANYTHING) -> tuple[Page, set[int]]:
        """A page of the snapshots in ``states`` of the partitions served here (see
        :mod:`projections.paging`), and those partitions."""
        covered = set(self.gate.serving())
        pages = [read_page(self.reader, state, before_ms=before_ms, after=after,
                           filters=filters, limit=limit) for state in states]
        # only what was served throughout: a partition revoked during the read may be missing
        # from the page, so it is not claimed as covered (the caller asks its owner)
        return merge_pages(pages, limit), covered & set(self.gate.serving())

    def stats_local(self) -> tuple[dict[str, int], dict[int, int]]:
        """Counts and applied positions of the partitions served here."""
        serving = set(self.gate.serving())
        positions = {p: n for p, n in self.gate.positions().items() if p in serving}
        return self.reader.counts(), positions

    def health_details(self) -> dict[str, object]:
        """What ``/healthz`` reports besides the log's figures (no I/O on the log)."""
        s = self.settings
        details: dict[str, object] = {"url": self.url, "partitions": self.gate.held(),
                                      "projection": bool(self.gate.held()),
                                      "projected_offsets": self.gate.positions(),
                                      "standbys": self.standbys(), "recovers": s.recovers,
                                      "reconciles": self.reconciler is not None}
        if halted := self.gate.halted():
            details["halted"] = halted
        if self.failed:
            details["failed_loops"] = list(self.failed)
        return details

    def readiness(self) -> tuple[bool, dict[str, object]]:
        """``/readyz``: whether this node serves its share, and why not (no I/O)."""
        return readiness(joined=self.grouping.joined(), group=self.grouping.group,
                         held=self.gate.held(), restore_left=self.gate.restore_left,
                         failed=self.failed)

    def read_log_figures(self, log: str = "api") -> LogFigures:
        """The log's end offsets and the projector lag now (blocking); kept as the last
        known figures, which ``/healthz`` reports while the log does not answer."""
        ends = self.logs[log].end_offsets(EVENTS)
        figures = self.last_log_figures = LogFigures.now(ends, self.gate.held(),
                                                         self.gate.positions())
        return figures

    def run_pass(self) -> list[Handled]:
        """One recovery pass, then one reconciler pass (when ``loops`` is off)."""
        return self.recovering.run_pass()

    def recover_local(self, deadlines: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One recovery pass now over the partitions served here, with ``deadlines`` in
        place of this node's (``POST /v1/recover``)."""
        settings = None if deadlines is None else \
            self.settings.recovery.with_deadlines(deadlines)
        return self.recovering.recover_now(settings, self.url)

    # -- internals -----------------------------------------------------------------------

    def _recovering(self) -> NodeRecovery:
        """Recovery (and with a provider the reconciler) over the partitions served here."""
        s, work = self.settings, self.logs["work"]
        if not s.recovers:
            return NodeRecovery.off(self.gate)
        judge = None if work.conditional else NodeJudge(self.judge, worker_fingerprint())
        return NodeRecovery.build(
            log=work, reader=self.reader, gate=self.gate, state_dir=s.state_dir,
            settings=s.recovery, reconciler=s.reconciler, provider=self.provider, judge=judge,
            offsets=lambda: self.grouping.command_offsets(s.state_dir, self._open),
            metrics=self.metrics, keep=self._open)

    def _assignments(self) -> Assignments:
        return Assignments(self.projector, self.gate, self.publisher, self.logs["projector"])

    def standbys(self) -> dict[int, int]:
        """The partitions this node keeps warm for other members, with their next offset."""
        return self.grouping.standbys()

    def _watch_log(self, bound: str | None) -> Callable[[threading.Event], None]:
        def body(stop: threading.Event) -> None:
            error = watch_log(self.log_url, bound, stop, self.settings.observe_every_s,
                              on_lag=self.projector.guard.lag_read)
            if error is not None:
                logger.error("%s", error)
                if isinstance(error, WrongLog):
                    self.metrics.log_replaced.set(1)
                self.fatal = error
                self.crashed.set()
        return body

    def _project(self, stop: threading.Event) -> None:
        self.projector.run(source=self.source, stop=stop)

    def refresh_metrics(self) -> None:
        """Refresh the gauges from the partitions held here and the log's end offsets."""
        held = self.gate.held()
        ends = self.read_log_figures("work").ends
        self.metrics.observe(self.reader.counts(), {p: n for p, n in ends.items() if p in held},
                             self.gate.positions())
        for status in ("serving", "restoring", "halted"):
            self.metrics.partitions.labels(status=status).set(
                sum(1 for s in held.values() if s == status))
        self.metrics.partitions.labels(status="standby").set(len(self.standbys()))
        self.metrics.unpublished.clear()
        for partition, seconds in ({} if self.publisher is None else
                                   self.publisher.unpublished_s()).items():
            self.metrics.unpublished.labels(partition=str(partition)).set(seconds)

    def _observe(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.refresh_metrics()
            except EffectlogError as exc:
                logger.warning("metrics refresh failed: %s", exc)
            stop.wait(self.settings.observe_every_s)

    def _restored(self, partition: int, records: int, took_s: float) -> None:
        self.metrics.restore_seconds.observe(took_s)
        self.metrics.restored_records.inc(records)

    def _spawn(self, name: str, until: threading.Event,
               body: Callable[[threading.Event], None]) -> None:
        """A thread running ``body(until)``; an unexpected crash stops the whole node."""
        def run() -> None:
            try:
                body(until)
            except Exception as exc:  # the owner reports it (serve: one line, an exit code)
                logger.debug("%s loop crashed; shutting down", name, exc_info=True)
                self.failures.append((name, exc))
                self.crashed.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _open(self, closable: C) -> C:
        self._closables.append(closable)
        return closable

    def _lock_state_dir(self) -> None:
        """One node per state directory, and no rebuild under it: refused before it touches
        the directory."""
        from projections.rocksdb.layout import hold

        self._lock_file = hold(self.settings.state_dir, "effectlog serve")


def _join(threads: list[threading.Thread], within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]
