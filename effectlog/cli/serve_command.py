"""``serve``: one node of the projection cluster (see :mod:`consumers.node`).

Options are read once here into :class:`~consumers.node.node.NodeSettings`; SIGTERM or
SIGINT stops the node's loops after their current step and the process exits 0. A loop
that dies stops the node too: exit 4 when it died of its backend, 1 otherwise
(:func:`stop_error`), with one line naming the loop and the cause.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from effectlog.cli.context import EXIT_INTERNAL, CliContext
from effectlog.cli.project_commands import accept_gaps_option
from effectlog.cli.recovery_commands import (
    _with,
    approval_policy,
    recovery_options,
    recovery_settings,
    stop_on_signals,
)
from effectlog.errors import BackendUnavailable, EffectlogError, InvalidInput

if TYPE_CHECKING:
    from consumers.node.node import Node

logger = logging.getLogger(__name__)

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
@click.option("--session-timeout", default="6s", show_default=True, metavar="DUR",
              help="How long a silent member keeps its partitions (Kafka group session).")
@click.option("--provider", "provider_spec", envvar="EFFECTLOG_PROVIDER", default=None,
              metavar="SPEC",
              help="The provider that settles effects in doubt on the partitions this "
                   "instance owns: recovery and the reconciler run against it (module:factory, "
                   "fake:///path, http://host:port, mcp:///path/effects.toml; env "
                   "EFFECTLOG_PROVIDER). Required unless --no-recovery.")
@click.option("--no-recovery", "no_recovery", is_flag=True,
              help="Run neither recovery nor the reconciler here: an instance that only "
                   "projects, judges and answers. Effects in doubt on the partitions it owns "
                   "are then settled by nobody: give every member of a group the same choice.")
@click.option("--console-users", envvar="EFFECTLOG_CONSOLE_USERS", default=None, metavar="FILE",
              help="People who may retry or abandon effects in the web console, each with "
                   "their own name and password (hashed), recorded under that name: a file "
                   "written by effectlog console-users add. Without it or --console-token "
                   "the console is read-only.")
@click.option("--console-token", envvar="EFFECTLOG_CONSOLE_TOKEN", default=None, metavar="TOKEN",
              help="Lets people who log in with it retry or abandon effects from the web "
                   "console at / (env EFFECTLOG_CONSOLE_TOKEN); without it the console is "
                   "read-only.")
@click.option("--expire-after", default=None, metavar="DUR",
              help="Expire settled effects (SUCCEEDED, FAILED, ABANDONED) this long after "
                   "their last transition: a tombstone removes each from the log and the "
                   "projection, and its key used again is a new effect. Default: kept forever.")
@click.option("--purge-after", default="1d", show_default=True, metavar="DUR",
              help="With --expire-after on a log that is not compacted (SQLite): delete an "
                   "expired key's records once its tombstone is this old.")
@click.option("--metrics-port", type=int, default=None, hidden=True,
              help="Old name of the --http port.")
@click.option("--metrics-host", default=None, hidden=True, help="Old name of the --http host.")
@_with(recovery_options)
@click.option("--poll", default="5s", show_default=True, help="Recovery pass interval.")
@click.option("--auto-retry", multiple=True, metavar="KIND",
              help="Kind (prefix) the policy may retry without approval. Repeatable.")
@click.option("--allow-risky", multiple=True, metavar="KIND",
              help="Opt a payment*/browser* kind into --auto-retry explicitly.")
@accept_gaps_option
@click.pass_obj
def serve(obj: CliContext, http: str, advertise: str | None, group: str | None,
          standbys: int, session_timeout: str, provider_spec: str | None, no_recovery: bool,
          console_users: str | None, console_token: str | None,
          expire_after: str | None, purge_after: str,
          metrics_port: int | None, metrics_host: str | None,
          stuck_after: str, kind_deadlines: tuple[str, ...], command_timeout: str, poll: str,
          auto_retry: tuple[str, ...], allow_risky: tuple[str, ...], accept_gaps: bool) -> None:
    """Project, recover and reconcile the partitions this instance owns, and answer the
    query API (GET /v1/effects/KEY, /v1/effects, /v1/stats) and the web console (/)
    until SIGTERM."""
    from consumers.console import ConsoleSettings, console_routes
    from consumers.console.users import Users
    from consumers.node.node import Node, NodeSettings
    from consumers.providers import load_provider
    from consumers.reconciler import ReconcilerSettings
    from effectlog.durations import parse_duration_ms
    from projections.settings import ProjectorSettings

    recovers = _recovers(provider_spec, no_recovery)
    host, port = parse_http(http)
    host, port = metrics_host or host, port if metrics_port is None else metrics_port
    recovery = recovery_settings(stuck_after, command_timeout, kind_deadlines, poll)
    expiry = None
    if expire_after is not None:
        from consumers.expiry import ExpirySettings

        expiry = ExpirySettings(parse_duration_ms(expire_after) / 1000,
                                parse_duration_ms(purge_after) / 1000)
    settings = NodeSettings(
        state_dir=Path(obj.state_dir), http_host=host, http_port=port, advertise=advertise,
        group=group, standbys=standbys, session_timeout_ms=parse_duration_ms(session_timeout),
        recovery=recovery,
        reconciler=ReconcilerSettings(policy=approval_policy(auto_retry, allow_risky)),
        observe_every_s=max(recovery.poll_s, 1.0), expiry=expiry, recovers=recovers,
        projector=ProjectorSettings(accept_compaction_gaps=accept_gaps))
    provider = load_provider(provider_spec) if provider_spec else None
    users = Users.load(console_users) if console_users else None
    stop = stop_on_signals()
    node = Node(obj.log_url, settings, provider,
                extra_routes=console_routes(ConsoleSettings(
                    token=console_token or None, users=users, reconciles=provider is not None,
                    recovery=recovery)))
    try:
        node.start()
    except BaseException:
        node.stop(5)
        node.close()
        raise
    click.echo(f"effectlog serve: query API, metrics on {node.url} (/v1/effects, /metrics, "
               f"/healthz, /readyz; web console at / "
               f"{'with decisions' if users or console_token else 'read-only'}); "
               f"{_recovery_line(provider_spec)}", err=True)
    while not stop.wait(0.2) and not node.crashed.is_set():
        pass
    click.echo("effectlog serve: stopping", err=True)
    running, abandoned = _stop(node)
    if node.fatal is not None:
        raise node.fatal
    error = stop_error(node.failures, running)
    if error is not None:
        raise error
    click.echo("effectlog serve: stopped", err=True)
    if abandoned:  # threads blocked on a broker that is gone: exit without joining them
        logging.shutdown()
        sys.stderr.flush()
        os._exit(0)


def _recovers(provider_spec: str | None, no_recovery: bool) -> bool:
    """Whether serve runs recovery: with a provider, or not at all when told so; neither is
    refused (an instance that silently recovers nothing leaves its partitions in doubt)."""
    if provider_spec and no_recovery:
        raise InvalidInput("--provider and --no-recovery contradict each other: pick one")
    if not provider_spec and not no_recovery:
        raise InvalidInput("serve recovers the partitions it owns and needs the provider that "
                           "settles them: pass --provider SPEC (or set EFFECTLOG_PROVIDER), or "
                           "--no-recovery for an instance that only projects and answers")
    return not no_recovery


def _recovery_line(provider_spec: str | None) -> str:
    from effectlog.redact import redact_url

    if provider_spec is None:
        return "no recovery here (--no-recovery)"
    return f"recovery and reconciler for the partitions it owns, provider {redact_url(provider_spec)}"


def _stop(node: Node) -> tuple[list[str], bool]:
    """Stop the node within :data:`STOP_WITHIN_S` when its broker is gone: the loops still
    running, and whether anything was left behind (blocked on the broker)."""
    stopping = time.monotonic()
    running = node.stop(STOP_WITHIN_S)
    left: list[str] = []
    if running and not _log_answers(node):
        # the loops wait on a broker that is gone: leave them, as a kill would (every loop of
        # effectlog survives one by design); with the broker up they get the whole budget
        left, running = running, []
        logger.info("left the %s loop(s) waiting on the broker", ", ".join(left))
    elif set(running) - OBSERVERS:
        running = [name for name in node.stop() if name not in OBSERVERS]
    else:
        left, running = running, []  # observers that only read: nothing of theirs to close
    if running or left:  # never close handles under a live thread; the OS reclaims them
        return running, bool(left)
    closed = _close_within(node, STOP_WITHIN_S - (time.monotonic() - stopping))
    return running, not closed


#: How long a SIGTERM waits for the loops: ``serve`` exits within 3 s, broker or not.
STOP_WITHIN_S = 1.5
#: Loops that only read (metrics, the log's identity, the group's members): one blocked on a
#: broker that is gone is left behind at exit rather than waited for.
OBSERVERS = frozenset({"metrics", "log-watch", "membership"})


def _log_answers(node: Node) -> bool:
    """True unless the node's log is on a Kafka broker that does not answer now."""
    from effectlog.log.kafka import KafkaLog
    from effectlog.log.kafka.admin import answers

    log = node.logs["api"]
    return not isinstance(log, KafkaLog) or answers(log.settings, 0.3)


