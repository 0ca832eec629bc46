"""``recover``, ``reconcile``, ``approve`` and ``fake-provider``: settling effects in doubt.

Options are read once here and passed on as settings objects; the work itself lives in
:mod:`consumers`.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from effectlog.cli.context import EXIT_UNAVAILABLE, CliContext, emit_json, fail
from effectlog.errors import BackendUnavailable, EffectlogError, InvalidInput
from effectlog.keys import MAX_FENCING_EPOCH

if TYPE_CHECKING:
    from consumers.policy import ApprovalPolicy
    from consumers.recovery import RecoverySettings
    from effectlog.judge.query import Judge
    from effectlog.log.base import EventLog


def _seconds(text: str) -> float:
    from effectlog.durations import parse_duration_ms

    return parse_duration_ms(text) / 1000


def recovery_settings(stuck_after: str, command_timeout: str, kind_deadlines: tuple[str, ...],
                      poll: str = "5s") -> RecoverySettings:
    """Settings from CLI strings: ``--kind-deadline payment.=1h`` overrides per kind."""
    from consumers.recovery import RecoverySettings

    per_kind: dict[str, float] = {}
    for item in kind_deadlines:
        kind, sep, duration = item.partition("=")
        if not sep or not kind:
            raise InvalidInput(f"--kind-deadline {item!r}: use KIND=DURATION, e.g. payment.=1h")
        per_kind[kind] = _seconds(duration)
    return RecoverySettings(stuck_after_s=_seconds(stuck_after), per_kind=per_kind,
                            command_timeout_s=_seconds(command_timeout), poll_s=_seconds(poll))


def approval_policy(auto_retry: tuple[str, ...], allow_risky: tuple[str, ...]) -> ApprovalPolicy:
    from consumers.policy import ApprovalPolicy

    return ApprovalPolicy(auto_retry=auto_retry, allow_risky=allow_risky)


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (the main thread installs the handlers)."""
    stop = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


F = TypeVar("F", bound=Callable[..., Any])

recovery_options: list[Callable[[F], F]] = [
    click.option("--stuck-after", default="5m", show_default=True,
                 help="How long an effect may sit in RESERVED/DISPATCHED/UNKNOWN (90s, 5m, 1h)."),
    click.option("--kind-deadline", "kind_deadlines", multiple=True, metavar="KIND=DUR",
                 help="Per-kind deadline; a kind or prefix, e.g. payment.=1h. Repeatable."),
    click.option("--command-timeout", default="10m", show_default=True,
                 help="After this, an unanswered command is issued again."),
]


def _with(options: list[Callable[[F], F]]) -> Callable[[F], F]:
    """Apply a shared list of click options (``serve`` reuses the recovery ones)."""
    def decorate(fn: F) -> F:
        for option in reversed(options):
            fn = option(fn)
        return fn
    return decorate


@click.command()
@click.option("--once", is_flag=True, help="One pass, then exit.")
@_with(recovery_options)
@click.option("--server", envvar="EFFECTLOG_SERVER", default=None, metavar="URL",
              help="Ask the serve instances (comma-separated; env EFFECTLOG_SERVER) instead of "
                   "a local projection: each runs the pass, with these deadlines, over the "
                   "partitions it owns.")
@click.option("--json", "as_json", is_flag=True, help="Report as JSON.")
@click.pass_obj
def recover(obj: CliContext, once: bool, stuck_after: str, kind_deadlines: tuple[str, ...],
            command_timeout: str, server: str | None, as_json: bool) -> None:
    """Find stuck effects in the projection and emit reconciliation commands; say which
    partitions the pass did not cover (exit 4)."""
    from effectlog.cli.recover_passes import ClusterPasses, LocalPasses

    settings = recovery_settings(stuck_after, command_timeout, kind_deadlines)
    passes = ClusterPasses(server, settings, obj.timeout_s) if server else \
        LocalPasses.open(obj, settings)
    try:
        if not once:
            click.echo(f"effectlog recover: a pass every {settings.poll_s:g}s until SIGTERM "
                       "(--once for one pass)", err=True)
            passes.run(stop_on_signals(), settings.poll_s)
            return
        report = passes.once()
    finally:
        passes.close()
    rows = report["issued"]
    if as_json:
        emit_json(report)
    else:
        for row in rows:
            click.echo(f"reconcile {row['idempotency_key']}  ({row['reason']})")
        click.echo(f"{len(rows)} command(s) issued, {report['outstanding']} outstanding, "
                   f"{report['backing_off']} backing off")
    if report["uncovered"]:
        from effectlog.cli.recover_passes import uncovered_text

        fail(uncovered_text(report["uncovered"], passes.hint), EXIT_UNAVAILABLE)


