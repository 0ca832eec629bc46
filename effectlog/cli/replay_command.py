"""``effectlog replay``: stream the events topic for audits and verify every key's history."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from effectlog.audit import Replay, ReplayFilter, ReplaySummary, parse_time, write_avro, write_jsonl
from effectlog.cli.context import EXIT_CONFLICT, EXIT_NOT_FOUND, CliContext, fail
from effectlog.cli.output_file import output_file
from effectlog.errors import InvalidInput
from effectlog.log.base import EventLog
from effectlog.redact import redact_url
from effectlog.text import printable
from effectlog.verifier import Published


def _time(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """Parse --since/--until: ISO-8601, epoch milliseconds, or a duration before now."""
    if value is None:
        return None
    try:
        return parse_time(value)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


def _open_private(path: str, binary: bool) -> IO[Any]:
    """Open ``path`` for writing, created 0600: archives may hold payloads."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")


@contextlib.contextmanager
def _output(out: str, binary: bool) -> Iterator[IO[Any]]:
    if out == "-":
        yield sys.stdout.buffer if binary else sys.stdout
        return
    with _open_private(out, binary) as handle:
        yield handle


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[tuple[Callable[[int], None] | None,
                                              Callable[[int], None]]]:
    """(advance, set_total) for a rich bar on stderr, or no-ops when stderr is not a TTY."""
    if not enabled:
        yield None, lambda total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("replay", total=None)
        yield (lambda n: bar.advance(task, n)), (lambda total: bar.update(task, total=total))


def _published(log: EventLog, key: str | None) -> dict[int, Published] | None:
    """On a compacted log, what each partition's owner last published (see
    :mod:`effectlog.verifier`); None where the log keeps every record."""
    if not log.compacted:
        return None
    from effectlog.log.base import EVENTS
    from projections.published import read_published

    partitions = (range(log.partitions(EVENTS)) if key is None
                  else [log.partition_for(EVENTS, key)])
    return read_published(log, partitions, key)


def _print_summary(summary: ReplaySummary) -> None:
    scope = summary.scope
    window = "" if scope["history"] == "full" else " (window: verified from each key's first event in it)"
    click.echo(f"replayed {summary.records} records: {summary.events} events, "
               f"{summary.undecodable} undecodable, {summary.keys} keys{window}", err=True)
    if scope.get("published"):
        marks = ", ".join(f"{p}:{o}" for p, o in scope["published"].items())
        click.echo(f"judged below each partition's published offset ({marks}) by what its "
                   f"owner accepted; compaction removed {summary.compacted_accepted} accepted "
                   "events of these keys", err=True)
    if summary.expiries:
        click.echo(f"{summary.expiries} expiries (tombstones of settled effects)", err=True)
    if summary.unjudged:
        click.echo(f"{summary.unjudged} records not judged: older than an expiry of their key "
                   "or than the accepted positions kept for it", err=True)
    if summary.partial_keys:
        click.echo(f"{summary.partial_keys} keys start after their CREATE", err=True)
    if not summary.violation_count:
        click.echo("violations: 0", err=True)
        return
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(summary.by_reason.items()))
    click.echo(f"violations: {summary.violation_count} ({reasons})", err=True)
    for v in summary.violations:  # keys and details come from the log: escaped
        click.echo(printable(f"  {v.position.partition}:{v.position.offset}  {v.key}  "
                             f"{v.reason}: {v.detail}"), err=True)
    if summary.violation_count > len(summary.violations):
        click.echo(f"  … {summary.violation_count - len(summary.violations)} more", err=True)


@click.command()
@click.option("--key", help="Only this idempotency key (its whole history).")
@click.option("--since", metavar="T", callback=_time,
              help="Records with a log timestamp at or after T: ISO-8601, epoch ms, or 2h/1d ago.")
@click.option("--until", metavar="T", callback=_time, help="Records with a log timestamp before T.")
@click.option("--format", "fmt", type=click.Choice(["jsonl", "avro"]), default="jsonl",
              show_default=True, help="JSON lines, or an Avro Object Container File.")
@click.option("--out", default="-", show_default=True, metavar="FILE", callback=output_file,
              type=click.Path(dir_okay=False, allow_dash=True),
              help="Output file (created 0600); - is stdout.")
@click.option("--json", "as_json", is_flag=True,
              help="Summary as JSON: on stdout when --out is a file, else on stderr.")
@click.pass_obj
def replay(obj: CliContext, key: str | None, since: int | None, until: int | None, fmt: str,
           out: str, as_json: bool) -> None:
    """Stream the events topic for audits and verify every key's history.

    Reads every partition up to its end at the start (or one key's records), in log order,
    and writes one record per event with its position and log timestamp; undecodable
    records appear with the reason and their raw bytes. Each event is judged against the
    running fold of its key with the projector's rules: illegal transitions, stale or
    unclaimed epochs, epoch regressions, payload hash changes under one key, duplicates
    and undecodable records are listed on stderr with their position.

    Verification covers only what was streamed: --key checks that key alone, --until
    ignores later events, and with --since a key's first event in the window is taken as
    its baseline snapshot. Without --since a key must start with CREATE, except on a
    compacted topic (Kafka): there the records below each partition's last publication to
    the state topic are judged by what its owner accepted (a surviving record it rejected
    is listed with its reason), later records are folded from the published state, and the
    summary says how many accepted events compaction removed.

    Exit status: 0 when the history is clean, 3 when there are violations, 1 when --key
    has no events (in the window), 2 for bad options or a missing log, 4 when the log cannot be read.
    """
    try:
        selection = ReplayFilter(key=key, since_ms=since, until_ms=until)
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from None
    if fmt == "avro" and out == "-" and sys.stdout.isatty():
        raise click.UsageError("refusing to write Avro to a terminal: use --out FILE or a pipe")
    log = obj.open_log(against_state=False)
    try:
        log.verify()  # an audit of a log its backend reports damaged fails loudly (exit 4)
        published = _published(log, key) if since is None else None
        with _progress(sys.stderr.isatty()) as (advance, set_total):
            run = Replay(log, selection, progress=advance, published=published)
            total = run.total()
            if key is not None and total == 0:
                fail(f"no events for key {key}", EXIT_NOT_FOUND)
            set_total(total)
            with _output(out, binary=fmt == "avro") as handle:
                if fmt == "avro":
                    meta = {"effectlog.log": redact_url(log.url),
                            "effectlog.scope": json.dumps(run.summary.scope, sort_keys=True)}
                    write_avro(iter(run), handle, meta)
                else:
                    write_jsonl(iter(run), handle)
    finally:
        log.close()
    summary = run.summary
    if key is not None and not summary.records:
        fail(f"no events for key {key}", EXIT_NOT_FOUND)
    if as_json:
        click.echo(json.dumps(summary.to_json(), sort_keys=True), err=out == "-")
    else:
        _print_summary(summary)
    if summary.violation_count:
        click.get_current_context().exit(EXIT_CONFLICT)
