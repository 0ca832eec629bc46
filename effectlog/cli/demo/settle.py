"""Projection, recovery and reconciliation beside the demo's workers: the node ``serve`` runs.

The node (:class:`consumers.node.node.Node`) projects the log in its own thread; a second
thread passes its recovery consumer and reconciler over the projection every ``poll_s``.
While workers run, only effects stuck past ``stuck_after_s`` are touched (a worker that is
merely slow gets fenced if it is taken over); :meth:`Settler.settle` then drops the deadline
and runs passes until nothing is left to do but wait for a human decision.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from pathlib import Path

from consumers.node.node import Node, NodeSettings
from consumers.reconciler import Handled, ReconcilerSettings
from consumers.recovery import RecoverySettings
from consumers.table import Action
from effectlog.errors import EffectlogError
from effectlog.model import STUCK, now_ms
from effectlog.provider import Provider
from projections.store import ProjectionReader

logger = logging.getLogger(__name__)

RECONCILER_ID = "demo-reconciler"
QUIET = frozenset({Action.WAIT, Action.SKIP})
_FINAL = RecoverySettings(stuck_after_s=0, command_timeout_s=0, backoff_base_s=0, backoff_cap_s=0)


class Settler:
    """Owns the demo's node and the thread that runs its recovery/reconciler passes."""

    def __init__(self, log_url: str, state_dir: Path, provider: Provider, *,
                 stuck_after_s: float = 1.5, poll_s: float = 0.25, http: bool = False) -> None:
        self.state_dir = state_dir
        self.poll_s = poll_s
        self.actions: Counter[Action] = Counter()
        self.handled = 0  # commands handled so far (read by the progress display)
        recovery = RecoverySettings(stuck_after_s=stuck_after_s,
                                    command_timeout_s=2 * stuck_after_s,
                                    backoff_base_s=poll_s, backoff_cap_s=4 * poll_s)
        self.node = Node(log_url, NodeSettings(
            state_dir=state_dir, http_port=0 if http else None, loops=False, recovery=recovery,
            reconciler=ReconcilerSettings(worker_id=RECONCILER_ID)), provider)
        self._stop_loop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="demo-recovery", daemon=True)

    @property
    def url(self) -> str:
        """Where workers read state through the node's query API (with ``http``)."""
        return self.node.url

    @property
    def reader(self) -> ProjectionReader:
        """The projection as the node serves it."""
        return self.node.reader

    def start(self) -> Settler:
        self.node.start()
        assert self.node.recovery is not None  # the demo's node recovers
        self.node.recovery.clock = lambda: now_ms() + 1
        self._thread.start()
        return self

    def settle(self, within_s: float = 60.0) -> bool:
        """Passes without a deadline until one changes nothing and no effect is stuck
        (RESERVED, DISPATCHED or UNKNOWN). False if that did not happen in time."""
        self._stop_loop.set()
        self._thread.join()
        assert self.node.recovery is not None
        self.node.recovery.settings = _FINAL
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
        counts = self.reader.counts()
        return sum(counts.get(f"state:{state.value}", 0) for state in STUCK)

    def wait_projected(self, within_s: float) -> None:
        """Block until every partition serves with everything in the log now applied."""
        ends = self.node.end_offsets()
        deadline = time.monotonic() + max(within_s, 0.0)
        gate = self.node.gate
        for partition, end in ends.items():
            while not gate.wait(partition, end, max(0.0, min(0.5, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    return
                if gate.status(partition) is None:  # not assigned yet (a group forming)
                    time.sleep(0.02)

    def close(self) -> None:
        """Stop the pass thread and the node, and release every handle."""
        self._stop_loop.set()
        if self._thread.is_alive():
            self._thread.join(30)
        if not self.node.stop(30):
            self.node.close()

    # -- internals -----------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop_loop.is_set():
            try:
                self._pass()
            except EffectlogError as exc:
                logger.warning("demo recovery pass failed: %s", exc)
            self._stop_loop.wait(self.poll_s)

    def _pass(self) -> list[Handled]:
        handled = self.node.run_pass()
        for item in handled:
            self.actions[item.action] += 1
        self.handled += len(handled)
        return handled
