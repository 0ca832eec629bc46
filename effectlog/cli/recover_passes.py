"""The passes of ``effectlog recover``: over a local projection, or asked of the serve instances.

Both answer the same report: the commands issued, how many stuck entries were left
(outstanding, backing off), and ``uncovered``, partition -> why the pass did not cover it.
A local projection covers the partitions stored under ``--state`` that had applied the whole
log when the pass began (one serve instance's directory holds only those it owned, some of
them copies left behind when they moved to another member); the cluster's members each cover
the partitions they serve (``POST /v1/recover``), and the one asked names the rest.
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


def uncovered_text(uncovered: dict[str, str], hint: str = "") -> str:
    """One line: the partitions a pass did not cover, and why (then ``hint``)."""
    parts = ", ".join(f"{p} ({why})" for p, why in sorted(uncovered.items(),
                                                           key=lambda item: int(item[0])))
    return f"recovery did not cover partition(s) {parts}{hint}"


class LocalPasses:
    """Passes over the projection under ``--state`` with the ledger kept beside it."""

    hint = ": `effectlog project --once` first, or --server URL to ask the serve instances"

    def __init__(self, log: EventLog, reader: RocksProjectionReader, ledger: CommandLedger,
                 consumer: RecoveryConsumer, ends: dict[int, int]) -> None:
        self.log = log
        self.reader = reader
        self.ledger = ledger
        self.consumer = consumer
        self.ends = ends  # the log's end offsets read before the projection was opened

    @classmethod
    def open(cls, obj: CliContext, settings: RecoverySettings) -> LocalPasses:
        """Reach the log first (an unreachable one is named within ``--timeout``), then the
        projection; none there is exit 4, or on a log whose projection lives in the serve
        instances (Kafka) a hint to ask them (exit 2)."""
        from consumers.bookkeeping import CommandLedger, consumer_db_path
        from consumers.recovery import RecoveryConsumer
        from effectlog.log.base import COMMANDS, EVENTS
        from projections import open_reader

        log = obj.open_log()
        try:
            log.verify()
            log.end_offsets(COMMANDS)
            ends = log.end_offsets(EVENTS)  # before the projection: what it must have seen
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
        return cls(log, reader, ledger, RecoveryConsumer(log, reader, ledger, settings), ends)

    def once(self) -> Report:
        result = self.consumer.run_once()
        return {"issued": [c.summary() for c in result.issued],
                "outstanding": result.outstanding, "backing_off": result.backing_off,
                "truncated": result.truncated, "uncovered": self.uncovered()}

    def uncovered(self) -> dict[str, str]:
        """The partitions the projection does not hold, or holds behind the log (a copy
        another serve instance has owned since, or a projector that has not caught up)."""
        where, held = self.reader.state_dir, set(self.reader.partitions)
        positions = self.reader.next_offsets()
        why: dict[str, str] = {}
        for partition, end in sorted(self.ends.items()):
            behind = end - positions.get(partition, 0)
            if partition not in held:
                why[str(partition)] = f"not in the projection under {where}"
            elif behind > 0:
                why[str(partition)] = f"{behind} records behind the log in the projection " \
                                      f"under {where}"
        return why

    def run(self, stop: threading.Event, poll_s: float) -> None:
        self.consumer.run(stop)

    def close(self) -> None:
        self.ledger.close()
        self.reader.close()
        self.log.close()


class ClusterPasses:
    """Passes asked of the serve instances at ``servers`` (``POST /v1/recover``)."""

    hint = ""

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
                    click.echo(f"effectlog recover: "
                               f"{uncovered_text(report['uncovered'], self.hint)}", err=True)
            stop.wait(poll_s)

    def close(self) -> None:
        self.client.close()