@click.command()
@click.option("--provider", "provider_spec", envvar="EFFECTLOG_PROVIDER", required=True,
              metavar="SPEC",
              help="module:factory, fake:///path/provider.db, http://host:port or "
                   "mcp:///path/effects.toml (env EFFECTLOG_PROVIDER, as serve)")
@click.option("--once", is_flag=True, help="Handle the commands there are now, then exit.")
@click.option("--worker-id", default=None, help="Writer identity (default reconciler:HOST:PID).")
@click.option("--auto-retry", multiple=True, metavar="KIND",
              help="Kind (prefix) the policy may retry without approval. Repeatable.")
@click.option("--allow-risky", multiple=True, metavar="KIND",
              help="Opt a payment*/browser* kind into --auto-retry explicitly.")
@click.option("--server", envvar="EFFECTLOG_SERVER", default=None, metavar="URL",
              help="The judge of its writes: serve instances (comma-separated; env "
                   "EFFECTLOG_SERVER). Needed on Kafka, where the log has no compare-and-append.")
@click.option("--json", "as_json", is_flag=True, help="Report as JSON lines.")
@click.pass_obj
def reconcile(obj: CliContext, provider_spec: str, once: bool, worker_id: str | None,
              auto_retry: tuple[str, ...], allow_risky: tuple[str, ...], server: str | None,
              as_json: bool) -> None:
    """Consume reconciliation commands and settle each effect per the recovery table.

    Every write is judged before the provider is called again: on SQLite by the conditional
    append, elsewhere by the judge of effectlog serve (--server)."""
    from consumers.bookkeeping import OffsetStore, consumer_db_path
    from consumers.providers import load_provider
    from consumers.reconciler import Reconciler, ReconcilerSettings

    policy = approval_policy(auto_retry, allow_risky)
    settings = ReconcilerSettings(policy=policy) if worker_id is None else \
        ReconcilerSettings(worker_id=worker_id, policy=policy)
    log = obj.open_log()  # first: a wrong or unreachable log leaves no provider file behind
    try:
        log.verify()
        judge = _judge(log, server, obj.timeout_s)  # so does a refused one (no --server)
    except BaseException:
        log.close()
        raise
    try:
        provider = load_provider(provider_spec)
    except BaseException:
        if judge is not None:
            judge.close()
        log.close()
        raise
    offsets = OffsetStore(consumer_db_path(obj.state_dir, "reconciler"))
    reconciler = Reconciler(log, provider, offsets, settings, judge=judge)
    try:
        if not once:
            click.echo("effectlog reconcile: settling commands as they come until SIGTERM "
                       "(--once for those there are now)", err=True)
            reconciler.run(stop_on_signals())
            return
        done = reconciler.run_pass()
    finally:
        offsets.close()
        if judge is not None:
            judge.close()
        log.close()
    handled = done.handled
    for item in handled:
        row = {"idempotency_key": item.key, "action": item.action.value, "reason": item.reason,
               "state": item.state.value if item.state else None}
        if as_json:
            emit_json(row)
        else:
            click.echo(f"{item.action.value:<15} {item.key} -> {row['state']}  ({item.reason})")
    if not as_json:
        click.echo(f"{len(handled)} command(s) handled")
    if done.unreached:
        from consumers.reconciler import unreached_text

        fail(unreached_text(done.unreached), EXIT_UNAVAILABLE)


@click.command()
@click.argument("key")
@click.option("--decision", required=True, type=click.Choice(["retry", "abandon"],
                                                             case_sensitive=False))
