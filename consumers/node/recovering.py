"""Recovery and reconciliation on a node: for the partitions it serves, and passes asked for.

A node that recovers runs the recovery consumer over the partitions it serves and, with a
provider, the reconciler over their commands (commands partition N goes with events
partition N). ``POST /v1/recover`` asks for one recovery pass now, with deadlines of its
own (``effectlog recover --server``): :meth:`NodeRecovery.recover_now` answers which
partitions the pass covered, so the member that merges the answers can name those nobody
covered. A node started without recovery (``serve --no-recovery``) covers none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from consumers.bookkeeping import CommandLedger, consumer_db_path
from consumers.reconciler import CommandOffsets, Handled, Reconciler
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.errors import EffectlogError

if TYPE_CHECKING:
    from pathlib import Path

    from consumers.node.gate import PartitionGate
    from consumers.reconciler import ReconcilerSettings
    from effectlog.judge.query import Judge
    from effectlog.log.base import EventLog
    from effectlog.metrics import Metrics
    from effectlog.provider import Provider
    from projections.store import ProjectionReader

logger = logging.getLogger(__name__)

Loop = Callable[[threading.Event], None]


class NodeRecovery:
    """The recovery consumer and the reconciler of one node (either may be absent)."""

    def __init__(self, recovery: RecoveryConsumer | None, reconciler: Reconciler | None,
                 gate: PartitionGate) -> None:
        self.recovery = recovery
        self.reconciler = reconciler
        self.gate = gate
        self._pass_lock = threading.Lock()

    @classmethod
    def off(cls, gate: PartitionGate) -> NodeRecovery:
        """A node that neither recovers nor reconciles."""
        return cls(None, None, gate)

    @classmethod
    def build(cls, *, log: EventLog, reader: ProjectionReader, gate: PartitionGate,
              state_dir: Path, settings: RecoverySettings, reconciler: ReconcilerSettings,
              provider: Provider | None, judge: Judge | None,
              offsets: Callable[[], CommandOffsets], metrics: Metrics,
              keep: Callable[[Any], Any]) -> NodeRecovery:
        """Recovery over the partitions ``gate`` serves; a reconciler when there is a
        ``provider`` (its writes judged by ``judge`` where the log has no compare-and-append).
        ``keep`` registers what the node closes."""
        ledger = keep(CommandLedger(consumer_db_path(state_dir, "recovery")))
        recovery = RecoveryConsumer(log, reader, ledger, settings, metrics=metrics)
        settling = None if provider is None else Reconciler(
            log, provider, offsets(), reconciler, judge=judge, metrics=metrics,
            partitions=gate.serving)
        return cls(recovery, settling, gate)

    def loops(self) -> list[tuple[str, Loop]]:
        """The threads to run: (name, body)."""
        loops: list[tuple[str, Loop]] = []
        if self.recovery is not None:
            loops.append(("recovery", self.recovery.run))
        if self.reconciler is not None:
            loops.append(("reconciler", self.reconciler.run))
        return loops

    def run_pass(self) -> list[Handled]:
        """One recovery pass, then one reconciler pass (a node whose loops are off)."""
        with self._pass_lock:
            if self.recovery is not None:
                self.recovery.run_once()
            return self.reconciler.run_once() if self.reconciler is not None else []

    def recover_now(self, settings: RecoverySettings | None, served_by: str) -> dict[str, Any]:
        """One recovery pass over the partitions served here, with ``settings``' deadlines
        (the consumer's own when None); what it issued and which partitions it covered:
        those served from its start to its end (none on a node without recovery, or when
        the pass failed, with ``error`` saying why)."""
        report: dict[str, Any] = {"served_by": served_by, "recovers": self.recovery is not None,
                                  "reconciles": self.reconciler is not None,
                                  "held": {str(p): s for p, s in self.gate.held().items()},
                                  "covered": [], "issued": [], "outstanding": 0,
                                  "backing_off": 0, "truncated": False}
        if self.recovery is None:
            return report
        before = set(self.gate.serving())
        try:
            result = self.recovery.run_once(settings)
        except EffectlogError as exc:
            logger.warning("recovery pass asked for by hand failed: %s", exc)
            report["error"] = str(exc)
            return report
        report.update(covered=sorted(before & set(self.gate.serving())),
                      issued=[c.summary() for c in result.issued],
                      outstanding=result.outstanding, backing_off=result.backing_off,
                      truncated=result.truncated)
        return report
