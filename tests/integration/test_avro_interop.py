"""Interop with Apache Avro's Java implementation and Apache Kafka's own tools.

Java's ``BinaryMessageDecoder`` (``org.apache.avro:avro`` 1.12, built by :mod:`tools.avro.interop`)
decodes what effectlog wrote to the Kafka topic, effectlog decodes and projects what Java's
``BinaryMessageEncoder`` wrote, Java's ``DataFileReader`` reads ``replay --format avro``
archives, and Kafka's console consumer prints the topic's keys. Java's records come back in
Avro's JSON encoding and are read with fastavro, so every field is compared.
"""

from __future__ import annotations

import io
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import fastavro
import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, TopicPartition

from consumers.commands import ReconciliationCommand
from effectlog.cli.main import cli
from effectlog.codec import Codec, command_codec, event_codec, schema_fingerprint
from effectlog.log import COMMANDS, EVENTS, EventLog, open_log
from effectlog.log.kafka import KafkaSettings
from effectlog.machine import advance, new_effect
from effectlog.model import Approval, Decision, EffectEvent, Outcome, State
from effectlog.model import Transition as T
from projections import open_reader
from projections.projector import project
from tests.judges import scribe
from tools.avro import interop

ROOT = Path(__file__).resolve().parents[2]
EVENT_AVSC = ROOT / "schemas" / "effect_event.v2.avsc"
COMMAND_AVSC = ROOT / "schemas" / "reconciliation_command.v1.avsc"
V1_AVSC = ROOT / "tests" / "fixtures" / "effect_event.v1.avsc"
KIND = "email.send"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"


@pytest.fixture(scope="module", autouse=True)
def avro_java() -> None:
    """Avro's Java implementation, fetched and compiled once (cached by source hash)."""
    try:
        interop.build()
    except interop.InteropError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"Avro's Java implementation is unavailable: {exc}")
        pytest.skip(f"Avro's Java implementation is unavailable: {exc}")


# -- records -------------------------------------------------------------------------------

def histories(tag: str) -> list[list[EffectEvent]]:
    """Effect histories that use every field of the schema: non-ASCII payload bytes, a
    payload kept off the log, errors, approvals, outcomes from a worker and from a lookup."""
    a = new_effect(f"{tag}-a", KIND, "mailto:zoë@example.com", {"note": "é\u0000✓", "n": 7}, "w1")
    a1 = advance(a, T.RESERVE, "w1")
    a2 = advance(a1, T.DISPATCH, "w1")
    a3 = advance(a2, T.RECORD, "w1", outcome=Outcome(State.SUCCEEDED, {"id": "msg-7"}))
    b = new_effect(f"{tag}-b", "payment.charge", "acct:42", {"cents": 1200}, "w1",
                   payload_ref="vault://payments/42")
    b1 = advance(b, T.RESERVE, "w1")
    b2 = advance(b1, T.DISPATCH, "w1")
    b3 = advance(b2, T.UNKNOWN, "w1", error="provider timed out after 30s")
    b4 = advance(b3, T.AWAIT_APPROVAL, "w1")
    b5 = advance(b4, T.APPROVE, "reconciler",
                 approval=Approval(Decision.RETRY, "alice", "bank says no charge"))
    b6 = advance(b5, T.DISPATCH, "reconciler")
    b7 = advance(b6, T.RECORD, "reconciler",
                 outcome=Outcome(State.FAILED, {"code": 402, "why": "declined"}, "lookup"))
    return [[a, a1, a2, a3], [b, b1, b2, b3, b4, b5, b6, b7]]


def from_avro_json(records: Sequence[dict[str, Any]], codec: Codec) -> list[dict[str, Any]]:
    """Records in Avro's JSON encoding (as Java wrote them), read with fastavro."""
    text = "".join(json.dumps(record) + "\n" for record in records)
    return [dict(r) for r in fastavro.json_reader(io.StringIO(text), codec.schema)]  # type: ignore[arg-type]


def to_avro_json(records: Sequence[dict[str, Any]], codec: Codec) -> list[str]:
    """Records in Avro's JSON encoding, one line each (for Java's JSON decoder)."""
    out = io.StringIO()
    fastavro.json_writer(out, codec.schema, list(records))
    return out.getvalue().splitlines()


