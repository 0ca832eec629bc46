"""``make kafka-up`` (``python -m tools.kafka up``) never starts a broker beside one whose
recorded process still lives, whatever that one answers: a paused or slow broker is not a dead
one, and a second start would overwrite the pid file ``make kafka-down`` stops."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import tools.kafka.__main__ as cli


@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """A live process (``sleep``) recorded as the running broker, and a ``tools.kafka`` whose
    every start is recorded in the list instead of run."""
    home = tmp_path / "kafka"
    home.mkdir()
    dummy = subprocess.Popen(["sleep", "60"])
    try:
        (home / "pid").write_text(f"{dummy.pid}\n")
        (home / "bootstrap").write_text("127.0.0.1:9\n")
        monkeypatch.setattr(cli, "HOME", home)
        started: list[int] = []

        def broker(*args: object, **kwargs: object) -> None:
            started.append(1)
            raise AssertionError("a broker was started beside a running one")

        monkeypatch.setattr(cli, "KafkaBroker", broker)
        monkeypatch.setattr(cli, "_up_cluster", lambda brokers: started.append(brokers) or 0)
        yield started
    finally:
        dummy.kill()
        dummy.wait(10)


@pytest.mark.parametrize("brokers", [1, 3])
def test_kafka_up_refuses_while_a_recorded_broker_lives_and_does_not_answer(
        recorded: list[int], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], brokers: int) -> None:
    monkeypatch.setattr(cli, "answers_metadata", lambda bootstrap, timeout=5.0: False)
    assert cli.up(brokers) == 3
    assert recorded == []
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "make kafka-down first" in err, err


def test_kafka_up_refuses_when_no_address_was_recorded_for_the_live_broker(
        recorded: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    (cli.HOME / "bootstrap").unlink()
    monkeypatch.setattr(cli, "answers_metadata", lambda bootstrap, timeout=5.0: True)
    assert cli.up(1) == 3 and recorded == []


def test_kafka_up_is_a_no_op_when_the_recorded_broker_answers(
        recorded: list[int], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cli, "answers_metadata", lambda bootstrap, timeout=5.0: True)
    assert cli.up(1) == 0 and recorded == []
    assert capsys.readouterr().out.splitlines()[-1] == "KAFKA_BOOTSTRAP=127.0.0.1:9"
