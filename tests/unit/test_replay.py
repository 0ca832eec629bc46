"""`effectlog replay`: JSON lines and Avro archives of the log, filters, and verification."""

from __future__ import annotations

import io
import json
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import fastavro
import pytest
from click.testing import CliRunner, Result

from effectlog.audit import (
    HistoryVerifier,
    Replay,
    ReplayFilter,
    parse_duration_ms,
    parse_time,
)
from effectlog.cli.main import cli
from effectlog.codec import event_codec
from effectlog.errors import InvalidInput
from effectlog.log import EVENTS, EventLog, Record, open_log
from effectlog.model import EffectEvent, Outcome, State, Transition
from effectlog.worker import Worker

KIND = "email.send"


def key_of(op: str) -> str:
    return f"agent:{op}:{KIND}:mailto:{op}@example.com"


def perform(worker: Worker, op: str) -> None:
    worker.perform(op, KIND, f"mailto:{op}@example.com", {"to": op}, lambda call: {"id": op})


def append_raw(log: EventLog, event: EffectEvent, key: str | None = None) -> int:
    """Append an event as a rogue writer would: no checks, straight onto the log."""
    position = log.append(EVENTS, key or event.idempotency_key,
                          event_codec().encode(event.to_record()))
    return position.offset


def forged(event: EffectEvent, **changes: Any) -> EffectEvent:
    return replace(event, event_id=uuid.uuid4().hex, **changes)


@dataclass
class Filled:
    url: str
    log: EventLog
    bad: dict[str, int]  # reason -> offset of the planted record


@pytest.fixture
def clean(tmp_path: Path) -> Filled:
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    worker = Worker(log, "w1")
    for op in ("op-a", "op-b", "op-c"):
        perform(worker, op)
    return Filled(url, log, {})


@pytest.fixture
def dirty(clean: Filled) -> Filled:
    """The clean log plus one planted record per kind of violation."""
    log = clean.log
    w1, w2 = Worker(log, "w1"), Worker(log, "w2")
    key = key_of("op-d")
    w1.create("op-d", KIND, "mailto:op-d@example.com", {"to": "op-d"})
    claim1 = w1.reserve(key)                          # epoch 1, owner w1
    w2.reserve(key)                                   # CLAIM: epoch 2, owner w2
    bad = clean.bad
    bad["epoch_regression"] = append_raw(log, forged(
        claim1, transition=Transition.DISPATCH, state=State.DISPATCHED, attempt=1))
    bad["payload_hash_changed"] = append_raw(log, forged(
        claim1, transition=Transition.CLAIM, fencing_epoch=3, payload_hash="0" * 64))
    bad["foreign_owner"] = append_raw(log, forged(
        claim1, transition=Transition.DISPATCH, state=State.DISPATCHED, attempt=1,
        fencing_epoch=2, worker_id="w1"))
    created = w1.create("op-e", KIND, "mailto:op-e@example.com", {"to": "op-e"})
    bad["illegal_transition"] = append_raw(log, forged(
        created, transition=Transition.RECORD, state=State.SUCCEEDED,
        outcome=Outcome(State.SUCCEEDED, {"id": 1})))
    bad["undecodable"] = log.append(EVENTS, key_of("op-e"), b"\xc3\x01not avro at all").offset
    bad["key_mismatch"] = append_raw(log, forged(created, transition=Transition.RESERVE,
                                                 state=State.RESERVED, fencing_epoch=1),
                                     key=key_of("op-a"))
    return clean


