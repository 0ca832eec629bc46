"""Commands that talk to the event log directly: ``append``, ``history``, ``topics``."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import click

from effectlog.cli.append_input import parse_line
from effectlog.cli.context import EXIT_NOT_FOUND, EXIT_USAGE, CliContext, emit_json, fail
from effectlog.errors import EffectlogError, InvalidInput
from effectlog.model import EffectEvent, Transition


def _apply(worker: Any, request: dict[str, Any], number: int) -> EffectEvent:
    from effectlog.keys import make_key

    transition = Transition.parse(request["transition"])
    payload = request.get("payload")
    if transition is Transition.CREATE:
        return worker.create(request["operation_id"], request["kind"], request["target"], payload,  # type: ignore[no-any-return]
                             payload_ref=request.get("payload_ref"))
    key = make_key(request["operation_id"], request["kind"], request["target"])
    if "payload" in request:
        _check_payload(worker, key, payload)
    epoch = request.get("fencing_epoch")
    if transition is Transition.RESERVE:
        return worker.reserve(key, epoch=epoch)  # type: ignore[no-any-return]
    if transition is Transition.CLAIM:
        return worker.claim(key, epoch=epoch)  # type: ignore[no-any-return]
    if transition is Transition.DISPATCH:
        return worker.dispatch(key, epoch=epoch)  # type: ignore[no-any-return]
    if transition is Transition.RECORD:
        outcome = request["outcome"]  # checked by parse_line
        return worker.record(key, outcome["status"], outcome.get("result"), epoch=epoch)  # type: ignore[no-any-return]
    if transition is Transition.UNKNOWN:
        return worker.unknown(key, str(request.get("error") or "reported unknown"), epoch=epoch)  # type: ignore[no-any-return]
    return worker.await_approval(key, str(request.get("error") or "needs approval"), epoch=epoch)  # type: ignore[no-any-return]


def _check_payload(worker: Any, key: str, payload: Any) -> None:
    from effectlog.errors import PayloadMismatch
    from effectlog.keys import payload_hash

    current = worker.get(key)
    if current is not None and current.payload_hash != payload_hash(payload):
        raise PayloadMismatch(f"payload differs from the original under key {key}")


@click.command()
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Print a line only once its event is known to be accepted. --no-verify is "
                   "refused where that needs the judge (Kafka); on SQLite every append is "
                   "conditional, accepted as written, so it changes nothing there.")
@click.option("--server", envvar="EFFECTLOG_SERVER", default=None, metavar="URL",
              help="The judge: these serve instances (comma-separated; env EFFECTLOG_SERVER). "
                   "Needed on Kafka, where the log has no compare-and-append.")
@click.pass_obj
def append(obj: CliContext, verify: bool, server: str | None) -> None:
    """Append transitions given as JSON lines on stdin; print one JSON line per event.

    \b
    {"operation_id": "…", "kind": "email.send", "target": "mailto:a@example.com",
     "payload": {…}, "transition": "create", "worker_id": "w1", "fencing_epoch": 3,
     "outcome": {"status": "succeeded|failed", "result": {…}}, "error": "…"}

    \b
    Transitions:
      create          with payload (or payload_ref); repeated, prints the original
      reserve         takes the next fencing epoch (or the one given) to dispatch; a key
                      already dispatched is in doubt (exit 3)
      claim           takes the key over from any open state, keeping it (recovery's)
      dispatch        the provider call is about to start
      record          with outcome: succeeded or failed
      unknown         with error: whether the call took effect is not known
      await_approval  with error: park the effect for a person's decision
    The others take fencing_epoch from the key's current state when it is omitted; a given
    one is 0 to 2**53-1 (create takes none). A line with an unknown field, or a field its
    transition does not take, is refused (exit 2): nothing in it is silently dropped.

    A line is printed once its event is accepted: by the conditional append on SQLite, by
    the judge (--server) elsewhere. Stops at the first line that fails; lines before it stay
    appended. Through the judge lines are taken in batches (one question about the keys'
    states, one pipelined append, one question about the appended events per batch).
    Exit codes: 2 bad input, 3 conflict (payload mismatch, fenced, illegal transition),
    4 log down.
    """
    from effectlog.log.base import EventLog

    log: EventLog | None = None
    try:
        for number, request in _requests():
            if log is None:  # only a create may make a new log (where no state claims one)
                log = obj.open_log(create=request["transition"].strip().lower() == "create")
                log.verify()
                lines = itertools.chain([(number, request)], _requests(after=number))
                if log.conditional and server is None:
                    _append_line_by_line(log, lines, obj.timeout_s)
                else:
                    if not verify:
                        raise InvalidInput(f"--no-verify is refused on {log.url}: without "
                                           "compare-and-append each line waits for the judge")
                    if server is None:
                        raise InvalidInput(f"append on {log.url} needs the judge: --server URL "
                                           "(or EFFECTLOG_SERVER) of `effectlog serve`")
                    _append_in_batches(log, lines, server, obj.timeout_s)
                break
    finally:
        if log is not None:
            log.close()


def _requests(after: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, parsed request) for each non-blank line of stdin."""
    for number, data in enumerate(sys.stdin.buffer, start=after + 1):
        try:
            raw = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"line {number}: not UTF-8 (byte {exc.start + 1})") from None
        if raw.strip():
            yield number, parse_line(number, raw)


