"""Bounded state: settled effects expire (tombstones), on SQLite and in the projector.

The rules (an expiry removes a settled key, is rejected for an open or unknown one, and a
key used again is a new effect), the projection's counts and index, the changelog's
removals (even when a publication carries every key), ``effectlog expire`` with an archive
on SQLite with a retention of seconds, its purge (offsets never reused), and serve's
expirer, which never tombstones a key twice before its first tombstone is applied.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fastavro
import pytest

from consumers.expiry import Expirer, ExpirySettings
from effectlog.codec import event_codec
from effectlog.log import EVENTS, open_log
from effectlog.log.base import PURGED, TOMBSTONE, EventLog
from effectlog.log.memory import MemoryLog
from effectlog.machine import Expiry, advance, fold, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from effectlog.worker import Worker
from projections import open_reader
from projections.projector import Projector
from projections.rocksdb.digest import partition_digest

KIND = "email.send"


def settled(op: str) -> list[EffectEvent]:
    created = new_effect(op, KIND, f"mailto:{op}@example.com", {"to": op}, "w1")
    reserved = advance(created, T.RESERVE, "w1")
    dispatched = advance(reserved, T.DISPATCH, "w1")
    return [created, reserved, dispatched,
            advance(dispatched, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"ok": op}))]


def write(log: EventLog, *items: EffectEvent | bytes, key: str | None = None) -> None:
    codec = event_codec()
    for item in items:
        if isinstance(item, bytes):
            assert key is not None
            log.append(EVENTS, key, item)
        else:
            key = item.idempotency_key
            log.append(EVENTS, key, codec.encode(item.to_record()))


def projected(log: EventLog, state: Path) -> dict[str, Any]:
    with Projector(log, state) as projector:
        projector.run(once=True)
        writer = projector.store.writers()[0]  # type: ignore[attr-defined]
        changes = writer.take_changes()
    reader = open_reader(state)
    try:
        return {"counts": reader.counts(), "changes": changes,
                "index": [e.idempotency_key for s in (State.SUCCEEDED, State.RESERVED)
                          for e in reader.scan_state(s)],
                "get": reader.get}
    finally:
        reader.close()


def test_an_expiry_removes_a_settled_key_and_is_rejected_for_an_open_or_unknown_one(
        tmp_path: Path) -> None:
    log = MemoryLog()
    done, open_, again = settled("done"), settled("open")[:2], settled("again")
    write(log, *done, TOMBSTONE)
    write(log, *open_, TOMBSTONE)
    write(log, TOMBSTONE, key="agent:never:email.send:mailto:n@example.com")
    write(log, *again, TOMBSTONE)
    reused = new_effect("again", KIND, "mailto:again@example.com", {"to": "other"}, "w2")
    write(log, reused)
    found = projected(log, tmp_path / "state")
    counts = found["counts"]
    assert counts["metric:expired"] == 2 and counts["rejected:not_settled"] == 2
    assert counts["state:RESERVED"] == 1 and counts["state:CREATED"] == 1
    assert "state:SUCCEEDED" not in counts
    assert found["index"] == [open_[0].idempotency_key]
    reader = open_reader(tmp_path / "state")
    try:
        assert reader.get(done[0].idempotency_key) is None
        current = reader.get(reused.idempotency_key)
        assert current is not None and current.payload_hash == reused.payload_hash
    finally:
        reader.close()
    published = dict(found["changes"].changes)
    assert published[done[0].idempotency_key.encode()] is None  # the changelog removes it too


def test_the_fold_of_a_worker_agrees() -> None:
    done = settled("f")
    assert fold([*done, Expiry(done[0].idempotency_key)])[0] is None
    current, rejected = fold([*done[:2], Expiry(done[0].idempotency_key)])
    assert current == done[1] and [exc.reason for _, exc in rejected] == ["not_settled"]


def test_a_publication_of_every_key_still_names_the_removed_ones(tmp_path: Path) -> None:
    log = MemoryLog()
    write(log, *settled("a"), TOMBSTONE)
    write(log, *settled("b"))
    with Projector(log, tmp_path / "s") as projector:
        projector.run(once=True)
        writer = projector.store.writers()[0]  # type: ignore[attr-defined]
        writer.tracker.full = True  # too many keys changed to track one by one
        changes = writer.take_changes()
    assert changes is not None and changes.full
    values = dict(changes.changes)
    assert values[settled("a")[0].idempotency_key.encode()] is None
    assert values[settled("b")[0].idempotency_key.encode()] is not None


def cli(url: str, state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
                           str(state), *args], capture_output=True, text=True, timeout=120)


def perform(worker: Worker, calls: list[str], op: str) -> None:
    worker.perform(op, KIND, f"mailto:{op}@example.com", {"to": op},
                   lambda ctx: calls.append(op) or {"sent": op})


def test_expire_on_sqlite_with_a_retention_of_seconds(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    state = tmp_path / "state"
    calls: list[str] = []
    with open_log(url) as log:
        worker = Worker(log, "w1")
        for n in range(4):
            perform(worker, calls, f"op{n}")
        worker.reserve(worker.create("open", KIND, "mailto:o@example.com", {}).idempotency_key)
    assert cli(url, state, "project", "--once").returncode == 0
    young = cli(url, state, "expire", "--older-than", "1h", "--json")
    assert young.returncode == 0 and json.loads(young.stdout)["keys"] == 0
    time.sleep(1.1)
    dry = cli(url, state, "expire", "--older-than", "1s", "--dry-run", "--json")
    assert len(json.loads(dry.stdout)["would_expire"]) == 4
    archive = tmp_path / "expired.avro"
    done = cli(url, state, "expire", "--older-than", "1s", "--archive", str(archive), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["archived_records"] == 16
    with archive.open("rb") as handle:
        assert len(list(fastavro.reader(handle))) == 16
    figures = json.loads(cli(url, state, "stats", "--json").stdout)
    assert (figures["held"], figures["expired"]) == (1, 4)
    with open_log(url) as log:  # a new effect under an expired key (a worker's fresh memory)
        perform(Worker(log, "w2"), calls, "op0")
    assert calls.count("op0") == 2
    audit = cli(url, state, "replay", "--out", "/dev/null", "--json")
    assert audit.returncode == 0 and json.loads(audit.stdout)["expiries"] == 4


def test_purge_deletes_expired_records_but_never_reuses_an_offset(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    with open_log(url) as log:
        write(log, *settled("p1"), TOMBSTONE)
        write(log, *settled("p2")[:2], TOMBSTONE)  # rejected: p2 stays whole
        write(log, *settled("p3"), TOMBSTONE)  # the table's last row
        end = log.end_offsets(EVENTS)[0]
        assert log.purge_expired(int(time.time() * 1000) + 1000) == 8
        for op in ("p1", "p3"):  # each tombstone stays, as its key's purge mark
            [mark] = log.read_key(EVENTS, settled(op)[0].idempotency_key)
            assert (mark.value, mark.expires) == (TOMBSTONE, PURGED)
        assert len(log.read_key(EVENTS, settled("p2")[0].idempotency_key)) == 3
        assert log.purge_expired(int(time.time() * 1000) + 1000) == 0
        write(log, *settled("p4")[:1])
        [record] = log.read_key(EVENTS, settled("p4")[0].idempotency_key)
        assert record.offset == end  # past every offset ever written
    with sqlite3.connect(tmp_path / "log.db") as db:
        assert db.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 1 + 3 + 1 + 1


def test_serves_expirer_waits_for_its_tombstones_to_be_applied(tmp_path: Path) -> None:
    log = MemoryLog()
    for op in ("e1", "e2"):
        write(log, *settled(op))
    state = tmp_path / "state"
    with Projector(log, state) as projector:
        projector.run(once=True)
        reader = projector.store.reader(lambda key: 0, lambda: [0])  # type: ignore[attr-defined]
        expirer = Expirer(log, reader, ExpirySettings(0.0), projector.next_offsets)
        first = expirer.run_once()
        assert first is not None and len(first.expired) == 2
        assert expirer.run_once() is None  # not applied yet: no second tombstone
        projector.run(once=True)
        again = expirer.run_once()
        assert again is not None and again.expired == []
    digest_live = partition_digest(state, 0, ("state", "index"))
    with Projector(log, tmp_path / "replayed") as replay:
        replay.run(once=True)
    assert partition_digest(tmp_path / "replayed", 0, ("state", "index")) == digest_live
    assert sum(1 for r in log.read(EVENTS, 0, 0, 100) if not r.value) == 2


@pytest.mark.parametrize("bad", ["-1s", "soon"])
def test_bad_retentions_are_refused(tmp_path: Path, bad: str) -> None:
    found = cli(f"sqlite:///{tmp_path}/log.db", tmp_path / "s", "expire", "--older-than", bad)
    assert found.returncode == 2 and found.stderr.count("\n") == 1
