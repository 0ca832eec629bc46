"""Shared fixtures. Each owner keeps its fixtures in its own delimited section."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

# ---- Kafka broker fixtures (tests/kafka_broker.py) ---------------------------------------


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of a Kafka-protocol broker shared by the whole session."""
    from tests.kafka_broker import kafka_bootstrap as start_broker

    with start_broker() as bootstrap:
        yield bootstrap


@pytest.fixture
def kafka_url(kafka_bootstrap: str) -> str:
    """A ``kafka://`` URL with a prefix of its own, its topics created, so tests share no data."""
    from effectlog.log.kafka import KafkaSettings, create_topics

    url = f"kafka://{kafka_bootstrap}?prefix=t{uuid.uuid4().hex[:12]}"
    create_topics(KafkaSettings.from_url(url))
    return url


# ---- end of Kafka broker fixtures -------------------------------------------------------
