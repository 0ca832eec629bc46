"""Projection, recovery and reconciliation beside the demo's workers, as ``serve`` runs them.

The projector follows the log in one thread; a second thread passes the recovery consumer
and the reconciler over the projection every ``poll_s``. While workers run, only effects
stuck past ``stuck_after_s`` are touched (a worker that is merely slow gets fenced if it
is taken over); :meth:`Settler.settle` then drops the deadline and runs passes until
nothing is left to do but wait for a human decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path

from consumers.bookkeeping import CommandLedger, OffsetStore, consumer_db_path
from consumers.reconciler import Handled, Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from consumers.table import Action
from effectlog.errors import EffectlogError
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog
from effectlog.model import STUCK, now_ms
from effectlog.provider import Provider
from projections import open_reader
from projections.projector import Projector
from projections.rocksdb.reader import RocksProjectionReader
from projections.view import ProjectionView

logger = logging.getLogger(__name__)

RECONCILER_ID = "demo-reconciler"
QUIET = frozenset({Action.WAIT, Action.SKIP})
_FINAL = RecoverySettings(stuck_after_s=0, command_timeout_s=0, backoff_base_s=0, backoff_cap_s=0)


class Settler:
    """Owns the projector thread and the recovery/reconciler thread of one demo run."""

    def __init__(self, log_url: str, state_dir: Path, provider: Provider, *,
                 stuck_after_s: float = 1.5, poll_s: float = 0.25) -> None:
        self.state_dir = state_dir
        self.poll_s = poll_s
        self.actions: Counter[Action] = Counter()
        self.handled = 0  # commands handled so far (read by the progress display)
        self._logs: list[EventLog] = [open_log(log_url) for _ in range(3)]
        self._projector = Projector(self._logs[0], state_dir)
        self._projector.open()  # creates the projection, so the reader below finds it
        self._reader = open_reader(state_dir, "secondary")
        self._ledger = CommandLedger(consumer_db_path(state_dir, "recovery"))
        self._offsets = OffsetStore(consumer_db_path(state_dir, "reconciler"))
        self.recovery = RecoveryConsumer(self._logs[1], self._reader, self._ledger,
                                         RecoverySettings(stuck_after_s=stuck_after_s,
                                                          command_timeout_s=2 * stuck_after_s,
                                                          backoff_base_s=poll_s,
                                                          backoff_cap_s=4 * poll_s),
                                         clock=lambda: now_ms() + 1)
        # On Kafka the reconciler reads state from the projection (as ``serve`` does).
        self._view = ProjectionView(self._logs[2], state_dir) if log_url.startswith("kafka") \
            else None
        self.reconciler = Reconciler(self._logs[2], provider, self._offsets,
                                     ReconcilerSettings(worker_id=RECONCILER_ID),
                                     view=self._view)
        self._stop_loop = threading.Event()
        self._stop_projector = threading.Event()
        self._lock = threading.Lock()  # one pass at a time: the loop's or settle()'s
        self._threads = [
            threading.Thread(target=self._project, name="demo-projector", daemon=True),
            threading.Thread(target=self._loop, name="demo-recovery", daemon=True),
        ]

    @property
    def reader(self) -> RocksProjectionReader:
        """The projection as the settler reads it (not to be used while its loop runs)."""
        return self._reader

    def start(self) -> Settler:
        for thread in self._threads:
            thread.start()
        return self

    def settle(self, within_s: float = 60.0) -> bool:
        """Passes without a deadline until one changes nothing and no effect is stuck
        (RESERVED, DISPATCHED or UNKNOWN). False if that did not happen in time."""
        self._stop_loop.set()
        self._threads[1].join()
        self.recovery.settings = _FINAL
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            self.wait_projected(deadline - time.monotonic())
            handled = self._pass()
            self.wait_projected(deadline - time.monotonic())
            if all(h.action in QUIET for h in handled) and self.stuck() == 0:
                return True
        return False

    def stuck(self) -> int:
        """Effects in RESERVED, DISPATCHED or UNKNOWN, per the projection."""
        self._reader.refresh()
        counts = self._reader.counts()
        return sum(counts.get(f"state:{state.value}", 0) for state in STUCK)

    def wait_projected(self, within_s: float) -> None:
        """Block until the projection has applied everything in the log now."""
        ends = self._logs[1].end_offsets(EVENTS)
        deadline = time.monotonic() + max(within_s, 0.0)
        while time.monotonic() < deadline:
            self._reader.refresh()
            applied = self._reader.next_offsets()
            if all(applied.get(p, 0) >= end for p, end in ends.items()):
                return
            time.sleep(0.02)

    def close(self) -> None:
        """Stop both threads and release every handle."""
        self._stop_loop.set()
        self._threads[1].join(30)
        self._stop_projector.set()
        self._threads[0].join(30)
        for closable in (self._view, self._projector, self._reader, self._ledger, self._offsets,
                         *self._logs):
            if closable is not None:
                closable.close()

    # -- internals -----------------------------------------------------------------------

    def _project(self) -> None:
        try:
            self._projector.run(stop=self._stop_projector)
        except EffectlogError as exc:
            logger.error("demo projector stopped: %s", exc)

    def _loop(self) -> None:
        while not self._stop_loop.is_set():
            try:
                self._pass()
            except EffectlogError as exc:
                logger.warning("demo recovery pass failed: %s", exc)
            self._stop_loop.wait(self.poll_s)

    def _pass(self) -> list[Handled]:
        with self._lock:
            self.recovery.run_once()
            handled = self.reconciler.run_once()
        for item in handled:
            self.actions[item.action] += 1
        self.handled += len(handled)
        return handled