def read_topic(bootstrap: str, topic: str, within_s: float = 30.0) -> list[tuple[str, bytes]]:
    """(key, value) of every record of ``topic`` up to its end now, read with a bare
    confluent-kafka consumer, partition by partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "avro-interop",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        out: list[tuple[str, bytes]] = []
        deadline = time.monotonic() + within_s
        for partition in partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(topic, partition, low)])
            position = low
            while position < high:
                assert time.monotonic() < deadline, f"{topic}[{partition}] not read in {within_s}s"
                message = consumer.poll(0.5)
                if message is None:
                    continue
                assert message.error() is None, message.error()
                key, value = message.key(), message.value()
                assert key is not None and value is not None
                out.append((key.decode("utf-8"), value))
                position = message.offset() + 1
        return out
    finally:
        consumer.close()


def legacy(event: EffectEvent) -> bytes:
    """``event`` as earlier effectlog versions wrote it: the fingerprint byte-reversed."""
    data = event_codec().encode(event.to_record())
    return data[:2] + data[2:10][::-1] + data[10:]


def write_histories(log: EventLog, groups: Sequence[Sequence[EffectEvent]],
                    encoded: dict[str, bytes] | None = None) -> None:
    """Append each history (one key) in one batch: effectlog's bytes, or ``encoded`` by event id."""
    for events in groups:
        log.append_many(EVENTS, [(e.idempotency_key, encoded[e.event_id] if encoded
                                  else event_codec().encode(e.to_record())) for e in events])


# -- Java alone ----------------------------------------------------------------------------

def test_java_fingerprints_equal_effectlogs_and_the_spec_vector() -> None:
    null, event, command = interop.fingerprints('"null"', EVENT_AVSC, COMMAND_AVSC)
    assert null == bytes.fromhex("8a8f25cce724dd63") == schema_fingerprint("null")
    assert event == event_codec().fingerprint and command == command_codec().fingerprint


def test_java_refuses_the_legacy_byte_order_effectlog_still_reads() -> None:
    event = histories("legacy")[0][0]
    data = event_codec().encode(event.to_record())
    spec, old = interop.decode([data, legacy(event)], EVENT_AVSC)
    assert spec["reencoded"] == data
    assert "MissingSchemaException" in old["error"]
    assert event_codec().decode(legacy(event)) == event_codec().decode(data)


def test_java_resolves_a_v1_record_to_the_current_schema() -> None:
    v1 = Codec(json.loads(V1_AVSC.read_text()))
    event = histories("v1")[0][3]
    record = {k: v for k, v in event.to_record().items()
              if k not in ("event_id", "payload_ref", "approval")}
    [decoded] = interop.decode([v1.encode(record)], EVENT_AVSC, [V1_AVSC])
    [java] = from_avro_json([decoded["record"]], event_codec())
    assert java["event_id"] == "" and java["approval"] is None and java["payload_ref"] is None
    assert java["outcome"]["source"] == "worker" and java["state"] == "SUCCEEDED"
    assert decoded["reencoded"][2:10] == event_codec().fingerprint  # re-encoded as v2


def test_javas_data_file_reader_reads_a_replay_archive(tmp_path: Path) -> None:
    """Of a log with legacy-order records and an undecodable one (exit 3: a violation)."""
    url = f"sqlite:///{tmp_path}/log.db"
    log = open_log(url)
    groups = histories("replay")
    write_histories(log, groups[:1], {e.event_id: legacy(e) for e in groups[0]})
    write_histories(log, groups[1:])
    log.append(EVENTS, "agent:x:k:t", b"\xc3\x01not avro")
    log.close()
    archive = tmp_path / "audit.avro"
    result = CliRunner().invoke(cli, ["--log", url, "--state", str(tmp_path / "state"), "replay",
                                      "--format", "avro", "--out", str(archive)])
    assert result.exit_code == 3 and "violations: 1 (undecodable 1)" in result.output
    with archive.open("rb") as handle:
        reader = fastavro.reader(handle)
        schema, ours = reader.writer_schema, list(reader)
    java = interop.container(archive)
    assert len(java) == len(ours) == sum(map(len, groups)) + 1
    text = "".join(json.dumps(r) + "\n" for r in java)
    assert list(fastavro.json_reader(io.StringIO(text), schema)) == ours  # type: ignore[arg-type]
    assert java[-1]["raw"] == {"bytes": "\u00c3\u0001not avro"}


