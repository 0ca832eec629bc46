"""The projection keeps attempts, confirmed effects, reconciliations and rejections apart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from effectlog.codec import event_codec
from effectlog.log import EVENTS, open_log
from effectlog.log.memory import MemoryLog
from effectlog.metrics import Metrics
from effectlog.model import Outcome, State, Transition
from effectlog.worker import Worker
from projections import open_reader
from projections.projector import ProjectorSettings, project


def _fill(url: str) -> None:
    log = open_log(url)
    worker = Worker(log, "w1")
    worker.perform("op-1", "email.send", "mailto:a@example.com", {"n": 1}, lambda c: {"id": 1})
    with worker.effect("op-2", "ticket.create", "jira:OPS", {"t": "x"}) as call:
        pass  # leaves UNKNOWN
    reconciler = Worker(log, "reconciler")
    reconciler.claim(call.key)
    reconciler.record(call.key, "succeeded", {"ticket": "OPS-1"}, source="lookup")
    created = worker.create("op-3", "payment.charge", "acct:1", {"amount": 5})
    worker.reserve(created.idempotency_key)
    dispatched = worker.dispatch(created.idempotency_key)
    Worker(log, "w2").claim(created.idempotency_key)  # a replacement claims epoch 2
    # the paused worker's epoch-1 record still reaches the log: rejected and counted
    old = dispatched.next(Transition.RECORD, State.SUCCEEDED, outcome=Outcome(State.SUCCEEDED))
    log.append(EVENTS, old.idempotency_key, event_codec().encode(old.to_record()))
    log.close()


def test_a_compacted_log_rebuilds_from_the_latest_record_per_key_only_with_gaps_accepted(
        tmp_path: Path) -> None:
    """A key's first record read is its baseline only past a gap the operator accepted
    (``--accept-compaction-gaps``); otherwise it is judged by the rules like any other."""
    class CompactedLog(MemoryLog):
        compacted = True

    full, compacted = MemoryLog(), CompactedLog()
    Worker(full, "w1").perform("op-9", "email.send", "t", {"n": 9}, lambda c: {"id": 9})
    last = full.read_key(EVENTS, "agent:op-9:email.send:t")[-1]
    compacted.append(EVENTS, last.key, last.value)  # what compaction leaves
    project(compacted, tmp_path / "judged")
    with open_reader(tmp_path / "judged") as judged:
        assert judged.get(last.key) is None  # a RECORD first: illegal by the rules
    project(compacted, tmp_path / "compacted", ProjectorSettings(accept_compaction_gaps=True))
    project(full, tmp_path / "full")
    with open_reader(tmp_path / "compacted") as a, open_reader(tmp_path / "full") as b:
        assert a.get(last.key) == b.get(last.key)
        assert a.get(last.key).state is State.SUCCEEDED  # type: ignore[union-attr]
    sqlite_like = MemoryLog()  # not compacted: a history without CREATE is rejected
    sqlite_like.append(EVENTS, last.key, last.value)
    project(sqlite_like, tmp_path / "strict")
    with open_reader(tmp_path / "strict") as strict:
        assert strict.get(last.key) is None
        assert strict.counts()["rejected:illegal_transition"] == 1


def test_stats_and_prometheus_keep_the_figures_apart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    _fill(url)
    project(open_log(url), tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        counts = reader.counts()
    assert counts["metric:attempts"] == 3
    assert counts["metric:confirmed_effects"] == 2
    assert counts["metric:reconciled"] == 1
    assert counts["rejected:stale_epoch"] == 1
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
                           str(tmp_path / "state"), "stats", "--json"],
                          capture_output=True, text=True, timeout=60)
    figures = json.loads(done.stdout)["metrics"]
    assert figures["attempts (dispatches)"] == 3
    assert figures["confirmed provider effects"] == 2
    assert figures["reconciled by lookup"] == 1
    assert figures["unresolved UNKNOWN"] == 0
    assert figures["rejected events"] == 1
    metrics = Metrics()
    metrics.observe(counts, {0: 10}, {0: 10})
    text = metrics.render().decode()
    assert 'effectlog_projected_events{kind="attempts"} 3.0' in text
    assert 'effectlog_projected_events{kind="reconciled"} 1.0' in text
    assert 'effectlog_rejected_events{reason="stale_epoch"} 1.0' in text
