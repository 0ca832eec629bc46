"""Kafka's key tail (``effectlog.log.kafka.tail``) errs only towards "cannot tell".

It knows nothing written before it started, nothing it has not read yet, and nothing across
a gap in the offsets it read (here a transaction's commit marker); a worker then asks the
query API instead, so none of these may ever answer True. The records here come from another
writer (another process's log): a log's own records are told from its delivery reports
(``tests/integration/test_kafka_written_keys.py``).
"""

from __future__ import annotations

import threading
import time

from effectlog.log import EVENTS
from effectlog.log.kafka import KafkaLog
from tests.log_contract import eventually, neighbour


def test_the_tail_cannot_tell_of_records_before_it_started(kafka_log: KafkaLog,
                                                          writer: KafkaLog) -> None:
    key = "agent:early:k:t"
    early = writer.append(EVENTS, neighbour(writer, key), b"before the tail").offset
    assert not kafka_log.untouched(EVENTS, key, early, early + 1)  # starts the tail
    later = writer.append(EVENTS, neighbour(writer, key), b"after").offset
    assert eventually(lambda: kafka_log.untouched(EVENTS, key, later, later + 1))
    assert not kafka_log.untouched(EVENTS, key, early, later + 1)  # still before its start


def test_the_tail_cannot_tell_of_what_it_has_not_read(kafka_log: KafkaLog,
                                                      writer: KafkaLog) -> None:
    key = "agent:ahead:k:t"
    kafka_log.untouched(EVENTS, key, 0, 1)  # starts the tail
    at = writer.append(EVENTS, neighbour(writer, key), b"x").offset
    assert eventually(lambda: kafka_log.untouched(EVENTS, key, at, at + 1))
    started = time.monotonic()
    assert not kafka_log.untouched(EVENTS, key, at, at + 5)  # offsets not written yet
    assert time.monotonic() - started < 5  # it gave up after its short wait, not the timeout


def test_a_gap_in_the_offsets_is_forgotten_across(kafka_log: KafkaLog,
                                                  writer: KafkaLog) -> None:
    key = "agent:gap:k:t"
    other = neighbour(writer, key)
    kafka_log.untouched(EVENTS, key, 0, 1)  # starts the tail
    before = writer.append(EVENTS, other, b"before").offset
    # two records of one key are one transaction: its commit marker takes an offset that no
    # reader is ever handed
    atomic = writer.append_many(EVENTS, [(other, b"t1"), (other, b"t2")])
    after = writer.append(EVENTS, other, b"after").offset
    assert after == atomic[-1].offset + 2  # the marker sits in between
    assert eventually(lambda: kafka_log.untouched(EVENTS, key, after, after + 1))
    assert not kafka_log.untouched(EVENTS, key, before, after + 1)
    assert not kafka_log.untouched(EVENTS, key, atomic[0].offset, after + 1)


def test_askers_waiting_for_different_offsets_are_each_answered_when_theirs_is_read(
        kafka_log: KafkaLog, writer: KafkaLog) -> None:
    """Each asker waits for its own offset (woken when the tail reads it, not at every batch);
    one that gave up before its offset came leaves nothing behind that would answer wrong."""
    key = "agent:waiters:k:t"
    other = neighbour(writer, key)
    kafka_log.untouched(EVENTS, key, 0, 1)  # starts the tail
    at = writer.append(EVENTS, other, b"first").offset
    assert eventually(lambda: kafka_log.untouched(EVENTS, key, at, at + 1))
    assert not kafka_log.untouched(EVENTS, key, at, at + 4)  # gives up: not written yet
    answers: dict[int, bool] = {}

    def ask(ahead: int) -> None:
        answers[ahead] = kafka_log.untouched(EVENTS, key, at, at + 1 + ahead)

    askers = [threading.Thread(target=ask, args=(ahead,)) for ahead in (1, 2, 3)]
    for asker in askers:
        asker.start()
    for value in (b"second", b"third", b"fourth"):
        writer.append(EVENTS, other, value)
    for asker in askers:
        asker.join(10)
    # each saw only the neighbour's records in its range (or, slower than the short wait,
    # could not tell); afterwards every range is told
    assert set(answers) == {1, 2, 3}
    assert eventually(lambda: all(kafka_log.untouched(EVENTS, key, at, at + 1 + ahead)
                                  for ahead in (1, 2, 3)))
    mine = writer.append(EVENTS, key, b"of the key").offset
    assert eventually(lambda: kafka_log.untouched(EVENTS, key, mine, mine + 1, {mine}))
    assert not kafka_log.untouched(EVENTS, key, at, mine + 1)  # the key's own record is seen