@click.option("--by", "by", required=True, help="Who decides (recorded in the history).")
@click.option("--reason", required=True, help="Why (recorded in the history).")
@click.option("--server", envvar="EFFECTLOG_SERVER", default=None, metavar="URL",
              help="The judge of the decision: serve instances (comma-separated; env "
                   "EFFECTLOG_SERVER). Needed on Kafka, where the log has no compare-and-append.")
@click.option("--epoch", "seen_epoch", type=click.IntRange(0, MAX_FENCING_EPOCH), default=None,
              help="The fencing epoch of the state you decided on (shown by get): refused "
                   "(exit 3) if the effect moved on since, e.g. a first retry already ran.")
@click.option("--json", "as_json", is_flag=True, help="Print the APPROVE event as JSON.")
@click.pass_obj
def approve(obj: CliContext, key: str, decision: str, by: str, reason: str,
            server: str | None, seen_epoch: int | None, as_json: bool) -> None:
    """Decide on an effect in UNKNOWN or AWAITING_APPROVAL: retry (same key) or abandon."""
    from consumers.approvals import approve as append_decision
    from effectlog.keys import validate_key

    validate_key(key)
    log = obj.open_log()
    judge = None
    try:
        log.verify()
        judge = _judge(log, server, obj.timeout_s)
        event = append_decision(log, key, decision, by, reason, judge=judge,
                                seen_epoch=seen_epoch)
    finally:
        if judge is not None:
            judge.close()
        log.close()
    if as_json:
        emit_json(event.to_json())
    else:
        from effectlog.text import printable

        click.echo(printable(f"{key}: {decision.upper()} by {by} -> {event.state.value} "
                             f"(epoch {event.fencing_epoch})"))


def _judge(log: EventLog, server: str | None, timeout_s: float) -> Judge | None:
    """The judge of a command's writes: ``server``'s, or None where the log has
    compare-and-append; a log without it and no server is refused with one line (exit 2)."""
    if server is None:
        if log.conditional:
            return None
        raise InvalidInput(f"on {log.url} writes are judged by `effectlog serve`: pass --server "
                           "URL (or set EFFECTLOG_SERVER)")
    from effectlog.judge.client import ClusterJudge

    return ClusterJudge(server, timeout_s=timeout_s, wait_s=timeout_s, retry_for_s=timeout_s)


@click.group("fake-provider")
def fake_provider() -> None:
    """The bundled fake provider (results by key in SQLite), for trials and demos."""


@fake_provider.command("serve")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="TCP port (0: any free one).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--db", "db_path", required=True, type=click.Path(dir_okay=False),
              help="SQLite file of the fake's results (created if missing, in a directory "
                   "that exists).")
@click.option("--lookup-incomplete", is_flag=True, help="Declare lookups incomplete.")
@click.option("--retention", default="30d", show_default=True, help="Declared result retention.")
def serve_fake(port: int, host: str, db_path: str, lookup_incomplete: bool,
               retention: str) -> None:
    """Serve the fake over HTTP with Idempotency-Key semantics until SIGTERM/Ctrl-C."""
    import os

    from consumers.providers.fake import FakeProvider, check_db_path
    from consumers.providers.http_server import FakeProviderServer

    retention_s = _seconds(retention)
    try:
        check_db_path(db_path, "the fake provider's database")
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--db") from None
    existed = os.path.lexists(db_path)
    provider = FakeProvider(db_path, lookup_complete=not lookup_incomplete,
                            retention_s=retention_s)
    try:
        server = FakeProviderServer(provider, host, port).start()
    except BaseException as exc:  # e.g. the port is taken: leave no new database behind
        provider.close()
        for path in ([] if existed else [db_path, f"{db_path}-wal", f"{db_path}-shm"]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if isinstance(exc, OSError):
            raise _bind_error(host, port, exc) from None
        raise
    click.echo(f"fake provider on {server.url} (db {db_path}); use --provider {server.url}",
               err=True)
    stop_on_signals().wait()
    server.close()
    provider.close()


def _bind_error(host: str, port: int, exc: OSError) -> EffectlogError:
    """A host that is no address of this machine is bad input (2); a port taken or not
    permitted is the environment's (4)."""
    import errno
    import socket

    text = f"cannot serve on {host}:{port}: {exc.strerror or exc}"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return InvalidInput(text)
    return BackendUnavailable(text)