def _emit(event: EffectEvent, position: Any) -> None:
    emit_json({
        "idempotency_key": event.idempotency_key, "transition": event.transition.value,
        "state": event.state.value, "fencing_epoch": event.fencing_epoch,
        "event_id": event.event_id, "existing": position is None,
        "position": None if position is None else {
            "topic": position.topic, "partition": position.partition,
            "offset": position.offset},
    })


def _append_line_by_line(log: Any, lines: Iterable[tuple[int, dict[str, Any]]],
                         timeout_s: float) -> None:
    """Each line on a compare-and-append log; a dispatch accepted later than ``timeout_s``
    after its append began is refused, as through the judge (docs/reference/append.md)."""
    from effectlog.worker import Worker

    workers: dict[str, Worker] = {}
    for number, request in lines:
        try:
            worker = workers.get(request["worker_id"])
            if worker is None:
                worker = workers[request["worker_id"]] = Worker(log, request["worker_id"],
                                                                accept_timeout_s=timeout_s)
            worker.last_position = None
            event = _apply(worker, request, number)
        except EffectlogError as exc:
            exc.args = (f"line {number}: {exc}",)
            raise
        _emit(event, worker.last_position)
        sys.stdout.flush()


def _append_in_batches(log: Any, lines: Iterable[tuple[int, dict[str, Any]]], server: str,
                       timeout_s: float) -> None:
    from effectlog.cli.append_batch import batches, run_batch
    from effectlog.judge.client import ClusterJudge

    judge = ClusterJudge(server, timeout_s=timeout_s, wait_s=timeout_s, retry_for_s=timeout_s)
    try:
        for batch in batches(lines):
            run_batch(log, batch, judge, _apply, _emit, timeout_s)
            sys.stdout.flush()
    finally:
        judge.close()


@click.command()
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.pass_obj
def history(obj: CliContext, key: str, as_json: bool) -> None:
    """Every event of KEY in log order, read from the log, with the projector's verdict.

    On a compacted log (Kafka) the records are judged by what the partition's owner last
    published to the state topic: a surviving record it rejected says so, and the accepted
    events whose records compaction removed are listed by position.
    """
    from effectlog.history import judge_records
    from effectlog.keys import validate_key
    from effectlog.log.base import EVENTS
    from projections.published import read_published

    validate_key(key)
    log = obj.open_log(against_state=False)
    try:
        records = log.read_key(EVENTS, key)
        compacted = log.compacted
        published = (read_published(log, [log.partition_for(EVENTS, key)], key)
                     if compacted and records else None)
    finally:
        log.close()
    if not records:
        fail(f"no events for key {key}", 1)
    rows = judge_records(records, compacted, published)
    if as_json:
        for row in rows:
            emit_json(row)
        return
    if published:
        [(partition, mark)] = [(p, pub.applied) for p, pub in published.items()]
        removed = sum(1 for row in rows if row.get("removed"))
        click.echo(f"{key}: records below offset {mark} of partition {partition} are judged by "
                   f"what its owner accepted (the state topic); compaction removed {removed} "
                   "accepted events")
    elif rows and rows[0].get("compacted_before"):
        click.echo(f"{key}: the transitions before offset {rows[0]['offset']} were compacted "
                   "away and nothing was published to the state topic; the first row carries "
                   "the full snapshot as of then, not known to be accepted")
    _print_history(key, rows)


def _print_history(key: str, rows: list[dict[str, Any]]) -> None:
    from effectlog.cli.formatting import event_detail, iso_utc, print_table

    table = []
    for row in rows:
        event = row.get("event")
        if event is None:
            table.append([row["offset"], "", "EXPIRE" if row.get("expiry") else "", "", "",
                          "", "", f"event {row['event_id']}" if row.get("event_id") else "",
                          row["verdict"]])
            continue
        table.append([row["offset"], iso_utc(event["occurred_at"]), event["transition"],
                      event["state"], event["fencing_epoch"], event["worker_id"],
                      event["attempt"], event_detail(event), row["verdict"]])
    print_table(f"history of {key}", ["offset", "time (UTC)", "transition", "state", "epoch",
                                      "worker", "attempt", "detail", "verdict"], table,
                fold=("detail", "verdict"))


