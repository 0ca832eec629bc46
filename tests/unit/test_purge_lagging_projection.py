"""A projection that lagged behind a SQLite purge ends as a full replay of the file.

Found by an audit: `expire --purge-after` deleted every row of an expired key, its tombstone
too. A projection that had applied part of them (a second state directory, a serve stopped for
longer than the purge delay, a rebuild running across the purge) skipped the gap unseen and
kept the key as it last saw it: DISPATCHED for ever, which recovery then sent reconcile
commands for, and a key used again after the purge was rejected as ``illegal_transition``
there. The purge now keeps the tombstone as a purge mark, which removes whatever the key holds.

The CLI runs in-process (click's runner) on a real SQLite file and RocksDB projections.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import Message

from effectlog.cli.main import cli
from effectlog.errors import NotSettled
from effectlog.log import EVENTS, open_log
from effectlog.log.base import EXPIRES_HEADER, PURGED
from effectlog.log.kafka.reader import record_of
from effectlog.machine import check_expiry
from effectlog.model import State
from effectlog.worker import Worker

KIND, TARGET, OP = "email.send", "mailto:k@example.com", "op-k"


def run(url: str, state: Path, *args: str) -> str:
    result = CliRunner().invoke(cli, ["--log", url, "--state", str(state), *args])
    assert result.exit_code == 0, (args, result.exit_code, result.output)
    return result.output


def state_of(url: str, state: Path, key: str) -> str | None:
    result = CliRunner().invoke(cli, ["--log", url, "--state", str(state), "get", key,
                                      "--json", "--no-catch-up"])
    if result.exit_code == 1:  # no such effect
        return None
    assert result.exit_code == 0, result.output
    return str(json.loads(result.output)["state"])


def full_replay(url: str, tmp: Path, key: str) -> str | None:
    fresh = tmp / f"replay-{time.monotonic_ns()}"
    run(url, fresh, "project", "--once", "--quiet")
    return state_of(url, fresh, key)


def perform(url: str, worker_id: str, payload: dict[str, str], *, record: bool = True) -> str:
    with open_log(url) as log:
        worker = Worker(log, worker_id)
        key = worker.create(OP, KIND, TARGET, payload).idempotency_key
        worker.reserve(key)
        worker.dispatch(key)
        if record:
            worker.record(key, State.SUCCEEDED, {"sent": key})
        return key


def purged_behind(tmp: Path) -> tuple[str, str]:
    """K dispatched; projection B applies up to there and stops; K succeeds, expires (on A)
    and is purged, with ordinary traffic after its tombstone."""
    url = f"sqlite:///{tmp}/log.db"
    key = perform(url, "w1", {"to": "k"}, record=False)
    run(url, tmp / "B", "project", "--once", "--quiet")  # B lags from here on
    with open_log(url) as log:
        Worker(log, "w1").record(key, State.SUCCEEDED, {"sent": key})
    assert expire_and_purge(url, tmp / "A", key, "op-other") == 4  # C, R, D, RECORD
    return url, key


def expire_and_purge(url: str, state: Path, key: str, other: str) -> int:
    """Expire the settled ``key`` (projected in ``state``), append an effect ``other``
    after its tombstone, and purge: how many records went."""
    run(url, state, "project", "--once", "--quiet")
    time.sleep(1.1)
    assert json.loads(run(url, state, "expire", "--older-than", "1s", "--json"))[
        "expired"] == [key]
    with open_log(url) as log:
        Worker(log, "w2").create(other, KIND, f"mailto:{other}@example.com", {"to": other})
    report = json.loads(run(url, state, "expire", "--older-than", "1h", "--purge-after",
                            "0s", "--json"))
    return int(report["purged"])


def test_a_projection_that_lagged_behind_a_purge_forgets_the_key_as_a_full_replay_does(
        tmp_path: Path) -> None:
    url, key = purged_behind(tmp_path)
    with open_log(url, create=False) as log:
        [mark] = log.read_key(EVENTS, key)
    assert (mark.value, mark.expires) == (b"", PURGED)
    assert state_of(url, tmp_path / "B", key) == State.DISPATCHED.value  # before it catches up
    run(url, tmp_path / "B", "project", "--once", "--quiet")
    assert state_of(url, tmp_path / "B", key) is None
    assert full_replay(url, tmp_path, key) is None
    # nothing stuck is left for recovery to send commands for
    report = json.loads(run(url, tmp_path / "B", "recover", "--once", "--stuck-after", "0s",
                            "--json"))
    assert key not in json.dumps(report)


def test_a_key_used_again_after_its_purge_is_followed_by_a_projection_that_lagged(
        tmp_path: Path) -> None:
    url, key = purged_behind(tmp_path)
    assert perform(url, "w3", {"to": "k"}) == key  # a new effect under the same key
    run(url, tmp_path / "B", "project", "--once", "--quiet")
    assert state_of(url, tmp_path / "B", key) == State.SUCCEEDED.value
    assert full_replay(url, tmp_path, key) == State.SUCCEEDED.value
    stats = json.loads(run(url, tmp_path / "B", "stats", "--json", "--no-catch-up"))
    assert not stats.get("rejected"), stats


def test_a_purge_keeps_one_mark_per_key_and_purges_an_old_mark_with_the_next_effect(
        tmp_path: Path) -> None:
    url, key = purged_behind(tmp_path)
    again = json.loads(run(url, tmp_path / "A", "expire", "--older-than", "1h",
                           "--purge-after", "0s", "--json"))
    assert again["purged"] == 0  # the mark alone is left: nothing more to delete
    perform(url, "w3", {"to": "k"})
    # the old mark and the second effect's four events
    assert expire_and_purge(url, tmp_path / "A", key, "op-third") == 5
    with open_log(url, create=False) as log:
        assert [(r.value, r.expires) for r in log.read_key(EVENTS, key)] == [(b"", PURGED)]
    assert full_replay(url, tmp_path, key) is None


def test_a_purge_mark_removes_whatever_the_key_holds_and_only_sqlite_reading_makes_one(
        ) -> None:
    check_expiry(None, "k", PURGED)  # no error: nothing of the key is left
    with pytest.raises(NotSettled):
        check_expiry(None, "k", None)
    # a Kafka tombstone whose header claims to be a mark is an ordinary (unnamed) tombstone
    message = Message(topic="p.events", partition=0, offset=7, key=b"k", value=None,
                      headers=[(EXPIRES_HEADER, PURGED.encode())], timestamp=(1, 1000))
    assert record_of(EVENTS, 0, 7, message).expires is None
