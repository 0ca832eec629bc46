"""The docs' Kafka examples (``<!-- test: kafka -->``) run alone against a real broker and a
``serve`` instance, named to them by EFFECTLOG_LOG and EFFECTLOG_SERVER as the pages say."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from consumers.providers.fake import FakeProvider
from tests.cluster_support import Serve, wait_until
from tests.doc_snippets import Block, python_blocks, run_python

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]

KAFKA = python_blocks("kafka")


@pytest.fixture
def serve(kafka_url: str, tmp_path: Path) -> Iterator[Serve]:
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    # Recovery waits longer than the workers' accept timeout (10 s): docs/agents/worker.md.
    node = Serve(tmp_path, "s0", kafka_url, provider, None, "--stuck-after", "15s")
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "one member serves all partitions")
        yield node
    finally:
        node.stop()


def test_the_kafka_pages_have_examples() -> None:
    assert {b.path.name for b in KAFKA} >= {"kafka.md", "workers.md"}


@pytest.mark.parametrize("block", KAFKA, ids=[b.name for b in KAFKA])
def test_kafka_example_prints_what_it_says(block: Block, kafka_url: str, serve: Serve,
                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECTLOG_LOG", kafka_url)
    monkeypatch.setenv("EFFECTLOG_SERVER", serve.url)
    where = tmp_path / "run"
    where.mkdir()
    assert run_python(block, where) == block.expected