def _close_within(node: Node, budget_s: float) -> bool:
    """Close the node's handles, waiting at most ``budget_s`` (at least half a second): with
    the broker gone a group consumer's close waits out its session; what is left then is
    what a kill leaves, which every part of effectlog survives by design."""
    closing = threading.Thread(target=node.close, name="close", daemon=True)
    closing.start()
    closing.join(max(0.5, budget_s))
    if closing.is_alive():
        logger.info("left closing the node's handles (the broker does not answer)")
        return False
    return True


class LoopCrashed(EffectlogError):
    """A loop of ``serve`` died of something other than its backend: an internal error
    (exit 1, as any command's unexpected error)."""

    exit_code = EXIT_INTERNAL


def stop_error(failures: Sequence[tuple[str, Exception]],
               running: Sequence[str] = ()) -> EffectlogError | None:
    """Why ``serve`` stopped by itself, as the error whose exit code says so; None for a
    clean stop. The first loop that died decides: of a backend fault (the log or broker
    unavailable, an OS error such as a full disk, a RocksDB error) exit 4, of a setting the
    broker refuses exit 2, of anything else exit 1 (an internal error). Loops still
    running after the stop are named, and alone are exit 1 as well."""
    stuck = f"the {', '.join(running)} loop(s) did not stop in time" if running else ""
    if not failures:
        return LoopCrashed(f"internal error: {stuck}") if stuck else None
    name, exc = failures[0]
    others = [n for n, _ in failures[1:] if n != name]
    tail = (f" (then the {', '.join(others)} loop(s) too)" if others else "") + \
        (f"; {stuck}" if stuck else "")
    if isinstance(exc, BackendUnavailable):
        return BackendUnavailable(f"the {name} loop stopped: {exc}{tail}")
    if isinstance(exc, InvalidInput):  # a setting the broker refuses (exit 2)
        return InvalidInput(f"the {name} loop stopped: {exc}{tail}")
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return BackendUnavailable(f"the {name} loop stopped: {exc.strerror or exc}{where}{tail}")
    if type(exc) is Exception:  # rocksdict's one error type: a RocksDB status
        return BackendUnavailable(f"the {name} loop stopped: projection storage error: "
                                  f"{exc}{tail}")
    return LoopCrashed(f"internal error: the {name} loop crashed: {type(exc).__name__}: "
                       f"{exc}{tail}")
