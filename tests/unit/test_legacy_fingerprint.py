"""Logs written with the pre-spec header (fingerprint byte-reversed) stay readable, and are counted.

A log upgraded in place holds both orders: the old records of a key, then new ones written
in the spec's order. The projector, ``stats``, ``replay`` and ``history`` read both.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import fastavro
import pytest
from click.testing import CliRunner

from effectlog.cli.main import cli
from effectlog.codec import event_codec
from effectlog.log import EVENTS, open_log
from effectlog.machine import advance, new_effect
from effectlog.model import EffectEvent, Outcome, State
from effectlog.model import Transition as T
from projections import open_reader
from projections.projector import DecoderChoice, ProjectorSettings, project

KIND = "email.send"


def legacy_bytes(event: EffectEvent) -> bytes:
    """``event`` encoded as earlier effectlog versions wrote it: the fingerprint reversed."""
    data = event_codec().encode(event.to_record())
    return data[:2] + data[2:10][::-1] + data[10:]


def history(op: str) -> list[EffectEvent]:
    created = new_effect(op, KIND, f"mailto:{op}@example.com", {"to": op}, "w1")
    reserved = advance(created, T.RESERVE, "w1")
    dispatched = advance(reserved, T.DISPATCH, "w1")
    recorded = advance(dispatched, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"id": op}))
    return [created, reserved, dispatched, recorded]


@pytest.fixture
def upgraded_log(tmp_path: Path) -> tuple[str, list[EffectEvent]]:
    """Three keys: one all legacy, one legacy then spec order (the upgrade), one spec order.
    Seven of the twelve records carry the legacy header."""
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    events: list[EffectEvent] = []
    for op, legacy_count in (("old", 4), ("mid", 3), ("new", 0)):
        for n, event in enumerate(history(op)):
            data = legacy_bytes(event) if n < legacy_count else event_codec().encode(event.to_record())
            log.append(EVENTS, event.idempotency_key, data)
            events.append(event)
    log.close()
    return url, events


def invoke(url: str, state: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["--log", url, "--state", str(state), *args])
    return result.exit_code, result.output


@pytest.mark.parametrize("decoder", ["inline", "process"])
def test_projector_accepts_legacy_records_and_counts_them(
        upgraded_log: tuple[str, list[EffectEvent]], tmp_path: Path,
        decoder: DecoderChoice) -> None:
    url, events = upgraded_log
    log = open_log(url)
    try:
        project(log, tmp_path / "state", ProjectorSettings(decoder=decoder, process_decode_min=1))
    finally:
        log.close()
    with open_reader(tmp_path / "state") as reader:
        counts = reader.counts()
        assert reader.get(events[3].idempotency_key) == events[3]
        assert reader.get(events[7].idempotency_key) == events[7]
    assert counts["legacy:fingerprint_order"] == 7
    assert counts["state:SUCCEEDED"] == 3
    assert not [label for label in counts if label.startswith("rejected:")]


def test_stats_reports_how_many_legacy_records_were_read(
        upgraded_log: tuple[str, list[EffectEvent]], tmp_path: Path) -> None:
    url, _ = upgraded_log
    state = tmp_path / "state"
    assert invoke(url, state, "project", "--once", "--quiet")[0] == 0
    code, out = invoke(url, state, "stats", "--json")
    assert code == 0 and json.loads(out)["legacy_records"] == 7
    code, out = invoke(url, state, "stats")
    assert code == 0 and "legacy records read" in out and "7" in out


def test_stats_of_a_log_without_legacy_records_says_zero(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    for event in history("new"):
        log.append(EVENTS, event.idempotency_key, event_codec().encode(event.to_record()))
    log.close()
    assert invoke(url, tmp_path / "state", "project", "--once", "--quiet")[0] == 0
    code, out = invoke(url, tmp_path / "state", "stats", "--json")
    assert code == 0 and json.loads(out)["legacy_records"] == 0
    assert "legacy records read" not in invoke(url, tmp_path / "state", "stats")[1]


def test_replay_archive_of_a_legacy_log_holds_every_event(
        upgraded_log: tuple[str, list[EffectEvent]], tmp_path: Path) -> None:
    url, events = upgraded_log
    archive = tmp_path / "audit.avro"
    code, out = invoke(url, tmp_path / "state", "replay", "--format", "avro", "--out", str(archive))
    assert code == 0, out
    with archive.open("rb") as handle:
        rows = list(fastavro.reader(io.BytesIO(handle.read())))
    assert [row["undecodable"] for row in rows] == [None] * len(events)
    assert [EffectEvent.from_record(row["event"]) for row in rows] == events  # type: ignore[arg-type]


def test_history_reads_legacy_records(upgraded_log: tuple[str, list[EffectEvent]],
                                      tmp_path: Path) -> None:
    url, events = upgraded_log
    code, out = invoke(url, tmp_path / "state", "history", events[0].idempotency_key, "--json")
    assert code == 0, out
    rows = [json.loads(line) for line in out.splitlines()]
    assert [row["verdict"] for row in rows] == ["accepted"] * 4
    assert [row["event"]["state"] for row in rows] == ["CREATED", "RESERVED", "DISPATCHED",
                                                       "SUCCEEDED"]
