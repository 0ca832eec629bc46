"""Every recovery-table row on a real Kafka-protocol broker, through the RocksDB projection.

A crashed worker leaves effects on the Kafka events topic; the projector catches up, the
recovery consumer writes commands to the commands topic, the reconciler consumes them and
settles each effect with the fake provider.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.providers.fake import FakeProvider
from consumers.table import Action
from effectlog.log import open_log
from effectlog.model import State
from effectlog.provider import ProviderTimeout
from effectlog.view import LogView
from tests.cluster_support import Serve, wait_until
from tests.judges import scribe
from tests.kafka_broker import free_port
from tests.recovery_support import Harness, stop_serve, stuck

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(180)]


@pytest.fixture
def judge(kafka_url: str, tmp_path: Path) -> Iterator[Serve]:
    """A serve that judges the reconciler's writes (its own loops have no provider)."""
    node = Serve(tmp_path, "judge", kafka_url, None, None, "--stuck-after", "1h")  # quiet
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve serves every partition")
        yield node
    finally:
        node.stop()


def test_every_recovery_table_row_on_kafka(kafka_url: str, tmp_path: Path, judge: Serve) -> None:
    h = Harness(tmp_path, kafka_url, projection=True, server=judge.url)
    reserved = stuck(h.worker, "k-reserved", State.RESERVED)
    confirmed = stuck(h.worker, "k-dispatched-confirmed", State.DISPATCHED)
    h.crash_after_provider_call(confirmed)
    not_found = stuck(h.worker, "k-dispatched-not-found", State.DISPATCHED)
    unknown_confirmed = stuck(h.worker, "k-unknown-confirmed", State.DISPATCHED)
    h.provider.inject_timeout_after_accept()
    with pytest.raises(ProviderTimeout):
        h.crash_after_provider_call(unknown_confirmed)
    h.worker.unknown(unknown_confirmed, "ProviderTimeout")
    unknown_unavailable = stuck(h.worker, "k-unknown-unavailable", State.UNKNOWN)
    h.provider.inject_lookup_outage(1, key=unknown_unavailable)

    handled = h.recover_and_reconcile()
    actions = {x.key: x.action for x in handled}
    assert actions == {
        reserved: Action.DISPATCH,
        confirmed: Action.RECORD,
        not_found: Action.DISPATCH,
        unknown_confirmed: Action.RECORD,
        unknown_unavailable: Action.AWAIT_APPROVAL,
    }
    states = {key: h.worker.get(key).state for key in actions}  # type: ignore[union-attr]
    assert states == {reserved: State.SUCCEEDED, confirmed: State.SUCCEEDED,
                      not_found: State.SUCCEEDED, unknown_confirmed: State.SUCCEEDED,
                      unknown_unavailable: State.AWAITING_APPROVAL}
    assert {k: h.provider.executions(k) for k in actions} == {
        reserved: 1, confirmed: 1, not_found: 1, unknown_confirmed: 1, unknown_unavailable: 0}
    assert h.reconciler().run_once() == []  # offsets were committed


def test_dispatched_not_found_with_incomplete_lookup_becomes_unknown_on_kafka(
        kafka_url: str, tmp_path: Path, judge: Serve) -> None:
    h = Harness(tmp_path, kafka_url, lookup_complete=False, projection=True, server=judge.url)
    key = stuck(h.worker, "k-incomplete", State.DISPATCHED)
    (handled,) = h.recover_and_reconcile()
    assert handled.action is Action.MARK_UNKNOWN
    assert h.worker.get(key).state is State.UNKNOWN  # type: ignore[union-attr]
    assert h.provider.calls(key) == 0


def test_serve_settles_a_crashed_workers_effect_on_kafka(kafka_url: str, tmp_path: Path) -> None:
    log = open_log(kafka_url)
    key = stuck(scribe(log, "crashed"), "k-serve", State.RESERVED)
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url, "--state",
         str(tmp_path / "state"), "serve", "--metrics-port", str(free_port()), "--stuck-after",
         "1s", "--poll", "1s", "--provider", f"fake:///{tmp_path}/provider.db"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "serve.err").open("w"))
    try:
        deadline = time.monotonic() + 90
        while LogView(log).current(key).state is not State.SUCCEEDED:  # type: ignore[union-attr]
            assert time.monotonic() < deadline and proc.poll() is None, "not settled in time"
            time.sleep(1)
    finally:
        err = stop_serve(proc, tmp_path / "serve.err")
    assert proc.returncode == 0, err[-3000:]
    assert FakeProvider(tmp_path / "provider.db").executions(key) == 1
