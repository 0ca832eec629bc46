"""Two expirers pick the same settled effect: the second tombstone expires nothing else.

`effectlog expire` and `serve --expire-after` (or two of either) may both pick key K. The
first tombstone expires K's effect; a worker uses K again (a new effect, settled at once);
the second tombstone then lands. It used to be accepted (K is settled), removing the new
effect seconds after it was recorded, and the operation's next retry called the provider a
third time. A tombstone now expires one effect, named by the event id of its last accepted
event: a compare-and-append log (SQLite) writes it only if the key still ends with that
event, and on a log without compare-and-append (Kafka) the rules reject a tombstone naming
another effect than the key holds (``expires_another``).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

import effectlog.cli.expire_command as expire_command
import effectlog.log.sqlite as sqlite_log
from consumers.expiry import Expirer, ExpirySettings
from effectlog.cli.main import cli
from effectlog.errors import ExpiresAnother
from effectlog.log import EVENTS, open_log
from effectlog.log.base import TOMBSTONE, Record
from effectlog.log.memory import MemoryLog
from effectlog.machine import Expiry, check_expiry, fold
from effectlog.model import EffectEvent
from effectlog.worker import Worker
from projections.projector import Projector, project

OP, KIND, TARGET, PAYLOAD = "op-1", "email.send", "mailto:a@example.com", {"n": 1}
KEY = f"agent:{OP}:{KIND}:{TARGET}"


def test_a_second_expirer_leaves_the_effect_recorded_since_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    worker = Worker(log, "w1")
    calls: list[int] = []

    def provider(_: Any) -> dict[str, int]:
        calls.append(1)
        return {"result": len(calls)}

    monkeypatch.setattr(sqlite_log, "time", SimpleNamespace(time=lambda: time.time() - 600))
    assert worker.perform(OP, KIND, TARGET, PAYLOAD, provider) == {"result": 1}
    monkeypatch.setattr(sqlite_log, "time", time)
    serve = Projector(log, tmp_path / "serve-state")  # serve's projection and Expirer
    serve.run(once=True)
    reader = serve.store.reader(lambda key: 0, lambda: [0])
    expirer = Expirer(log, reader, ExpirySettings(60.0), serve.next_offsets)
    project(log, tmp_path / "cli-state")  # the operator's own projection
    archive = expire_command._archive

    def meanwhile(cli_log: Any, keys: list[str], path: str) -> int:
        assert keys == [KEY]  # the CLI chose K; before it tombstones K:
        expired = expirer.run_once()
        assert expired is not None and expired.expired == [KEY]
        serve.run(once=True)
        again = Worker(log, "w2")  # a retry elsewhere: K used again
        assert again.perform(OP, KIND, TARGET, PAYLOAD, provider) == {"result": 2}
        return archive(cli_log, keys, path)

    monkeypatch.setattr(expire_command, "_archive", meanwhile)
    result = CliRunner().invoke(cli, ["--log", url, "--state", str(tmp_path / "cli-state"),
                                      "expire", "--older-than", "1m", "--archive",
                                      str(tmp_path / "archive.avro"), "--json"])
    assert result.exit_code == 0, result.output
    assert '"expired": []' in result.output and '"keys": 1' in result.output
    assert Worker(log, "w3").perform(OP, KIND, TARGET, PAYLOAD, provider) == {"result": 2}
    assert len(calls) == 2
    serve.run(once=True)
    assert serve.store.reader(lambda key: 0, lambda: [0]).get(KEY) is not None


def settled(result: str) -> tuple[MemoryLog, Worker, EffectEvent]:
    """A memory log whose key K holds a settled effect with ``result``."""
    log = MemoryLog()
    worker = Worker(log, "w1")
    worker.perform(OP, KIND, TARGET, PAYLOAD, lambda _: result)
    current = worker.get(KEY)
    assert current is not None
    return log, worker, current


def test_a_conditional_log_writes_a_tombstone_only_for_the_effect_it_names() -> None:
    log, worker, first = settled("first")
    assert list(log.expire([(KEY, first.event_id)])) == [KEY]
    assert list(log.expire([(KEY, first.event_id)])) == []  # expired already
    Worker(log, "w2").perform(OP, KIND, TARGET, PAYLOAD, lambda _: "second")
    assert list(log.expire([(KEY, first.event_id)])) == []  # the key holds another effect
    again = worker.get(KEY)
    assert again is not None and again.outcome is not None
    assert again.outcome.result == "second"


def test_the_rules_reject_a_tombstone_naming_another_effect() -> None:
    _, worker, current = settled("done")
    check_expiry(current, KEY, current.event_id)
    check_expiry(current, KEY)  # a tombstone of an earlier release names nothing
    with pytest.raises(ExpiresAnother) as raised:
        check_expiry(current, KEY, "another-event")
    assert raised.value.reason == "expires_another"
    history = worker.history(KEY)
    folded, rejected = fold([*history, Expiry(KEY, "another-event")])
    assert folded == current and [exc.reason for _, exc in rejected] == ["expires_another"]
    assert fold([*history, Expiry(KEY, current.event_id)])[0] is None


def test_the_projector_keeps_the_key_on_a_tombstone_naming_another_effect(
        tmp_path: Path) -> None:
    log, _, current = settled("done")
    position = log.append(EVENTS, KEY, TOMBSTONE)
    named = Record(EVENTS, 0, position.offset, KEY, TOMBSTONE, 0, expires="another-event")
    log._records[EVENTS][position.offset] = named  # as Kafka reads a tombstone naming one
    projector = Projector(log, tmp_path / "state")
    projector.run(once=True)
    reader = projector.store.reader(lambda key: 0, lambda: [0])
    assert reader.get(KEY) == current
    assert [r.reason for r in reader.rejected()] == ["expires_another"]
