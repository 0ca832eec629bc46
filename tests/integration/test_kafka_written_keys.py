"""A Kafka log tells a range of its own records from its delivery reports, with no read.

Records of another writer in the range (another process) are left to the key tail, which
starts only then; a record of the asked key by anyone else is never answered True.
"""

from __future__ import annotations

from effectlog.log import EVENTS
from effectlog.log.kafka import KafkaLog
from tests.log_contract import eventually, neighbour


def test_its_own_records_are_told_at_once(kafka_log: KafkaLog) -> None:
    key = "agent:own:k:t"
    other = neighbour(kafka_log, key)
    first = kafka_log.append(EVENTS, other, b"a").offset
    rest = kafka_log.append_ordered(EVENTS, [(other, b"b"), (key, b"mine")])
    end = rest[-1].offset + 1
    # the first call ever: a key tail would start now and could not tell yet
    assert kafka_log.untouched(EVENTS, key, first, end, {rest[-1].offset})
    assert not kafka_log.untouched(EVENTS, key, first, end)  # the key's record is not "own"


def test_another_writers_record_of_the_key_is_never_missed(kafka_log: KafkaLog,
                                                           writer: KafkaLog) -> None:
    key = "agent:raced:k:t"
    other = neighbour(kafka_log, key)
    kafka_log.untouched(EVENTS, key, 0, 1)  # starts the tail
    before = kafka_log.append(EVENTS, other, b"before").offset
    writer.append(EVENTS, key, b"theirs")
    after = kafka_log.append(EVENTS, other, b"after").offset
    assert kafka_log.untouched(EVENTS, key, after, after + 1)
    for _ in range(20):  # neither the ledger nor the tail, once it has read the range
        assert not kafka_log.untouched(EVENTS, key, before, after + 1)


def test_another_writers_record_of_another_key_is_told_by_the_tail(kafka_log: KafkaLog,
                                                                   writer: KafkaLog) -> None:
    key = "agent:mixed:k:t"
    other = neighbour(kafka_log, key)
    before = kafka_log.append(EVENTS, other, b"before").offset
    assert not kafka_log.untouched(EVENTS, key, before - 1, before + 1)  # starts the tail
    start = kafka_log.append(EVENTS, other, b"mine").offset
    writer.append(EVENTS, other, b"theirs")
    end = kafka_log.append(EVENTS, other, b"mine again").offset + 1
    assert eventually(lambda: kafka_log.untouched(EVENTS, key, start, end))
