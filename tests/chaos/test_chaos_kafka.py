"""The chaos run in ``make test``: about a minute (``CHAOS_S``), on the session's broker."""

from __future__ import annotations

import os

import pytest

from tests.chaos.driver import chaos

pytestmark = [pytest.mark.kafka, pytest.mark.crash, pytest.mark.timeout(600)]


def test_no_key_is_called_twice_through_kills_rebalances_and_rebuilds(kafka_bootstrap: str) -> None:
    report = chaos(kafka_bootstrap, float(os.environ.get("CHAOS_S", "60")))
    print(report.last_line())
    assert report.duplicates == {}, report.last_line()
    assert report.unjudged == [], report.last_line()
    # the run did what it is for: effects performed and replayed, every kind of trouble met
    assert report.calls > 20 and report.performs["replayed"] > 0, report.last_line()
    assert report.kills >= 2 and report.rebuilds >= 1 and report.rebalances >= 4, \
        report.last_line()
