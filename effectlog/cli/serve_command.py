"""``serve``: one node of the projection cluster (see :mod:`consumers.node`).

Options are read once here into :class:`~consumers.node.node.NodeSettings`; SIGTERM or
SIGINT stops the node's loops after their current step and the process exits 0.
"""

from __future__ import annotations

from pathlib import Path

import click

from effectlog.cli.context import CliContext
from effectlog.cli.recovery_commands import (
    _with,
    approval_policy,
    recovery_options,
    recovery_settings,
    stop_on_signals,
)
from effectlog.errors import InvalidInput

DEFAULT_HTTP = "127.0.0.1:9464"


def parse_http(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6; port 0 picks a free one)."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise InvalidInput(f"--http {text!r}: use HOST:PORT, e.g. 127.0.0.1:9464")
    return host, int(port)


@click.command()
@click.option("--http", "http", default=DEFAULT_HTTP, show_default=True, metavar="HOST:PORT",
              help="Where the query API, /metrics and /healthz listen.")
@click.option("--advertise", default=None, metavar="URL",
              help="URL the other members reach this one at (default http://HOST:PORT).")
@click.option("--group", default=None, metavar="NAME",
              help="Consumer group of the serve instances (Kafka; default <prefix>.serve).")
@click.option("--standbys", type=click.IntRange(min=0), default=0, show_default=True,
              help="Keep warm copies of partitions owned by N other members (Kafka), so a "
                   "failover restores only the last moments.")
@click.option("--session-timeout", default="10s", show_default=True, metavar="DUR",
              help="How long a silent member keeps its partitions (Kafka group session).")
@click.option("--provider", "provider_spec", default=None, metavar="SPEC",
              help="Run the reconciler against this provider (module:factory, fake:///path, "
                   "http://host:port).")
@click.option("--console-token", envvar="EFFECTLOG_CONSOLE_TOKEN", default=None, metavar="TOKEN",
              help="Lets people who log in with it retry or abandon effects from the web "
                   "console at / (env EFFECTLOG_CONSOLE_TOKEN); without it the console is "
                   "read-only.")
@click.option("--metrics-port", type=int, default=None, hidden=True,
              help="Old name of the --http port.")
@click.option("--metrics-host", default=None, hidden=True, help="Old name of the --http host.")
@_with(recovery_options)
@click.option("--poll", default="5s", show_default=True, help="Recovery pass interval.")
@click.option("--auto-retry", multiple=True, metavar="KIND",
              help="Kind (prefix) the policy may retry without approval. Repeatable.")
@click.option("--allow-risky", multiple=True, metavar="KIND",
              help="Opt a payment*/browser* kind into --auto-retry explicitly.")
@click.pass_obj
def serve(obj: CliContext, http: str, advertise: str | None, group: str | None,
          standbys: int, session_timeout: str, provider_spec: str | None,
          console_token: str | None,
          metrics_port: int | None, metrics_host: str | None,
          stuck_after: str, kind_deadlines: tuple[str, ...], command_timeout: str, poll: str,
          auto_retry: tuple[str, ...], allow_risky: tuple[str, ...]) -> None:
    """Project, recover and reconcile the partitions this instance owns, and answer the
    query API (GET /v1/effects/KEY, /v1/effects, /v1/stats) and the web console (/)
    until SIGTERM."""
    from consumers.console import ConsoleSettings, console_routes
    from consumers.node.node import Node, NodeSettings
    from consumers.providers import load_provider
    from consumers.reconciler import ReconcilerSettings
    from effectlog.durations import parse_duration_ms

    host, port = parse_http(http)
    host, port = metrics_host or host, port if metrics_port is None else metrics_port
    recovery = recovery_settings(stuck_after, command_timeout, kind_deadlines, poll)
    settings = NodeSettings(
        state_dir=Path(obj.state_dir), http_host=host, http_port=port, advertise=advertise,
        group=group, standbys=standbys, session_timeout_ms=parse_duration_ms(session_timeout),
        recovery=recovery,
        reconciler=ReconcilerSettings(policy=approval_policy(auto_retry, allow_risky)),
        observe_every_s=max(recovery.poll_s, 1.0))
    provider = load_provider(provider_spec) if provider_spec else None
    stop = stop_on_signals()
    node = Node(obj.log_url, settings, provider,
                extra_routes=console_routes(ConsoleSettings(token=console_token or None)))
    try:
        node.start()
    except BaseException:
        node.stop(5)
        node.close()
        raise
    click.echo(f"effectlog serve: query API, metrics on {node.url} (/v1/effects, /metrics, "
               f"/healthz; web console at / {'with decisions' if console_token else 'read-only'})",
               err=True)
    while not stop.wait(0.5) and not node.crashed.is_set():
        pass
    click.echo("effectlog serve: stopping", err=True)
    running = node.stop()
    if running:  # never close handles under a live thread; the OS reclaims them
        raise click.ClickException(f"the {', '.join(running)} loop(s) did not stop in time")
    node.close()
    if node.fatal is not None:
        raise node.fatal
    if node.failed:
        raise click.ClickException(f"stopped because the {', '.join(node.failed)} loop crashed")
    click.echo("effectlog serve: stopped", err=True)
