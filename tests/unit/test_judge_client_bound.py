"""A worker's question to the judge ends by its deadline even when a member holds it.

A member whose event loop or broker is stuck may accept a request and answer nothing. The
client's deadline (``wait_s + retry_for_s``) must bound the whole question, not each
request: before, a held request was read for ``timeout_s + wait_s`` and asked again, so a
worker with a 3 s log timeout took 43 s to report the broker unavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.node.gate import PartitionGate
from consumers.node.judging import PartitionJudge, Unanswered
from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable
from effectlog.judge import Query, worker_fingerprint
from effectlog.judge.client import GRACE_S, ClusterJudge
from effectlog.judge.premises import known_fingerprints
from effectlog.log.memory import MemoryLog
from projections.rocksdb.store import RocksProjectionStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def holding_server() -> Iterator[tuple[str, list[float]]]:
    """An HTTP port on 127.0.0.1 that accepts connections, reads requests and never
    answers; yields its URL and the times requests arrived."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    arrived: list[float] = []
    held: list[socket.socket] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                conn.recv(65536)
            arrived.append(time.monotonic())
            held.append(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", arrived
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


def test_a_member_that_holds_the_question_does_not_outlast_the_deadline(
        holding_server: tuple[str, list[float]]) -> None:
    url, arrived = holding_server
    judge = ClusterJudge(url, timeout_s=30.0, wait_s=0.5, retry_for_s=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(BackendUnavailable, match="answered no question"):
            judge.ask([Query("agent:op:email.send:mailto:a@example.com")])
    finally:
        judge.close()
    took = time.monotonic() - started
    assert arrived, "the question never reached the member"
    # wait_s + retry_for_s, the grace for the last read, and room for a loaded machine;
    # reading each request for timeout_s + wait_s (the old bound) takes over 30 s
    assert took < 1.0 + GRACE_S + 5.0, took


def test_a_fresh_question_whose_end_offsets_hang_is_unanswered_within_its_timeout(
        tmp_path: Path) -> None:
    """serve's side: reading the log's end for a fresh question counts against the question's
    timeout (a paused broker held it for the log's own timeout, or longer when every thread
    of the event loop's executor was waiting on the broker too)."""
    store = RocksProjectionStore(tmp_path / "state")
    gate = PartitionGate()
    released = threading.Event()

    def hanging_ends() -> dict[int, int]:
        released.wait(10)
        return {0: 0}

    log = MemoryLog()
    judge = PartitionJudge(gate, store.reader(lambda key: 0, gate.serving), "test:",
                           log.identity(), known_fingerprints(event_codec().writer_fingerprints),
                           hanging_ends)
    writer = store.open_writer(0, partitions=1)
    gate.assigned(0, writer.next_offset, 0)
    gate.applied(0, 0)

    async def ask() -> tuple[object, float]:
        started = time.monotonic()
        found = await judge.answer(Query("agent:op:email.send:mailto:a@example.com",
                                         fresh=True), worker_fingerprint(), 0.3)
        took = time.monotonic() - started
        released.set()  # asyncio.run waits for the executor's thread at the end
        return found, took

    try:
        found, took = asyncio.run(ask())
    finally:
        released.set()
        store.close()
    assert isinstance(found, Unanswered) and "end offsets" in found.reason, found
    assert took < 5.0, took  # not the 10 s the end offsets took
