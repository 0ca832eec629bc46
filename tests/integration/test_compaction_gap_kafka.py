"""A member restoring past a stretch that compaction thinned halts the partition there.

The owner publishes and stops; more histories are written; they grow older than the events
topic's ``min.compaction.lag.ms`` (10 s, the least serve accepts) and the cleaner removes the
superseded ones, after the last checkpoint too. A new member restores from that checkpoint: the
records after it are no longer all there, so it halts the partitions where it meets a gap
(``/healthz`` and ``/readyz`` say why, and a lookup there is refused, never answered from a
state that lacks accepted events), as ``project`` exits 3. With ``--accept-compaction-gaps``
both go on.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from effectlog.log import EVENTS
from effectlog.log.kafka import KafkaSettings, create_topics
from tests.cluster_support import Serve, answer, wait_until
from tests.integration.test_kafka_restore import (
    PARTITIONS,
    compact,
    published_everything,
    serving,
)
from tests.restore_support import opened, write_histories

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
LAG_MS = 10_000


def test_a_restore_past_a_compacted_stretch_halts_there_unless_told_to_go_on(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    url = (f"kafka://{kafka_bootstrap}?prefix=gap{uuid.uuid4().hex[:10]}"
           f"&partitions={PARTITIONS}&min_compaction_lag_ms={LAG_MS}")
    create_topics(KafkaSettings.from_url(url))
    with opened(url) as log:
        write_histories(log, per_reason=2, tag="g1-")
    owner = Serve(tmp_path, "owner", url, None)
    try:
        wait_until(lambda: len(serving(owner)) == PARTITIONS, 90, "the owner serves")
        wait_until(lambda: published_everything(url), 30, "the owner published")
    finally:
        owner.stop()
    with opened(url) as log:
        tail = write_histories(log, per_reason=2, tag="g2-")  # never published
        partition_of = {key: log.partition_for(EVENTS, key) for key in tail}
    time.sleep(LAG_MS / 2000 + 1)  # older than the lag less its margin (half of it)
    compact(url)
    project = [sys.executable, "-m", "effectlog.cli.main", "--log", url, "--state",
               str(tmp_path / "offline"), "project", "--once", "--quiet"]
    refused = subprocess.run(project, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 3, refused.stderr
    assert "compaction may have removed accepted events" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    forced = subprocess.run([*project, "--accept-compaction-gaps"], capture_output=True,
                            text=True, timeout=120)
    assert forced.returncode == 0 and "--accept-compaction-gaps" in forced.stderr, forced.stderr
    halting = Serve(tmp_path, "halting", url, None)
    try:
        def halted() -> dict[str, str]:
            health = halting.health() or {}
            return health.get("halted", {}) if len(health.get("partitions", {})) == \
                PARTITIONS else {}
        wait_until(lambda: bool(halted()) and len(halted()) + len(serving(halting)) ==
                   PARTITIONS, 90, "the new member halted a partition")
        reasons = halted()
        assert all("compaction may have removed accepted events" in why
                   for why in reasons.values()), reasons
        status, ready = halting.ready()
        assert status == 503 and "halted" in (ready or {}).get("why", ""), ready
        key = next(k for k, p in partition_of.items() if str(p) in reasons)
        status, body = answer(f"{halting.url}/v1/effects/{key}")
        assert status == 503 and "halted" in str(body), (status, body)
    finally:
        halting.stop()
    accepting = Serve(tmp_path, "accepting", url, None, None, "--accept-compaction-gaps")
    try:
        wait_until(lambda: len(serving(accepting)) == PARTITIONS, 90,
                   "with --accept-compaction-gaps it serves every partition")
        status, _ = answer(f"{accepting.url}/v1/effects/{key}")
        assert status in (200, 404)
        assert "--accept-compaction-gaps" in accepting.stop()
    finally:
        accepting.stop()
