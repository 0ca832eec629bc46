"""Read-side commands on the projection: ``get``, ``list``, ``stats``.

They open the RocksDB projection read-only, so they run next to ``effectlog project``.
Imports are kept to what each command needs: ``get --json`` loads neither fastavro, the
model nor rich, and prints the snapshot straight from its stored JSON form.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from effectlog.cli.context import EXIT_NOT_FOUND, CliContext, emit_json, fail

if TYPE_CHECKING:
    from effectlog.client import StateClient
    from projections.rocksdb.reader import RocksProjectionReader

from effectlog.stats import STATES


def _older_than_ms(text: str) -> int:
    from effectlog.durations import parse_duration_ms
    from effectlog.errors import InvalidInput

    try:
        return parse_duration_ms(text)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None


def _reader(obj: CliContext, families: tuple[str, ...] | None = None) -> RocksProjectionReader:
    from projections import open_reader

    return open_reader(obj.state_dir, families=families)


#: ``--server URL`` of get/list/stats: read through a serve instance (comma-separated
#: URLs fail over), instead of the local projection.
server_option = click.option(
    "--server", "server", envvar="EFFECTLOG_SERVER", show_envvar=True, default=None,
    metavar="URL", help="Read through `effectlog serve` at URL (several: comma-separated).")


def _client(server: str) -> StateClient:
    from effectlog.client import StateClient

    return StateClient(server)


def _no_projection(obj: CliContext) -> str:
    return f"no projection under {obj.state_dir}: run `effectlog project` first"


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


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
@server_option
@click.pass_obj
def get(obj: CliContext, key: str, as_json: bool, server: str | None) -> None:
    """Show the current state of one effect (exit 1 if the key is unknown)."""
    if server:
        with _client(server) as client:
            snapshot, exists = client.get(key).snapshot, True
    else:
        reader = _reader(obj, ("state",))
        try:
            snapshot = reader.get_json(key)
            exists = reader.exists
        finally:
            reader.close()
    if snapshot is None:
        fail(f"no effect with key {key}" if exists else _no_projection(obj), EXIT_NOT_FOUND)
        return
    if as_json:
        emit_json(snapshot)
        return
    rows = [[name, _show(value)] for name, value in snapshot.items() if value is not None]
    _table(key, ["field", "value"], rows)


def _show(value: Any) -> str:
    if isinstance(value, dict | list):
        import json

        return json.dumps(value, sort_keys=True)
    return str(value)


@click.command(name="list")
@click.option("--state", "state", type=click.Choice(STATES, case_sensitive=False), default=None,
              help="Only effects in this state (default: every state).")
@click.option("--older-than", "older_than", default=None, metavar="DUR",
              help="Only effects whose last transition is older than DUR (30s, 5m, 2h, 1d).")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array of snapshots.")
@server_option
@click.pass_obj
def list_effects(obj: CliContext, state: str | None, older_than: str | None, limit: int,
                 as_json: bool, server: str | None) -> None:
    """List effects by state and age, oldest first: a range scan over the state/time index."""
    now = int(time.time() * 1000)
    cutoff = now - _older_than_ms(older_than) if older_than is not None else None
    if server:
        with _client(server) as client:
            snapshots = client.list(state.upper() if state else None, older_than, limit)
    else:
        states = [state.upper()] if state else list(STATES)
        reader = _reader(obj, ("state", "index"))
        try:
            found = [(at, snap) for name in states
                     for at, snap in _scan(reader, name, cutoff, limit)]
        finally:
            reader.close()
        found.sort(key=lambda item: (item[0], item[1]["idempotency_key"]))
        snapshots = [snap for _, snap in found[:limit]]
    if as_json:
        emit_json(snapshots)
        return
    rows = [[s["idempotency_key"], s["state"], s["fencing_epoch"], s["worker_id"], s["attempt"],
             _age(s["occurred_at"], now)] for s in snapshots]
    _table(f"{len(rows)} effect(s)", ["key", "state", "epoch", "worker", "attempt", "age"], rows)


def _scan(reader: RocksProjectionReader, state: str, cutoff: int | None,
          limit: int) -> list[tuple[int, dict[str, Any]]]:
    from projections.rocksdb.snapshot import snapshot_json

    return [(at, snapshot_json(raw)) for at, _, raw in reader.scan_raw(state, cutoff, limit)]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@server_option
@click.pass_obj
def stats(obj: CliContext, as_json: bool, server: str | None) -> None:
    """Effects per state, rejected events per reason, projector lag per partition.

    Exit 4 when the log cannot be reached (lag needs its end offsets).
    """
    if server:
        with _client(server) as client:
            figures = client.stats()
    else:
        figures = collect_stats(obj)
    if as_json:
        emit_json(figures)
        return
    _table("effects by state", ["state", "count"], [[k, v] for k, v in figures["states"].items()])
    _table("metrics", ["metric", "count"], [[k, v] for k, v in figures["metrics"].items()])
    _table("rejected events by reason", ["reason", "count"],
           [[k, v] for k, v in figures["rejected"].items()] or [["(none)", 0]])
    if figures.get("legacy_records"):
        _table("legacy records read", ["encoding", "records"],
               [["fingerprint byte-reversed (pre-spec header)", figures["legacy_records"]]])
    _table("projector lag", ["partition", "log end", "projected", "lag"],
           [[p, figures["end_offsets"][p], figures["next_offsets"].get(p, 0), lag]
            for p, lag in figures["lag"].items()])


def collect_stats(obj: CliContext) -> dict[str, Any]:
    """The figures ``stats`` shows; other sections (metrics) can be added to the dict."""
    from effectlog.log.base import EVENTS
    from effectlog.stats import stats_figures

    reader = _reader(obj, ("offsets", "metadata"))
    try:
        counts = reader.counts()
        nexts = reader.next_offsets()
    finally:
        reader.close()
    log = obj.open_log()
    try:
        ends = log.end_offsets(EVENTS)
    finally:
        log.close()
    return stats_figures(counts, nexts, ends, str(obj.state_dir))