def invoke(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--log", url, "replay", *args], catch_exceptions=False)


def log_events(log: EventLog) -> list[tuple[int, EffectEvent]]:
    return [(r.offset, EffectEvent.from_record(event_codec().decode(r.value)))
            for r in log.scan(EVENTS, 0)]


# -- JSON lines ------------------------------------------------------------------------------

def test_jsonl_has_one_line_per_event_with_position_and_timestamp(clean: Filled) -> None:
    result = invoke(clean.url)
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    expected = log_events(clean.log)
    assert len(lines) == len(expected) == 12
    for line, (offset, event) in zip(lines, expected, strict=True):
        assert line["position"] == {"partition": 0, "offset": offset}
        assert isinstance(line["timestamp"], int) and line["timestamp"] > 0
        assert line["event"] == json.loads(json.dumps(event.to_json()))
        assert "violation" not in line
    assert lines[0]["event"]["payload"] == {"to": "op-a"}
    assert "violations: 0" in result.stderr and "3 keys" in result.stderr


def test_json_summary_goes_to_stdout_when_output_is_a_file(clean: Filled, tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    result = invoke(clean.url, "--out", str(out), "--json")
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert summary["events"] == 12 and summary["keys"] == 3 and summary["violations"] == 0
    assert len(out.read_text().splitlines()) == 12
    assert out.stat().st_mode & 0o777 == 0o600


# -- Avro ------------------------------------------------------------------------------------

def test_avro_archive_reads_back_with_plain_fastavro(clean: Filled, tmp_path: Path) -> None:
    out = tmp_path / "archive.avro"
    result = invoke(clean.url, "--format", "avro", "--out", str(out))
    assert result.exit_code == 0, result.stderr
    with out.open("rb") as handle:
        reader = fastavro.reader(handle)
        records = list(reader)
        assert reader.metadata["avro.codec"] == "deflate"
        assert reader.metadata["effectlog.log"].startswith("sqlite:///")
        schema = reader.writer_schema
    assert isinstance(schema, dict)
    event_branch = next(f for f in schema["fields"] if f["name"] == "event")["type"][1]
    assert event_branch["name"] == "io.effectlog.EffectEvent"
    expected = log_events(clean.log)
    assert [(r["partition"], r["offset"]) for r in records] == [(0, o) for o, _ in expected]
    assert [EffectEvent.from_record(r["event"]) for r in records] == [e for _, e in expected]
    assert all(r["undecodable"] is None and r["violation"] is None for r in records)


def test_avro_to_stdout_is_a_valid_container(clean: Filled) -> None:
    result = invoke(clean.url, "--format", "avro", "--key", key_of("op-b"))
    assert result.exit_code == 0
    records = list(fastavro.reader(io.BytesIO(result.stdout_bytes)))
    assert [r["event"]["transition"] for r in records] == ["CREATE", "RESERVE", "DISPATCH",
                                                            "RECORD"]


def test_avro_archive_keeps_undecodable_bytes_and_violations(dirty: Filled, tmp_path: Path) -> None:
    out = tmp_path / "archive.avro"
    assert invoke(dirty.url, "--format", "avro", "--out", str(out)).exit_code == 3
    with out.open("rb") as handle:
        records = {r["offset"]: r for r in fastavro.reader(handle)}
    garbage = records[dirty.bad["undecodable"]]
    assert garbage["event"] is None and garbage["raw"] == b"\xc3\x01not avro at all"
    assert garbage["undecodable"]
    assert records[dirty.bad["epoch_regression"]]["violation"]["reason"] == "epoch_regression"


# -- filters ---------------------------------------------------------------------------------

def test_key_filter_streams_only_that_keys_history(clean: Filled) -> None:
    result = invoke(clean.url, "--key", key_of("op-b"))
    assert result.exit_code == 0
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert {line["key"] for line in lines} == {key_of("op-b")}
    assert [line["event"]["state"] for line in lines] == ["CREATED", "RESERVED", "DISPATCHED",
                                                          "SUCCEEDED"]


def test_since_and_until_select_by_log_timestamp(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    worker = Worker(log, "w1")
    stamps = []
    for op in ("op-1", "op-2", "op-3"):
        time.sleep(0.01)
        stamps.append(int(time.time() * 1000))
        time.sleep(0.01)
        perform(worker, op)
    result = invoke(url, "--since", str(stamps[1]), "--until", str(stamps[2]), "--json")
    assert result.exit_code == 0, result.stderr
    keys = {json.loads(line)["key"] for line in result.stdout.splitlines()}
    assert keys == {key_of("op-2")}
    iso = invoke(url, "--since", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(stamps[2] / 1000 - 1)))
    assert key_of("op-3") in iso.stdout
    assert invoke(url, "--since", "1h").stdout.count("\n") == 12
    assert invoke(url, "--until", "1h").stdout == ""


def test_window_starting_mid_history_takes_the_first_event_as_baseline(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    worker = Worker(log, "w1")
    worker.create("op-1", KIND, "mailto:op-1@example.com", {"to": 1})
    key = "agent:op-1:email.send:mailto:op-1@example.com"
    worker.reserve(key)
    time.sleep(0.01)
    since = int(time.time() * 1000)
    time.sleep(0.01)
    worker.dispatch(key)
    worker.record(key, "succeeded", {"ok": True})
    windowed = invoke(url, "--since", str(since), "--out", str(tmp_path / "w.jsonl"), "--json")
    assert windowed.exit_code == 0
    summary = json.loads(windowed.stdout)
    assert (summary["events"], summary["partial_keys"], summary["violations"]) == (2, 1, 0)
    assert summary["scope"]["history"] == "window"


def test_bad_filter_values_are_usage_errors(clean: Filled) -> None:
    assert invoke(clean.url, "--since", "yesterday").exit_code == 2
    assert invoke(clean.url, "--since", "2h", "--until", "3h").exit_code != 0
    with pytest.raises(InvalidInput):
        ReplayFilter(key="not-a-key")


# -- verification ----------------------------------------------------------------------------

def test_violations_are_listed_with_position_and_reason_and_exit_3(dirty: Filled) -> None:
    result = invoke(dirty.url, "--out", "-", "--json")
    assert result.exit_code == 3
    summary = json.loads(result.stderr.strip().splitlines()[-1])
    found = {v["reason"]: v["position"]["offset"] for v in summary["violation_list"]}
    assert found == dirty.bad
    assert summary["violations"] == len(dirty.bad)
    assert summary["violations_by_reason"] == dict.fromkeys(sorted(dirty.bad), 1)
    lines = {json.loads(line)["position"]["offset"]: json.loads(line)
             for line in result.stdout.splitlines()}
    for reason, offset in dirty.bad.items():
        assert lines[offset]["violation"]["reason"] == reason


def test_human_summary_lists_each_violation(dirty: Filled, tmp_path: Path) -> None:
    result = invoke(dirty.url, "--out", str(tmp_path / "x.jsonl"))
    assert result.exit_code == 3
    assert f"violations: {len(dirty.bad)}" in result.stderr
    for reason, offset in dirty.bad.items():
        assert any(line.strip().startswith(f"0:{offset} ") and reason in line
                   for line in result.stderr.splitlines()), reason


def test_undecodable_records_appear_with_reason_and_raw_bytes(dirty: Filled) -> None:
    result = invoke(dirty.url)
    line = json.loads(result.stdout.splitlines()[dirty.bad["undecodable"]])
    assert "event" not in line
    assert line["undecodable"] and line["raw_b64"] == "wwFub3QgYXZybyBhdCBhbGw="
    assert line["violation"]["reason"] == "undecodable"


def test_key_filter_verifies_only_that_key(dirty: Filled) -> None:
    assert invoke(dirty.url, "--key", key_of("op-b")).exit_code == 0
    assert invoke(dirty.url, "--key", key_of("op-d")).exit_code == 3


def _record(offset: int, event: EffectEvent) -> Record:
    return Record(EVENTS, 0, offset, event.idempotency_key, b"", 0)


def test_history_without_its_create_is_flagged_unless_windowed(clean: Filled) -> None:
    events = [e for _, e in log_events(clean.log) if e.idempotency_key == key_of("op-a")]
    strict, lenient = HistoryVerifier(), HistoryVerifier(trust_first=True)
    first = strict.observe(_record(1, events[1]), events[1])
    assert first is not None and first.reason == "missing_create"
    assert lenient.observe(_record(1, events[1]), events[1]) is None
    # strict, as the projector: the rejected event is no baseline, so neither is what follows
    then = strict.observe(_record(2, events[2]), events[2])
    assert then is not None and then.reason == "missing_create"
    assert lenient.observe(_record(2, events[2]), events[2]) is None  # checked from the baseline
    dup = lenient.observe(_record(3, events[2]), events[2])
    assert dup is not None and dup.reason == "duplicate"
    for verifier in (strict, lenient):
        assert verifier.partial_keys == {key_of("op-a")}


def test_progress_reports_every_offset_scanned(dirty: Filled) -> None:
    seen: list[int] = []
    run = Replay(dirty.log, progress=seen.append)
    items = list(run)
    assert sum(seen) == run.total() == len(items)
    assert run.summary.undecodable == 1 and run.summary.keys == 5


# -- time parsing ----------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("1700000000000", 1_700_000_000_000),
    ("2023-11-14T22:13:20Z", 1_700_000_000_000),
    ("2023-11-14T22:13:20", 1_700_000_000_000),
    ("2023-11-15T00:13:20+02:00", 1_700_000_000_000),
    ("2h", 1_700_000_000_000 - 7_200_000),
    ("1h30m", 1_700_000_000_000 - 5_400_000),
    ("1d", 1_700_000_000_000 - 86_400_000),
])
def test_times_accept_iso_epoch_ms_and_relative(text: str, expected: int) -> None:
    assert parse_time(text, now=1_700_000_000_000) == expected


@pytest.mark.parametrize("text", ["", "soon", "2x", "h2", "2h junk"])
def test_bad_times_are_invalid_input(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_time(text)


def test_duration_units() -> None:
    assert parse_duration_ms("90s") == 90_000 and parse_duration_ms("1w") == 604_800_000
    assert parse_duration_ms("250ms") == 250


def test_events_after_a_rejected_create_are_not_taken_as_a_baseline(clean: Filled) -> None:
    events = [e for _, e in log_events(clean.log) if e.idempotency_key == key_of("op-a")]
    bad_create = replace(events[0], fencing_epoch=5)
    verifier = HistoryVerifier(trust_first=True)
    first = verifier.observe(_record(0, bad_create), bad_create)
    assert first is not None and first.reason == "illegal_transition"
    second = verifier.observe(_record(1, events[1]), events[1])
    assert second is not None and second.reason == "illegal_transition"
    assert verifier.partial_keys == set()


def test_progress_bar_runs_on_a_terminal_and_is_silent_otherwise(clean: Filled) -> None:
    from effectlog.cli.replay_command import _progress

    with _progress(False) as (advance, set_total):
        assert advance is None
    with _progress(True) as (advance, set_total):
        assert advance is not None
        run = Replay(clean.log, progress=advance)
        set_total(run.total())
        assert len(list(run)) == 12