@click.group()
def topics() -> None:
    """Kafka topics: <prefix>.events (compacted) and <prefix>.commands."""


@topics.command("create")
@click.option("--window", default="7d", show_default=True, metavar="DUR",
              help="The reconciliation window: the longest an effect may stay open (retries, "
                   "recovery, approvals). min.compaction.lag.ms must cover it.")
@click.option("--allow-short-lag", is_flag=True,
              help="Create the topics even if the compaction lag is shorter (with a warning).")
@click.option("--strict", is_flag=True,
              help="Refuse (exit 3) existing topics with less replication than the cluster "
                   "calls for, instead of warning.")
@click.option("--json", "as_json", is_flag=True, help="Report as JSON.")
@click.pass_obj
def topics_create(obj: CliContext, window: str, allow_short_lag: bool, strict: bool,
                  as_json: bool) -> None:
    """Create both topics idempotently; refuse existing ones whose config contradicts.

    The events topic keeps every transition of a key for at least min.compaction.lag.ms (URL
    parameter min_compaction_lag_ms); a lag shorter than --window could compact away the
    history of an effect still being reconciled, so it is refused (exit 3).

    On a cluster of 3 or more brokers the topics get replication 3, min.insync.replicas=2 and
    no unclean leader election (URL parameters replication, min_insync_replicas); a cluster
    whose brokers call for more replicas than answer now is refused (exit 4) rather than
    settled for less, unless replication is in the URL. The first line says which and why; an
    existing topic with unclean leader election is refused (exit 3), one with fewer replicas
    gets a warning (exit 3 with --strict).
    """
    if not obj.log_url.startswith("kafka"):
        fail(f"topics are a Kafka concept; {obj.log_url.split(':', 1)[0]}:// logs need none",
             EXIT_USAGE)
    from effectlog.durations import parse_duration_ms
    from effectlog.errors import Conflict
    from effectlog.log.kafka import KafkaSettings, create_topics

    try:
        window_ms = parse_duration_ms(window)
    except InvalidInput as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    settings = KafkaSettings.from_url(obj.log_url)
    if settings.min_compaction_lag_ms < window_ms:
        problem = (f"min.compaction.lag.ms={settings.min_compaction_lag_ms} is shorter than the "
                   f"reconciliation window {window} ({window_ms} ms): raise min_compaction_lag_ms "
                   "in the log URL")
        if not allow_short_lag:
            raise Conflict(problem + " or pass --allow-short-lag")
        click.echo(f"warning: {problem}", err=True)
    report = create_topics(settings, strict=strict)
    if as_json:
        emit_json({"topics": list(report), "replication": report.durability.why,
                   "warnings": report.warnings})
        return
    click.echo(report.durability.why)
    for line in report:
        click.echo(line)
    for warning in report.warnings:
        click.echo(f"warning: {warning} (--strict refuses it)", err=True)


@topics.command("delete")
@click.option("--prefix", required=True, metavar="P",
              help="Delete <name>.events and <name>.commands for every log prefix <name> "
                   "starting with P.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (scripts).")
@click.pass_obj
def topics_delete(obj: CliContext, prefix: str, yes: bool) -> None:
    """Delete an effect log's topics: every event and command of it, for good.

    Lists what matches and asks first (exit 2 without a terminal to ask on: pass --yes);
    exit 1 when nothing matches. The broker of --log's URL is asked; its prefix is not used.
    """
    if not obj.log_url.startswith("kafka"):
        fail(f"topics are a Kafka concept; {obj.log_url.split(':', 1)[0]}:// logs need none",
             EXIT_USAGE)
    if not prefix.strip():
        raise click.BadParameter("give a non-empty prefix", param_hint="--prefix")
    import sys

    from effectlog.log.kafka import KafkaSettings
    from effectlog.log.kafka.deletion import delete_topics, matching_topics

    settings = KafkaSettings.from_url(obj.log_url)
    names = matching_topics(settings, prefix)
    if not names:
        fail(f"no effectlog topics with prefix {prefix!r} on {settings.bootstrap}", EXIT_NOT_FOUND)
    for name in names:
        click.echo(name)
    if not yes:
        if not sys.stdin.isatty():
            fail(f"refusing to delete {len(names)} topic(s) without confirmation: pass --yes",
                 EXIT_USAGE)
        if not click.confirm(f"delete these {len(names)} topic(s) and everything in them?"):
            fail("nothing deleted", EXIT_USAGE)
    delete_topics(settings, names)
    click.echo(f"deleted {len(names)} topic(s)")
