"""A provider adapter that fails in an unforeseen way while the reconciler re-dispatches
leaves the effect UNKNOWN with the reason, as a worker's call would, and the reconciler goes
on. It used to catch only ``ProviderError``/``OSError``: anything else (an adapter's bug, a
result that is not JSON) stopped its loop, and with it ``serve``, leaving the effect
DISPATCHED under the reconciler's epoch with nothing saying why. A lookup that confirms the
effect with a result JSON has no form for (NaN, from a float a provider's API gave back) is
the same: the effect is UNKNOWN with the reason, never recorded as a non-JSON result."""

from __future__ import annotations

import datetime
import threading
from pathlib import Path
from typing import Any

import pytest

from consumers.bookkeeping import CommandLedger, OffsetStore
from consumers.providers.fake import FakeProvider
from consumers.reconciler import Reconciler, ReconcilerSettings
from consumers.recovery import RecoveryConsumer, RecoverySettings
from effectlog.log import open_log
from effectlog.model import Outcome, State, now_ms
from effectlog.provider import LookupResult, LookupStatus
from effectlog.worker import Worker
from tests.recovery_support import FoldReader, stuck


class NotJson(FakeProvider):
    """Performs the effect, then returns what its API gave back: a datetime."""

    def execute(self, target: str, payload_hash: str, idempotency_key: str,
                fencing_epoch: int, payload: Any) -> Any:
        super().execute(target, payload_hash, idempotency_key, fencing_epoch, payload)
        return {"sent_at": datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)}


class NanLookup(FakeProvider):
    """Confirms every key it is asked about, with a measurement that came back NaN."""

    def lookup(self, idempotency_key: str) -> LookupResult:
        return LookupResult(LookupStatus.CONFIRMED,
                            Outcome(State.SUCCEEDED, {"latency_ms": float("nan")}))


class Buggy(FakeProvider):
    """Performs the effect, then fails with an error of its own."""

    def execute(self, target: str, payload_hash: str, idempotency_key: str,
                fencing_epoch: int, payload: Any) -> Any:
        super().execute(target, payload_hash, idempotency_key, fencing_epoch, payload)
        raise KeyError("status")


@pytest.mark.parametrize(("adapter", "stuck_in", "reason"), [
    (NotJson, State.RESERVED, "re-dispatch answered SUCCEEDED with a result that cannot be "
                              "recorded: InvalidInput: outcome.result is not JSON"),
    (Buggy, State.RESERVED, "re-dispatch: KeyError: 'status'"),
    (NanLookup, State.DISPATCHED, "lookup answered SUCCEEDED with a result that cannot be "
                                  "recorded: InvalidInput: outcome.result is not JSON: Out of "
                                  "range float"),
])
def test_an_adapter_error_leaves_the_effect_unknown_and_the_loop_running(
        tmp_path: Path, adapter: type[FakeProvider], stuck_in: State, reason: str) -> None:
    log = open_log(f"sqlite:///{tmp_path}/log.db")
    keys = [stuck(Worker(log, "crashed"), f"op-{n}", stuck_in) for n in range(2)]
    RecoveryConsumer(log, FoldReader(log), CommandLedger(tmp_path / "ledger.db"),
                     RecoverySettings(stuck_after_s=0),
                     clock=lambda: now_ms() + 60_000).run_once()
    provider = adapter(tmp_path / "provider.db")
    reconciler = Reconciler(log, provider, OffsetStore(tmp_path / "offsets.db"),
                            ReconcilerSettings(worker_id="reconciler-1", poll_s=0.05))
    stop, died = threading.Event(), []

    def loop() -> None:
        try:
            reconciler.run(stop)
        except BaseException as exc:  # what serve would stop on
            died.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    reader = Worker(log, "reader")
    for _ in range(100):
        if all(getattr(reader.get(k), "state", None) is State.UNKNOWN for k in keys) or died:
            break
        thread.join(0.05)
    stop.set()
    thread.join(5.0)
    assert not died, died
    for key in keys:  # both commands handled: the first error did not stop the loop
        event = reader.get(key)
        assert event is not None and event.state is State.UNKNOWN, event
        assert event.error is not None and event.error.startswith(reason), event.error
        assert provider.executions(key) == (0 if adapter is NanLookup else 1)
