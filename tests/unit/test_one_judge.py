"""The interleavings an audit found, each written down as a deterministic test.

A real node (projector, RocksDB, query API over HTTP) on a log its workers reach only through
the judge (``server=``), a provider that counts every call it receives, and a fault injected
at the one point where each interleaving happens. Each test fails if a worker calls the
provider without a positive verdict on its own DISPATCH.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from consumers.node.node import Node, NodeSettings
from effectlog.codec import EVENT_SCHEMA, Codec, event_codec, load_schema_text
from effectlog.errors import InvalidInput, WrongLog
from effectlog.judge import CannotJudge
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog
from effectlog.worker import Worker
from projections.rocksdb.db import PartitionDB
from projections.rocksdb.layout import current_generation, partition_dir
from projections.rocksdb.store import StoreReader

pytestmark = pytest.mark.timeout(120)

KIND, TARGET = "payment.charge", "acct:42"


class Provider:
    """Counts every call it receives, per key: it deduplicates nothing."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def __call__(self, call: Any) -> dict[str, Any]:
        self.calls[call.key] += 1
        return {"charge": f"ch-{call.key[-6:]}-{self.calls[call.key]}"}


def key_of(op: str) -> str:
    return f"agent:{op}:{KIND}:{TARGET}"


@pytest.fixture
def log_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/log.db"


@pytest.fixture
def log(log_url: str) -> Iterator[EventLog]:
    handle = open_log(log_url)
    yield handle
    handle.close()


@pytest.fixture
def node(log_url: str, log: EventLog, tmp_path: Path) -> Iterator[Node]:
    Worker(log, "setup").create("warm-up", "email.send", "mailto:x@example.com", {})
    running = Node(log_url, NodeSettings(state_dir=tmp_path / "state", http_port=0)).start()
    deadline = time.monotonic() + 30
    while running.gate.status(0) != "serving":
        assert time.monotonic() < deadline, "the node did not start serving"
        time.sleep(0.02)
    yield running
    running.stop()
    running.close()


def settled(node: Node, log: EventLog) -> None:
    """Wait until the node has applied the whole log."""
    end = log.end_offsets(EVENTS)[0]
    assert node.gate.wait(0, end, 10), "the node did not apply the log"


def once(original: Callable[..., Any], instead: Callable[..., Any]) -> Callable[..., Any]:
    """A method that answers ``instead`` on its first call, then as ``original``."""
    fired: list[bool] = []

    def method(self: Any, *args: Any) -> Any:
        if not fired:
            fired.append(True)
            return instead(self, *args)
        return original(self, *args)
    return method


