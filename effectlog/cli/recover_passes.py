"""The passes of ``effectlog recover``: over a local projection, or asked of the serve instances.

Both answer the same report: the commands issued, how many stuck entries were left
(outstanding, backing off), and ``uncovered``, partition -> why the pass did not cover it.
A local projection covers the partitions stored under ``--state`` (one serve instance's
directory holds only those it owned); the cluster's members each cover the partitions they
serve (``POST /v1/recover``), and the one asked names the rest.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from effectlog.cli.context import EXIT_UNAVAILABLE, CliContext, fail
from effectlog.errors import BackendUnavailable, InvalidInput

if TYPE_CHECKING:
    from consumers.bookkeeping import CommandLedger
    from consumers.recovery import RecoveryConsumer, RecoverySettings
    from effectlog.client import StateClient
    from effectlog.log.base import EventLog
    from projections.rocksdb.reader import RocksProjectionReader

Report = dict[str, Any]


def uncovered_text(uncovered: dict[str, str]) -> str:
    """One line: the partitions a pass did not cover, and why."""
    parts = ", ".join(f"{p} ({why})" for p, why in sorted(uncovered.items(),
                                                           key=lambda item: int(item[0])))
    return f"recovery did not cover partition(s) {parts}"


class LocalPasses:
    """Passes over the projection under ``--state`` with the ledger kept beside it."""

    def __init__(self, log: EventLog, reader: RocksProjectionReader, ledger: CommandLedger,
                 consumer: RecoveryConsumer) -> None:
        self.log = log
        self.reader = reader
        self.ledger = ledger
        self.consumer = consumer

    @classmethod
    def open(cls, obj: CliContext, settings: RecoverySettings) -> LocalPasses:
        """Reach the log first (an unreachable one is named within ``--timeout``), then the
        projection; none there is exit 4, or on a log whose projection lives in the serve
        instances (Kafka) a hint to ask them (exit 2)."""
        from consumers.bookkeeping import CommandLedger, consumer_db_path
        from consumers.recovery import RecoveryConsumer
        from effectlog.log.base import COMMANDS
        from projections import open_reader

        log = obj.open_log()
        try:
            log.verify()
            log.end_offsets(COMMANDS)
            reader = open_reader(obj.state_dir)
        except BaseException:
            log.close()
            raise
        if not reader.exists:
            reader.close()
            log.close()
            where = Path(obj.state_dir).absolute()
            if not log.conditional:
                raise InvalidInput(f"no projection under {where}: on this log the projection "
                                   "lives in the serve instances; pass --server URL (or set "
                                   "EFFECTLOG_SERVER) to ask them")
            fail(f"no projection under {where}: run `effectlog project` (or `effectlog serve`) "
                 "first", EXIT_UNAVAILABLE)
        ledger = CommandLedger(consumer_db_path(obj.state_dir, "recovery"))
        return cls(log, reader, ledger, RecoveryConsumer(log, reader, ledger, settings))

    def once(self) -> Report:
        from effectlog.log.base import EVENTS

        result = self.consumer.run_once()
        missing = sorted(set(range(self.log.partitions(EVENTS))) - set(self.reader.partitions))
        where = self.reader.state_dir
        return {"issued": [c.summary() for c in result.issued],
                "outstanding": result.outstanding, "backing_off": result.backing_off,
                "truncated": result.truncated,
                "uncovered": {str(p): f"not in the projection under {where}: --server URL asks "
                                      "the serve instances" for p in missing}}

    def run(self, stop: threading.Event, poll_s: float) -> None:
        self.consumer.run(stop)

    def close(self) -> None:
        self.ledger.close()
        self.reader.close()
        self.log.close()


class ClusterPasses:
    """Passes asked of the serve instances at ``servers`` (``POST /v1/recover``)."""

    def __init__(self, servers: str, settings: RecoverySettings, timeout_s: float) -> None:
        from effectlog.client import StateClient

        self.settings = settings
        self.client: StateClient = StateClient(servers, timeout_s=timeout_s,
                                               retry_for_s=timeout_s)

    def once(self) -> Report:
        return self.client.recover(self.settings.deadlines_json())

    def run(self, stop: threading.Event, poll_s: float) -> None:
        """Pass after pass until ``stop``; each prints what it issued, and what it did not
        cover on stderr; a pass that fails is reported and tried again."""
        while not stop.is_set():
            try:
                report = self.once()
            except BackendUnavailable as exc:
                click.echo(f"effectlog recover: pass failed: {exc}", err=True)
            else:
                for row in report["issued"]:
                    click.echo(f"reconcile {row['idempotency_key']}  ({row['reason']})")
                if report["uncovered"]:
                    click.echo(f"effectlog recover: {uncovered_text(report['uncovered'])}",
                               err=True)
            stop.wait(poll_s)

    def close(self) -> None:
        self.client.close()
