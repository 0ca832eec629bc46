"""AsyncWorker and @effectlog.effect on Apache Kafka (no compare-and-append: every write is
read back through the projection cluster's query API, here off the event loop)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectlog
from consumers.providers.fake import FakeProvider
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.model import State
from effectlog.worker import AsyncEffectCall, AsyncWorker, EffectInDoubt
from tests.cluster_support import Serve, wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture
def log(kafka_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[EventLog]:
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    # Recovery waits longer than the workers' accept timeout (10 s): docs/agents/worker.md.
    node = Serve(tmp_path, "s0", kafka_url, provider, None, "--stuck-after", "15s")
    log = open_log(kafka_url)
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve owns every partition")
        monkeypatch.setenv("EFFECTLOG_SERVER", node.url)  # where workers read state
        yield log
    finally:
        log.close()
        node.stop()


def test_concurrent_effects_replays_and_doubt_on_kafka(log: EventLog) -> None:
    calls: list[str] = []

    async def send(call: AsyncEffectCall) -> dict[str, Any]:
        calls.append(call.key)
        return {"epoch": call.fencing_epoch}

    @effectlog.effect("email.send", target=lambda to, **_: f"mailto:{to}")
    async def notify(to: str) -> str:
        calls.append(effectlog.current_call().key)
        return "sent"

    async def main() -> None:
        async with AsyncWorker(log, "k1") as worker, AsyncWorker(log, "k2") as other:
            first = await asyncio.gather(*(
                worker.perform(f"op-{i}", "email.send", f"mailto:u{i}@example.com", {"i": i}, send)
                for i in range(20)))
            again = await other.perform("op-3", "email.send", "mailto:u3@example.com", {"i": 3},
                                        send)
            assert first == [{"epoch": 1}] * 20 and again == {"epoch": 1}
            created = await worker.create("op-x", "email.send", "mailto:x@example.com", {})
            await worker.reserve(created.idempotency_key)
            await worker.dispatch(created.idempotency_key)
            with pytest.raises(EffectInDoubt):
                await other.perform("op-x", "email.send", "mailto:x@example.com", {}, send)
            async with effectlog.run("job-1", worker=worker):
                assert await notify("ann@example.com") == "sent"
            async with effectlog.run("job-1", worker=other):
                assert await notify("ann@example.com") == "sent"
            current = await other.get("agent:job-1.1:email.send:mailto:ann@example.com")
            assert current is not None and current.state is State.SUCCEEDED

    asyncio.run(asyncio.wait_for(main(), 120))
    assert len(calls) == 21  # 20 performs and one notify: nothing ran twice
    assert len(log.read_key(EVENTS, "agent:op-3:email.send:mailto:u3@example.com")) == 4