def test_a_read_in_a_revoke_window_never_reads_absent(
        node: Node, log: EventLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """1. A cooperative revoke releases the partition's writer between the node's check that
    it serves the partition and its read of the store: that read must not say "absent"."""
    provider = Provider()
    first = Worker(log, "a", server=node.url).perform("op-1", KIND, TARGET, {"n": 1}, provider)
    settled(node, log)
    monkeypatch.setattr(StoreReader, "_one", once(StoreReader._one, lambda self, p: None))
    again = Worker(log, "b", server=node.url).perform("op-1", KIND, TARGET, {"n": 1}, provider)
    assert again == first
    assert provider.calls[key_of("op-1")] == 1


def test_a_read_in_a_rebuild_swap_never_mixes_generations(
        node: Node, log: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """2. A new projection generation, still behind, is swapped in under a read: the answer
    must not pair the old generation's position with the new one's (older) state."""
    from projections.projector import project

    project(log, tmp_path / "behind")  # a generation built before the effect existed
    provider = Provider()
    first = Worker(log, "a", server=node.url).perform("op-2", KIND, TARGET, {"n": 2}, provider)
    settled(node, log)
    behind = PartitionDB(0, partition_dir(current_generation(tmp_path / "behind"), 0),
                         "read_only")
    try:
        monkeypatch.setattr(StoreReader, "_one", once(StoreReader._one, lambda self, p: behind))
        again = Worker(log, "b", server=node.url).perform("op-2", KIND, TARGET, {"n": 2},
                                                           provider)
    finally:
        behind.close()
    assert again == first
    assert provider.calls[key_of("op-2")] == 1


def test_rebuild_is_refused_while_serve_holds_the_projection(
        node: Node, log: EventLog, log_url: str, tmp_path: Path) -> None:
    """2. ``effectlog rebuild`` does not swap a projection under a running serve."""
    state = tmp_path / "state"
    before = current_generation(state)
    done = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", log_url,
                           "--state", str(state), "rebuild"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 4, done.stderr
    assert done.stderr.count("\n") == 1 and "in use by" in done.stderr, done.stderr
    assert current_generation(state) == before


def newer_codec() -> Codec:
    """The codec of a later release whose schema adds an optional field."""
    schema = load_schema_text(EVENT_SCHEMA)
    schema["fields"] = [*schema["fields"],
                        {"name": "trace_id", "type": ["null", "string"], "default": None}]
    return Codec(schema, older=[load_schema_text(EVENT_SCHEMA)])


def test_a_newer_writer_is_not_judged_by_an_older_serve(
        node: Node, log: EventLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """3. A worker of a later release (an added optional field) and a serve of this one: the
    serve cannot decode its events, so it must not act on them; a delivery of this release
    then performs the effect once."""
    import effectlog.worker.base as base
    import effectlog.worker.core as core

    provider = Provider()
    end = log.end_offsets(EVENTS)[0]
    newer = newer_codec()
    assert newer.fingerprint != event_codec().fingerprint
    with monkeypatch.context() as patch:  # the later release's worker
        patch.setattr(core, "event_codec", lambda: newer)
        patch.setattr(base, "event_codec", lambda: newer)
        with pytest.raises(CannotJudge, match="upgrade"):
            Worker(log, "new", server=node.url).perform("op-3", KIND, TARGET, {"n": 3}, provider)
    assert log.end_offsets(EVENTS)[0] == end  # refused before writing anything
    Worker(log, "old", server=node.url).perform("op-3", KIND, TARGET, {"n": 3}, provider)
    assert provider.calls[key_of("op-3")] == 1


def test_verify_false_is_refused_without_compare_and_append(node: Node, log: EventLog) -> None:
    """4. ``verify=False`` where writes are judged after they land would call the provider
    on a claim nobody judged: it is refused with one line; on a log with compare-and-append
    it changes nothing (each append is conditional)."""
    with pytest.raises(InvalidInput, match="verify=False is refused"):
        Worker(log, "w", server=node.url, verify=False)
    provider = Provider()
    for name in ("a", "b"):
        Worker(log, name, verify=False).perform("op-4", KIND, TARGET, {"n": 4}, provider)
    assert provider.calls[key_of("op-4")] == 1


def test_a_judge_of_another_log_is_not_believed(node: Node, log: EventLog,
                                               tmp_path: Path) -> None:
    """5. The log was replaced (another topic under the same name; here another file): the
    judge still projects the old one. Its offsets name other records, so "no rejection
    stored there" would read as accepted; the workers must refuse its answers instead."""
    old = Worker(log, "old")
    for n in range(12):  # the old log has accepted records at every offset the new one uses
        old.create(f"old-{n}", "email.send", "mailto:x@example.com", {})
    settled(node, log)
    provider = Provider()
    replaced = open_log(f"sqlite:///{tmp_path}/replaced.db")
    try:
        for name in ("a", "b"):  # two deliveries of one job, one after the other
            with pytest.raises(WrongLog, match="topic was replaced"):
                Worker(replaced, name, server=node.url).perform("op-5", KIND, TARGET, {"n": 5},
                                                                provider)
        assert replaced.end_offsets(EVENTS).get(0, 0) == 0  # nothing written
    finally:
        replaced.close()
    assert provider.calls[key_of("op-5")] == 0


def test_stuck_is_measured_on_the_log_clock_not_the_writers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """6. A worker whose clock runs 10 minutes behind writes a DISPATCH now: it is not stuck.
    One whose clock runs 10 minutes ahead left a DISPATCH 6 minutes ago: it is."""
    import effectlog.log.sqlite as sqlite_log
    import effectlog.machine as machine
    import effectlog.model as model
    from consumers.bookkeeping import CommandLedger, consumer_db_path
    from consumers.recovery import RecoveryConsumer, RecoverySettings
    from projections import open_reader
    from projections.projector import project

    real_ms, real_time = model.now_ms, time.time
    log = open_log(f"sqlite:///{tmp_path}/log.db")

    def dispatch_with(op: str, skew_ms: int, logged_ago_s: float) -> str:
        with monkeypatch.context() as patch:
            patch.setattr(model, "now_ms", lambda: real_ms() + skew_ms)
            patch.setattr(machine, "now_ms", lambda: real_ms() + skew_ms)
            patch.setattr(sqlite_log.time, "time", lambda: real_time() - logged_ago_s)
            worker = Worker(log, f"skewed-{op}")
            key = worker.create(op, KIND, TARGET, {}).idempotency_key
            worker.reserve(key)
            worker.dispatch(key)
            return key

    behind = dispatch_with("clock-behind", -10 * 60_000, 0)
    ahead = dispatch_with("clock-ahead", +10 * 60_000, 6 * 60)
    project(log, tmp_path / "state")
    reader = open_reader(tmp_path / "state")
    ledger = CommandLedger(consumer_db_path(tmp_path / "state", "recovery"))
    try:
        result = RecoveryConsumer(log, reader, ledger,
                                  RecoverySettings(stuck_after_s=300)).run_once()
    finally:
        ledger.close()
        reader.close()
        log.close()
    assert [c.idempotency_key for c in result.issued] == [ahead]
    assert behind != ahead
