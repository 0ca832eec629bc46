"""``effectlog expire``: remove settled effects older than a retention (bounded state)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import click

from effectlog.cli.context import CliContext, emit_json
from effectlog.cli.output_file import output_file
from effectlog.cli.read_commands import _client, _fresh_reader, catch_up_option, server_option
from effectlog.errors import InvalidInput

if TYPE_CHECKING:
    from consumers.expiry import Expiring

SETTLED_NAMES = ("SUCCEEDED", "FAILED", "ABANDONED")


def _candidates(obj: CliContext, server: str | None, older_than: str, cutoff: int, limit: int,
                catch_up: bool) -> list[Expiring]:
    """Settled effects whose last transition was logged before ``cutoff``, from the
    projection (local, or the group's through ``server``)."""
    if server:
        found: list[Expiring] = []
        with _client(obj, server) as client:
            for state in SETTLED_NAMES:
                after = None
                while len(found) < limit:
                    page, after = client.list_page(state, older_than,
                                                   min(1000, limit - len(found)), after)
                    found.extend((str(s["idempotency_key"]), str(s["event_id"])) for s in page)
                    if after is None:
                        break
        return found[:limit]
    from consumers.expiry import expiring

    reader = _fresh_reader(obj, ("state", "index", "metadata"), catch_up)
    try:
        return expiring(reader, cutoff, limit)
    finally:
        reader.close()


def _archive(log: Any, keys: list[str], path: str) -> int:
    """Write the records of ``keys`` to ``path`` as ``replay --format avro`` would."""
    from effectlog.audit import Replay, ReplayFilter, write_avro
    from effectlog.cli.replay_command import _open_private, _published
    from effectlog.redact import redact_url

    run = Replay(log, ReplayFilter(keys=frozenset(keys)), published=_published(log, None))
    meta = {"effectlog.log": redact_url(log.url),
            "effectlog.scope": json.dumps({"expired_keys": len(keys)}, sort_keys=True)}
    with _open_private(path, binary=True) as handle:
        return write_avro(iter(run), handle, meta)


@click.command()
@click.option("--older-than", "older_than", required=True, metavar="DUR",
              help="Expire settled effects (SUCCEEDED, FAILED, ABANDONED) whose last "
                   "transition is older than DUR (24h, 30d): the retention.")
@click.option("--archive", metavar="FILE", type=click.Path(dir_okay=False), callback=output_file,
              help="First write those effects' records to FILE (created 0600), in the Avro "
                   "archive format of replay --format avro; nothing expires if that fails.")
@click.option("--purge-after", default="1d", show_default=True, metavar="DUR",
              help="On a log that is not compacted (SQLite): delete an expired key's records "
                   "once its tombstone is this old (Kafka's compaction does it there).")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=10_000, show_default=True,
              help="Expire at most this many effects in this run.")
@click.option("--dry-run", is_flag=True, help="Only say which effects would expire.")
@click.option("--json", "as_json", is_flag=True, help="Report as JSON.")
@catch_up_option
@server_option
@click.pass_obj
def expire(obj: CliContext, older_than: str, archive: str | None, purge_after: str, limit: int,
           dry_run: bool, as_json: bool, catch_up: bool, server: str | None) -> None:
    """Expire settled effects older than a retention: a tombstone per key on the log.

    The projector removes each settled key on its tombstone (state, index; counted in
    stats as expired) and rejects one for an open key, so nothing open is ever lost. A key
    used again after it expired is a NEW effect: keep the retention at least as long as
    any worker may retry an operation, and no longer than the provider keeps its own
    idempotency keys. serve --expire-after DUR does the same continuously.

    Exit codes: 0 done (or nothing to expire), 2 bad option or no projection, 4 log or
    projection unreachable, archive not writable.
    """
    from consumers.expiry import ExpirySettings, expire_pass
    from effectlog.durations import parse_duration_ms

    try:
        retention_ms = parse_duration_ms(older_than)
        settings = ExpirySettings(retention_ms / 1000, parse_duration_ms(purge_after) / 1000)
    except InvalidInput as exc:
        raise click.UsageError(str(exc)) from None
    now = int(time.time() * 1000)
    effects = _candidates(obj, server, older_than, now - retention_ms, limit, catch_up)
    keys = [key for key, _ in effects]
    report: dict[str, Any] = {"older_than": older_than, "keys": len(keys), "dry_run": dry_run,
                              "archive": archive, "archived_records": 0, "purged": 0}
    if not dry_run:
        log = obj.open_log(against_state=False)
        try:
            if archive is not None and keys:
                report["archived_records"] = _archive(log, keys, archive)
            done = expire_pass(log, effects, settings, now)
        finally:
            log.close()
        report["purged"], keys = done.purged, done.expired
    if as_json:
        emit_json({**report, "expired": [] if dry_run else keys,
                   "would_expire": keys if dry_run else []})
        return
    verb = "would expire" if dry_run else "expired"
    saved = f"; archived {report['archived_records']} records to {archive}" if archive and \
        not dry_run else ""
    click.echo(f"{verb} {len(keys)} settled effects older than {older_than}{saved}; "
               f"purged {report['purged']} records")
