"""The Kafka event log against a real Kafka-protocol broker (see tests/kafka_broker.py)."""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from effectlog.errors import BackendUnavailable, Conflict, InvalidInput
from effectlog.log import COMMANDS, EVENTS, EventLog, Position, open_log
from effectlog.log.base import STATE
from effectlog.log.kafka import KafkaLog, KafkaSettings, create_topics, murmur2, murmur2_partition
from effectlog.redact import redact_url
from tests.kafka_broker import private_broker
from tests.log_contract import LogContract

UNREACHABLE = "kafka://127.0.0.1:1?timeout_s=2"


@pytest.mark.kafka
class TestKafkaLog(LogContract):
    @pytest.fixture
    def log(self, kafka_log: KafkaLog) -> EventLog:
        return kafka_log


# ---- partitioning: no broker needed --------------------------------------------------------

# Kafka's own murmur2 test vectors (UtilsTest) and the ones Akka's Murmur2Spec checks against.
JAVA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
}


@pytest.mark.parametrize(("text", "expected"), sorted(JAVA_MURMUR2.items()))
def test_murmur2_matches_the_java_client(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


def test_partition_matches_librdkafka_murmur2_for_random_keys() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        key = rng.randbytes(rng.randrange(0, 64))
        partitions = rng.randrange(1, 50)
        assert murmur2_partition(key, partitions) == confluent_kafka.murmur2(key, partitions)


def test_open_log_needs_no_broker_and_computes_partitions() -> None:
    started = time.monotonic()
    log = open_log("kafka://127.0.0.1:1?prefix=p&partitions=12")
    assert isinstance(log, KafkaLog)
    assert log.partitions(EVENTS) == 12
    assert log.partition_for(EVENTS, "agent:x:k:t") == murmur2_partition(b"agent:x:k:t", 12)
    log.close()
    assert time.monotonic() - started < 0.5


# ---- URL and settings ------------------------------------------------------------------------


def test_url_parameters_become_typed_settings(tmp_path: Path) -> None:
    props = tmp_path / "client.properties"
    props.write_text("# comment\nssl.endpoint.identification.algorithm = none\n"
                     "sasl.oauthbearer.client.secret=s3cr3t-file\n")
    settings = KafkaSettings.from_url(
        f"kafka+sasl://u:pw-s3cret@a:9092,b:9092?prefix=prod&partitions=12&replication=3&timeout_s=2.5"
        f"&sasl_mechanism=PLAIN&config={props}")
    assert settings.bootstrap == "a:9092,b:9092"
    assert (settings.prefix, settings.partitions, settings.replication) == ("prod", 12, 3)
    assert settings.timeout_s == 2.5 and settings.security_protocol == "SASL_SSL"
    assert settings.topic(EVENTS) == "prod.events" and settings.topic(COMMANDS) == "prod.commands"
    config = settings.client_config()
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    assert config["sasl.mechanism"] == "PLAIN"
    assert "s3cr3t-file" not in repr(settings) and "pw-s3cret" not in repr(settings)


@pytest.mark.parametrize("url", ["kafka://h:1?partitions=x", "kafka://h:1?bogus=1",
                                 "kafka://?prefix=a", "kafka://h:1?prefix=a/b",
                                 "kafka://h:1?config=/nonexistent/file.properties"])
def test_bad_urls_are_invalid_input(url: str) -> None:
    with pytest.raises(InvalidInput):
        KafkaSettings.from_url(url)


def test_secrets_never_show_in_repr_url_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    url = ("kafka://alice:pw-in-userinfo@127.0.0.1:1?timeout_s=1&security_protocol=SASL_PLAINTEXT"
           "&sasl_mechanism=PLAIN&sasl_username=bob&sasl_password=pw-in-query")
    caplog.set_level(logging.DEBUG)
    log = KafkaLog.from_url(url)
    assert log.settings.sasl_password == "pw-in-query"
    with pytest.raises(BackendUnavailable) as raised:
        log.append(EVENTS, "agent:s:k:t", b"x")
    log.close()
    shown = [repr(log), log.url, repr(log.settings), str(raised.value), caplog.text,
             redact_url(url)]
    for text in shown:
        assert "pw-in-query" not in text and "pw-in-userinfo" not in text
    assert "***" in log.url


# ---- an unreachable broker ------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["append", "append_many", "read", "end_offsets"])
def test_unreachable_broker_fails_within_the_timeout(operation: str) -> None:
    log = KafkaLog.from_url(UNREACHABLE)
    calls: dict[str, Callable[[], object]] = {
        "append": lambda: log.append(EVENTS, "agent:u:k:t", b"x"),
        "append_many": lambda: log.append_many(EVENTS, [("agent:u:k:t", b"x")] * 3),
        "read": lambda: log.read(EVENTS, 0, 0, 10, timeout=1),
        "end_offsets": lambda: log.end_offsets(EVENTS),
    }
    started = time.monotonic()
    with pytest.raises(BackendUnavailable, match=r"kafka broker 127\.0\.0\.1:1 unreachable"):
        calls[operation]()
    assert time.monotonic() - started < 2 + 2
    log.close()


# ---- against a broker -----------------------------------------------------------------------


@pytest.mark.kafka
def test_murmur2_matches_where_the_broker_put_records(kafka_log: KafkaLog) -> None:
    keys = [f"agent:{uuid.uuid4()}:email.send:to-{i}" for i in range(150)]
    positions = kafka_log.append_many(EVENTS, [(k, b"x") for k in keys])
    for key, position in zip(keys, positions, strict=True):
        assert position.partition == kafka_log.partition_for(EVENTS, key)
    sample = positions[0]
    stored = kafka_log.read(EVENTS, sample.partition, sample.offset, 1, timeout=5)
    assert stored[0].key == keys[0]
    assert len({p.partition for p in positions}) == kafka_log.partitions(EVENTS)


@pytest.mark.kafka
def test_a_read_at_the_end_waits_for_the_next_record(kafka_log: KafkaLog) -> None:
    key = "agent:tail:k:t"
    first = kafka_log.append(EVENTS, key, b"0")
    assert [r.value for r in kafka_log.read(EVENTS, first.partition, first.offset, 10)] == [b"0"]
    timer = threading.Timer(0.5, kafka_log.append, (EVENTS, key, b"1"))
    timer.start()
    started = time.monotonic()
    records = kafka_log.read(EVENTS, first.partition, first.offset + 1, 10, timeout=5)
    timer.join()
    assert [r.value for r in records] == [b"1"] and time.monotonic() - started < 3
    assert kafka_log.read(EVENTS, first.partition, first.offset + 2, 10, timeout=0) == []


@pytest.mark.kafka
def test_missing_topics_are_reported_with_the_command_that_creates_them(
        kafka_bootstrap: str) -> None:
    log = KafkaLog.from_url(f"kafka://{kafka_bootstrap}?prefix=missing{uuid.uuid4().hex[:8]}")
    with pytest.raises(BackendUnavailable, match="effectlog topics create"):
        log.append(EVENTS, "agent:m:k:t", b"x")
    with pytest.raises(BackendUnavailable, match="effectlog topics create"):
        log.end_offsets(EVENTS)
    log.close()


@pytest.mark.kafka
def test_a_partition_count_other_than_the_topics_is_a_conflict(kafka_url: str) -> None:
    log = KafkaLog.from_url(kafka_url + "&partitions=2")
    with pytest.raises(Conflict, match="partitions"):
        log.append(EVENTS, "agent:p:k:t", b"x")
    log.close()


@pytest.mark.kafka
def test_create_topics_is_idempotent(kafka_bootstrap: str) -> None:
    settings = KafkaSettings.from_url(f"kafka://{kafka_bootstrap}?prefix=i{uuid.uuid4().hex[:8]}")
    first = create_topics(settings)
    assert [line.split()[0] for line in first] == ["created", "created", "created"]
    again = create_topics(settings)
    assert again == [f"exists {settings.topic(t)} (6 partitions, config ok)"
                     for t in (EVENTS, COMMANDS, STATE)]


@pytest.mark.kafka
def test_create_topics_refuses_a_contradicting_events_topic(kafka_bootstrap: str) -> None:
    settings = KafkaSettings.from_url(f"kafka://{kafka_bootstrap}?prefix=c{uuid.uuid4().hex[:8]}")
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    plain = NewTopic(settings.topic(EVENTS), num_partitions=6, replication_factor=1,
                     config={"cleanup.policy": "delete", "retention.ms": "3600000"})
    admin.create_topics([plain])[settings.topic(EVENTS)].result(timeout=10)
    with pytest.raises(Conflict, match="not compacted") as raised:
        create_topics(settings)
    assert "\n" not in str(raised.value) and raised.value.exit_code == 3
    stricter = KafkaSettings.from_url(
        f"kafka://{kafka_bootstrap}?prefix={settings.prefix}&partitions=3")
    with pytest.raises(Conflict, match="has 6 partitions, settings say 3"):
        create_topics(stricter)


@pytest.mark.kafka
def test_create_topics_refuses_a_shorter_compaction_lag(kafka_bootstrap: str) -> None:
    prefix = f"l{uuid.uuid4().hex[:8]}"
    create_topics(KafkaSettings.from_url(
        f"kafka://{kafka_bootstrap}?prefix={prefix}&min_compaction_lag_ms=1000"))
    with pytest.raises(Conflict, match=r"min\.compaction\.lag\.ms=1000 is below"):
        create_topics(KafkaSettings.from_url(f"kafka://{kafka_bootstrap}?prefix={prefix}"))


@pytest.mark.kafka
def test_concurrent_appends_lose_nothing_and_keep_per_key_order(kafka_log: KafkaLog) -> None:
    threads, per_thread = 4, 500
    results: dict[int, list[tuple[str, bytes, Position]]] = {}
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            mine = []
            for i in range(per_thread):
                key, value = f"agent:t{n}-{i % 5}:k:t", f"{n}:{i}".encode()
                mine.append((key, value, kafka_log.append(EVENTS, key, value)))
            results[n] = mine
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
    assert not errors
    appended = [item for n in range(threads) for item in results[n]]
    assert len({item[2] for item in appended}) == threads * per_thread
    assert sum(kafka_log.end_offsets(EVENTS).values()) == threads * per_thread
    for key in ("agent:t0-0:k:t", "agent:t3-4:k:t"):
        expected = [value for k, value, _ in appended if k == key]
        assert [r.value for r in kafka_log.read_key(EVENTS, key)] == expected


@pytest.mark.kafka
def test_a_broker_killed_mid_append_never_reports_success_and_the_log_recovers() -> None:
    with private_broker() as broker:
        url = f"kafka://{broker.bootstrap}?prefix=k&timeout_s=2"
        create_topics(KafkaSettings.from_url(url))
        log = KafkaLog.from_url(url)
        try:
            assert log.append(EVENTS, "agent:k:k:t", b"before").offset == 0
            broker.kill()
            started = time.monotonic()
            with pytest.raises(BackendUnavailable, match=r"not delivered|no delivery report"):
                log.append(EVENTS, "agent:k:k:t", b"after")
            with pytest.raises(BackendUnavailable):
                log.append_many(EVENTS, [("agent:k:k:t", b"after-%d" % i) for i in range(50)])
            assert time.monotonic() - started < 2 * (2 + 2 + 5)
            with pytest.raises(BackendUnavailable):
                log.read(EVENTS, 0, 0, 10, timeout=0.5)
            # Back on the same port with its data: the log recovers with a fresh producer,
            # and nothing that was acknowledged is lost.
            broker.restart()
            position = log.append(EVENTS, "agent:k:k:t", b"again")
            values = [r.value for r in log.read_key(EVENTS, "agent:k:k:t")]
            assert values[0] == b"before" and values[-1] == b"again"
            assert position.offset == len(values) - 1
        finally:
            log.close()
