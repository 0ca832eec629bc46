"""Read-side commands on the projection: ``get``, ``list``, ``stats``.

They open the RocksDB projection read-only, so they run next to ``effectlog project``; on
the embedded log they first catch it up when it is behind (:mod:`effectlog.cli.freshness`).
Imports are kept to what each command needs: ``get --json`` loads neither fastavro, the
model nor rich, and prints the snapshot straight from its stored JSON form.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from effectlog.cli.context import EXIT_NOT_FOUND, EXIT_USAGE, CliContext, emit_json, fail
from effectlog.errors import InvalidInput
from effectlog.stats import STATES
from projections.paging import MAX_LIMIT

if TYPE_CHECKING:
    from effectlog.client import StateClient
    from projections.rocksdb.reader import RocksProjectionReader

F = TypeVar("F", bound=Callable[..., Any])


def _older_than_ms(text: str) -> int:
    from effectlog.durations import parse_duration_ms
    from effectlog.errors import InvalidInput

    try:
        return parse_duration_ms(text)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None


def _reader(obj: CliContext, families: tuple[str, ...] | None = None) -> RocksProjectionReader:
    """The projection, read-only; exit 2 (nothing created) when there is none."""
    from projections import open_reader

    reader = open_reader(obj.state_dir, families=families)
    if not reader.exists:
        reader.close()
        fail(_no_projection(obj), EXIT_USAGE)
    return reader


def _fresh_reader(obj: CliContext, families: tuple[str, ...],
                  catch_up: bool) -> RocksProjectionReader:
    """A reader of the projection, caught up first with the embedded log when it is behind
    (see :mod:`effectlog.cli.freshness`); ``catch_up=False`` reads it as it is."""
    if not catch_up:
        return _reader(obj, families)
    reader = _reader(obj, tuple(dict.fromkeys((*families, "state", "offsets", "metadata"))))
    if not reader.exists:
        return reader
    from effectlog.cli import freshness

    nexts = reader.next_offsets()
    where = f"the state under {Path(obj.state_dir).absolute()}"
    try:
        missing = freshness.lag(obj.log_url, nexts, reader.log_ids(), where)
    except BaseException:
        reader.close()
        raise
    if missing is None or missing <= 0:
        return reader
    reader.close()
    freshness.catch_up(obj, nexts.get(0, 0), nexts.get(0, 0) + missing)
    return _reader(obj, families)


def catch_up_option(command: F) -> F:
    """``--catch-up/--no-catch-up``, shared by the read commands."""
    return click.option(
        "--catch-up/--no-catch-up", "catch_up", default=True, show_default=True,
        help="On a SQLite log, first project what the log holds beyond the projection "
             "(bounded by --timeout); --no-catch-up reads the projection as it is.")(command)


#: ``--server URL`` of get/list/stats: read through a serve instance (comma-separated
#: URLs fail over), instead of the local projection.
server_option = click.option(
    "--server", "server", envvar="EFFECTLOG_SERVER", show_envvar=True, default=None,
    metavar="URL", help="Read through the effectlog serve instance at URL (several URLs, "
                        "comma-separated, fail over).")


def _client(obj: CliContext, server: str) -> StateClient:
    """The server client, waiting (and retrying a 503) at most ``--timeout`` seconds."""
    from effectlog.client import StateClient

    return StateClient(server, timeout_s=obj.timeout_s, retry_for_s=obj.timeout_s,
                       on_wait=lambda why: click.echo(why, err=True))


def _no_projection(obj: CliContext) -> str:
    from pathlib import Path

    return f"no projection at {Path(obj.state_dir).absolute()}: run `effectlog project` first"


def _age(ms: int, now: int) -> str:
    """``1d4h``, ``2h3m``, ``5m12s`` or ``40s``: the two largest units of an age."""
    seconds = max(0, now - ms) // 1000
    parts = [(seconds // 86_400, "d"), (seconds // 3600 % 24, "h"), (seconds // 60 % 60, "m"),
             (seconds % 60, "s")]
    while len(parts) > 1 and parts[0][0] == 0:
        parts.pop(0)
    return "".join(f"{n}{unit}" for n, unit in parts[:2])


@click.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="Print the snapshot as JSON.")
@catch_up_option
@server_option
@click.pass_obj
def get(obj: CliContext, key: str, as_json: bool, catch_up: bool, server: str | None) -> None:
    """Show the current state of one effect (exit 1 if the key is unknown)."""
    from effectlog.keys import validate_key

    validate_key(key)
    if server:
        with _client(obj, server) as client:
            state = client.get(key)
        snapshot = state.snapshot
        if state.stale_lag is not None:
            click.echo(f"stale: partition {state.partition} has no reachable owner (the group "
                       f"is moving it); answered by the standby copy on {state.served_by}, "
                       f"{state.stale_lag} records behind the log", err=True)
    else:
        reader = _fresh_reader(obj, ("state",), catch_up)
        try:
            snapshot = reader.get_json(key)
        finally:
            reader.close()
    if snapshot is None:
        fail(f"no effect with key {key}", EXIT_NOT_FOUND)
    if as_json:
        emit_json(snapshot)
        return
    from effectlog.cli.formatting import print_table, show_value

    rows = [[name, show_value(name, value)] for name, value in snapshot.items()
            if value is not None]
    print_table(None, ["field", "value"], rows, fold=("value",))


@click.command(name="list")
@click.option("--state", "state", type=click.Choice(STATES, case_sensitive=False), default=None,
              help="Only effects in this state (default: every state).")
@click.option("--older-than", "older_than", default=None, metavar="DUR",
              help="Only effects whose last transition is older than DUR (30s, 5m, 2h, 1d).")
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=100, show_default=True,
              help=f"Effects on this page, 1 to {MAX_LIMIT:,}.")
@click.option("--after", "after", default=None, metavar="CURSOR",
              help="Start past CURSOR: the one a cut list names on its last line.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of snapshots.")
@click.option("--keys", "keys_only", is_flag=True, help="Print only the keys, one a line.")
@catch_up_option
@server_option
@click.pass_obj
def list_effects(obj: CliContext, state: str | None, older_than: str | None, limit: int,
                 after: str | None, as_json: bool, keys_only: bool, catch_up: bool,
                 server: str | None) -> None:
    """List effects by state and age, oldest first: a range scan over the state/time index.

    Keys are shown whole (the table grows wider than the terminal rather than cut one);
    --keys prints one key a line, for pipes such as xargs. A list cut by --limit says so on
    stderr, with how many more match where that is known and the --after cursor to go on.
    """
    from projections.paging import format_cursor, parse_cursor

    if as_json and keys_only:
        raise click.UsageError("--json and --keys are alternatives: give one")
    try:
        cursor = parse_cursor(after) if after is not None else None
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--after") from None
    now = int(time.time() * 1000)
    cutoff = now - _older_than_ms(older_than) if older_than is not None else None
    states = [state.upper()] if state else list(STATES)
    total: int | None = None
    if server:
        with _client(obj, server) as client:
            snapshots, next_text = client.list_page(state.upper() if state else None,
                                                    older_than, limit, after)
            if next_text is not None and cutoff is None and cursor is None:
                total = _total(client.stats()["states"], states)
    else:
        from projections.paging import merge_pages, read_page

        reader = _fresh_reader(obj, ("state", "index", "metadata"), catch_up)
        try:
            page = merge_pages([read_page(reader, name, before_ms=cutoff, after=cursor,
                                          limit=limit) for name in states], limit)
            counts = reader.counts()
        finally:
            reader.close()
        snapshots = page.items
        next_text = None if page.next is None else format_cursor(page.next)
        if cutoff is None and cursor is None:
            total = _total({name: counts.get(f"state:{name}", 0) for name in STATES}, states)
    if as_json:
        emit_json(snapshots)
    elif keys_only:
        for snap in snapshots:
            click.echo(snap["idempotency_key"])
    else:
        from effectlog.cli.formatting import print_table

        rows = [[s["state"], s["fencing_epoch"], s["worker_id"], s["attempt"],
                 _age(s["occurred_at"], now), s["idempotency_key"]] for s in snapshots]
        print_table(f"{len(rows)} effect(s), oldest first",
                    ["state", "epoch", "worker", "attempt", "age", "key"], rows)
    if next_text is not None:
        click.echo(more_line(len(snapshots), total, next_text), err=True)


def _total(by_state: dict[str, int], states: list[str]) -> int:
    return sum(int(by_state.get(name, 0)) for name in states)


def more_line(shown: int, total: int | None, cursor: str) -> str:
    """The line that ends a cut list: how many more (when known) and how to page on."""
    more = f"{total - shown:,} more" if total is not None and total > shown else "more"
    return f"{more} — --limit N (up to {MAX_LIMIT:,}) or --after {cursor} to page"


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@catch_up_option
@server_option
@click.pass_obj
def stats(obj: CliContext, as_json: bool, catch_up: bool, server: str | None) -> None:
    """Effects per state, rejected events per reason, projector lag per partition.

    Exit 4 when the log cannot be reached (lag needs its end offsets).
    """
    if server:
        with _client(obj, server) as client:
            figures = client.stats()
    else:
        figures = collect_stats(obj, catch_up)
    if as_json:
        emit_json(figures)
        return
    from effectlog.cli.formatting import print_table

    print_table("effects by state", ["state", "count"],
                [[k, v] for k, v in figures["states"].items()])
    print_table("keys", ["keys", "count"],
                [["held (every state)", figures.get("held", 0)],
                 ["expired (settled, removed)", figures.get("expired", 0)]])
    print_table("metrics", ["metric", "count"], [[k, v] for k, v in figures["metrics"].items()])
    print_table("rejected events by reason", ["reason", "count"],
                [[k, v] for k, v in figures["rejected"].items()] or [["(none)", 0]])
    if figures["legacy_records"]:
        print_table("legacy records read", ["encoding", "records"],
                    [["fingerprint byte-reversed (pre-spec header)", figures["legacy_records"]]])
    print_table("projector lag", ["partition", "log end", "projected", "lag"],
                [[p, figures["end_offsets"][p], figures["next_offsets"].get(p, 0), lag]
                 for p, lag in figures["lag"].items()])


def collect_stats(obj: CliContext, catch_up: bool = True) -> dict[str, Any]:
    """The figures ``stats`` shows; other sections (metrics) can be added to the dict."""
    from pathlib import Path

    from effectlog.log.base import EVENTS
    from effectlog.redact import redact_url
    from effectlog.stats import stats_figures

    log = obj.open_log()
    try:
        log.end_offsets(EVENTS)  # first: an unreachable log is named within --timeout
        reader = _fresh_reader(obj, ("state", "offsets", "metadata"), catch_up)
        try:
            counts = reader.counts()
            nexts = reader.next_offsets()
        finally:
            reader.close()
        ends = log.end_offsets(EVENTS)
        log_url = log.url  # as resolved: a relative sqlite path shows absolute
    finally:
        log.close()
    return stats_figures(counts, nexts, ends, str(Path(obj.state_dir).absolute()),
                         redact_url(log_url))
