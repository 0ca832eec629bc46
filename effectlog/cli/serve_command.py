"""``serve``: projector, recovery and (with ``--provider``) reconciler in one process.

Each loop runs in its own thread with its own log handle; SIGTERM or SIGINT sets one stop
event, the loops finish their current step and the process exits 0. ``/metrics`` and
``/healthz`` are served on ``--metrics-port``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from effectlog.cli.context import CliContext
from effectlog.cli.recovery_commands import (
    _with,
    approval_policy,
    recovery_options,
    recovery_settings,
    stop_on_signals,
)
from effectlog.redact import redact_url

if TYPE_CHECKING:
    from effectlog.metrics import Metrics, MetricsServer

logger = logging.getLogger(__name__)


def _loop(name: str, until: threading.Event, body: Callable[[threading.Event], None],
          crashed: threading.Event, failed: list[str]) -> threading.Thread:
    """A thread running ``body(until)``; an unexpected crash stops the whole process."""
    def run() -> None:
        try:
            body(until)
        except Exception:
            logger.exception("%s loop crashed; shutting down", name)
            failed.append(name)
            crashed.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def _join(threads: list[threading.Thread], within_s: float) -> list[str]:
    """Join ``threads`` within one deadline; the names of those still running."""
    deadline = time.monotonic() + within_s
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def _probe(obj: CliContext) -> tuple[dict[str, int], dict[int, int], dict[int, int], bool]:
    """Fresh figures for /healthz and /metrics alike: projection counts, the log's end
    offsets, the projected offsets, and whether a projection exists."""
    from effectlog.log import open_log
    from effectlog.log.base import EVENTS
    from projections import open_reader

    log = open_log(obj.log_url)
    try:
        ends = log.end_offsets(EVENTS)
    finally:
        log.close()
    reader = open_reader(obj.state_dir)
    try:
        return reader.counts(), ends, reader.next_offsets(), reader.exists
    finally:
        reader.close()


def metrics_server(obj: CliContext, metrics: Metrics, host: str, port: int) -> MetricsServer:
    """``/healthz`` (healthy when the log's end offsets can be read and the projection
    opens) and ``/metrics``, both answered from a fresh :func:`_probe`, so the lag
    ``/metrics`` shows is the one ``/healthz`` reports."""
    from effectlog.metrics import MetricsServer, projector_lag

    def health() -> tuple[bool, dict[str, object]]:
        _, ends, nexts, exists = _probe(obj)
        return exists, {"log_end_offsets": ends, "projection": exists,
                        "projected_offsets": nexts, "projector_lag": projector_lag(ends, nexts)}

    return MetricsServer(metrics, health, host, port,
                         refresh=lambda: metrics.observe(*_probe(obj)[:3]))


@click.command()
@click.option("--provider", "provider_spec", default=None, metavar="SPEC",
              help="Run the reconciler against this provider (module:factory, fake:///path, "
                   "http://host:port).")
@click.option("--metrics-port", type=int, default=9464, show_default=True)
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@_with(recovery_options)
@click.option("--poll", default="5s", show_default=True, help="Recovery pass interval.")
@click.option("--auto-retry", multiple=True, metavar="KIND",
              help="Kind (prefix) the policy may retry without approval. Repeatable.")
@click.option("--allow-risky", multiple=True, metavar="KIND",
              help="Opt a payment*/browser* kind into --auto-retry explicitly.")
@click.pass_obj
def serve(obj: CliContext, provider_spec: str | None, metrics_port: int, metrics_host: str,
          stuck_after: str, kind_deadlines: tuple[str, ...], command_timeout: str, poll: str,
          auto_retry: tuple[str, ...], allow_risky: tuple[str, ...]) -> None:
    """Run projector, recovery and reconciler loops until SIGTERM; expose /metrics."""
    from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
    from consumers.providers import load_provider
    from consumers.reconciler import Reconciler, ReconcilerSettings
    from consumers.recovery import RecoveryConsumer
    from effectlog.metrics import Metrics
    from projections import open_reader
    from projections.projector import Projector

    settings = recovery_settings(stuck_after, command_timeout, kind_deadlines, poll)
    provider = load_provider(provider_spec) if provider_spec else None
    stop = stop_on_signals()
    metrics = Metrics()
    failed: list[str] = []
    logs = [obj.open_log() for _ in range(3)]
    projector = Projector(logs[0], obj.state_dir)
    projector.open()  # creates the projection, so the readers below find it
    reader = open_reader(obj.state_dir, "secondary")
    ledger = CommandLedger(consumer_db_path(obj.state_dir, "recovery"))
    offsets = OffsetStore(consumer_db_path(obj.state_dir, "reconciler"))
    server = metrics_server(obj, metrics, metrics_host, metrics_port).start()

    def project(s: threading.Event) -> None:
        projector.run(stop=s)

    # The projector stops last: the other loops' current step may wait for it.
    projector_stop = threading.Event()
    projecting = _loop("projector", projector_stop, project, stop, failed)
    threads = [
        _loop("recovery", stop, RecoveryConsumer(logs[1], reader, ledger, settings,
                                                 metrics=metrics).run, stop, failed),
    ]
    view = None
    if provider is not None:
        if obj.log_url.startswith("kafka"):  # folding a key from Kafka scans a partition:
            from projections.view import ProjectionView  # read the in-process projection

            view = ProjectionView(logs[2], obj.state_dir)
        reconciler = Reconciler(logs[2], provider, offsets,
                                ReconcilerSettings(policy=approval_policy(auto_retry, allow_risky)),
                                view=view, metrics=metrics)
        threads.append(_loop("reconciler", stop, reconciler.run, stop, failed))
    logger.info("serving %s (state %s); metrics on port %d", redact_url(obj.log_url), obj.state_dir,
                server.port)
    click.echo(f"effectlog serve: metrics on http://{metrics_host}:{server.port}/metrics", err=True)
    stop.wait()
    click.echo("effectlog serve: stopping", err=True)
    running = _join(threads, 45)
    projector_stop.set()
    running += _join([projecting], 15)
    server.close()
    if running:  # never close handles under a live thread; the OS reclaims them
        raise click.ClickException(f"the {', '.join(running)} loop(s) did not stop in time")
    for closable in (view, projector, reader, ledger, offsets, *logs):
        if closable is not None:
            closable.close()
    if failed:
        raise click.ClickException(f"stopped because the {', '.join(failed)} loop crashed")
    click.echo("effectlog serve: stopped", err=True)