# -- Java and Kafka ------------------------------------------------------------------------

@pytest.mark.kafka
def test_java_decodes_every_record_effectlog_wrote_to_the_topic(kafka_url: str,
                                                                kafka_bootstrap: str) -> None:
    groups = histories("topic")
    events = {e.event_id: e for history in groups for e in history}
    command = ReconciliationCommand.for_event(groups[1][3], 1, "UNKNOWN for 10m")
    with open_log(kafka_url) as log:
        write_histories(log, groups)
        scribe(log, "w9").perform("topic-w", KIND, "mailto:w@example.com", {"n": 1},
                                  lambda call: {"sent": True})
        log.append(COMMANDS, command.idempotency_key, command.encode())
    settings = KafkaSettings.from_url(kafka_url)
    values = [v for _, v in read_topic(kafka_bootstrap, settings.topic(EVENTS))]
    assert len(values) == len(events) + 4  # the worker's CREATE, RESERVE, DISPATCH, RECORD

    decoded = interop.decode(values, EVENT_AVSC)
    assert [d.get("error") for d in decoded] == [None] * len(values)
    assert [d["reencoded"] for d in decoded] == values  # Java writes the very same bytes
    java = from_avro_json([d["record"] for d in decoded], event_codec())
    assert java == [event_codec().decode(v) for v in values]  # every field
    java_events = [EffectEvent.from_record(r) for r in java]
    assert {e.event_id: e for e in java_events if e.event_id in events} == events
    assert [e.state for e in java_events if e.operation_id == "topic-w"][-1] is State.SUCCEEDED

    [(key, raw)] = read_topic(kafka_bootstrap, settings.topic(COMMANDS))
    [java_command] = interop.decode([raw], COMMAND_AVSC)
    assert java_command["reencoded"] == raw and key == command.idempotency_key
    assert from_avro_json([java_command["record"]], command_codec()) == [command_codec().decode(raw)]
    assert java_command["record"]["command_id"] == command.command_id


@pytest.mark.kafka
def test_effectlog_decodes_and_projects_what_javas_encoder_wrote(kafka_url: str,
                                                                 tmp_path: Path) -> None:
    groups = histories("java")
    events = [e for history in groups for e in history]
    written = interop.encode(to_avro_json([e.to_record() for e in events], event_codec()),
                             EVENT_AVSC)
    assert [EffectEvent.from_record(event_codec().decode(b)) for b in written] == events
    assert not any(event_codec().is_legacy(b) for b in written)

    with open_log(kafka_url) as log:
        write_histories(log, groups, {e.event_id: b for e, b in zip(events, written, strict=True)})
        project(log, tmp_path / "state")
    with open_reader(tmp_path / "state") as reader:
        counts = reader.counts()
        assert [reader.get(h[-1].idempotency_key) for h in groups] == [h[-1] for h in groups]
    assert counts["state:SUCCEEDED"] == 1 and counts["state:FAILED"] == 1
    assert not [label for label in counts if label.startswith(("rejected:", "legacy:"))]

    commands = [ReconciliationCommand.for_event(groups[1][3], 1, "UNKNOWN for 10m"),
                ReconciliationCommand.for_event(groups[0][2], 3, "DISPATCHED für 5m ✓")]
    lines = to_avro_json([asdict(c) for c in commands], command_codec())
    assert [ReconciliationCommand.decode(b) for b in interop.encode(lines, COMMAND_AVSC)] == commands


@pytest.mark.kafka
def test_kafkas_console_consumer_prints_the_topics_keys(kafka_url: str, kafka_bootstrap: str) -> None:
    from tools.kafka.broker import run_java

    groups = histories("console")
    with open_log(kafka_url) as log:
        write_histories(log, groups)
    count = sum(map(len, groups))
    done = run_java(CONSOLE_CONSUMER, "--bootstrap-server", kafka_bootstrap,
                    "--topic", KafkaSettings.from_url(kafka_url).topic(EVENTS), "--from-beginning",
                    "--max-messages", str(count), "--timeout-ms", "30000",
                    "--property", "print.key=true", "--property", "print.value=false")
    assert done.returncode == 0, done.stderr
    keys = done.stdout.splitlines()
    assert sorted(keys) == sorted(e.idempotency_key for history in groups for e in history)
    assert f"Processed a total of {count} messages" in done.stderr
