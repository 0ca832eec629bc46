"""State that survives compaction: a projection restored from the changelog equals a full
replay, even where every key's latest record is one the projector rejected.

Real compaction on Apache Kafka (small segments, an eager cleaner, sealed partitions) over
histories whose latest records are rejected for each reason; then a new member, a standby
promoted and a rebuild each restore partitions, and each partition's digest must equal a full
replay made before compaction. A replay of the compacted events topic alone does not (the test
shows it, so it can fail).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from effectlog.audit import Replay
from effectlog.log import EVENTS
from effectlog.log.kafka import KafkaSettings, create_topics
from projections.checkpoint import Checkpoint
from projections.compaction_guard import CompactionGap
from projections.published import read_published
from tests.cluster_support import Serve, wait_until
from tests.integration.test_kafka_compaction import (
    compact_fast,
    records_on,
    sealers,
    wait_until_compacted,
)
from tests.judges import scribe
from tests.restore_support import (
    EXPIRIES,
    REASONS,
    digests,
    opened,
    replayed,
    write_histories,
)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
PARTITIONS = 3


def compacted_url(bootstrap: str) -> str:
    url = f"kafka://{bootstrap}?prefix=rst{uuid.uuid4().hex[:10]}&partitions={PARTITIONS}"
    create_topics(KafkaSettings.from_url(url))
    return url


def published_everything(url: str) -> bool:
    """Every partition's last checkpoint reflects the events topic's end."""
    with opened(url) as log:
        ends = log.end_offsets(EVENTS)
        changelog = log.changelog()
        assert changelog is not None
        for partition in range(PARTITIONS):
            raw = changelog.last_checkpoint(partition)
            if raw is None or Checkpoint.decode(raw).applied < ends.get(partition, 0):
                return False
    return True


def compact(url: str) -> None:
    """Compact the events topic now (eager cleaner, every partition's segment sealed), then
    give it back a compaction lag serve accepts (it refuses one that could compact records
    before they reach the changelog)."""
    settings = KafkaSettings.from_url(url)
    with opened(url) as log:
        written = records_on(log)
        compact_fast(settings)
        time.sleep(0.3)  # past segment.ms: the next record rolls the segment
        sealer = scribe(log, "sealer")
        for op in sealers(log):
            sealer.create(op, "noop", "seal", {})
        wait_until_compacted(log, written + PARTITIONS)
    admin = AdminClient(settings.client_config())
    resource = ConfigResource(ResourceType.TOPIC, settings.topic(EVENTS), incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", str(settings.min_compaction_lag_ms),
                    incremental_operation=AlterConfigOpType.SET)])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(30)


def serving(member: Serve) -> list[int]:
    health = member.health() or {}
    return sorted(int(p) for p, s in health.get("partitions", {}).items() if s == "serving")


def caught_up(member: Serve, url: str, partitions: list[int]) -> bool:
    """``member`` has applied ``partitions`` up to the events topic's end."""
    health = member.health() or {}
    applied = {int(p): n for p, n in health.get("projected_offsets", {}).items()}
    with opened(url) as log:
        ends = log.end_offsets(EVENTS)
    return all(applied.get(p, -1) >= ends.get(p, 0) for p in partitions)


def a_fresh_member_restores(tmp_path: Path, url: str, truth: dict[int, str]) -> None:
    """A new member with an empty state directory serves every partition, restored from the
    changelog and caught up, and each equals ``truth`` (a full replay)."""
    fresh = Serve(tmp_path, "fresh", url, None)
    try:
        wait_until(lambda: len(serving(fresh)) == PARTITIONS, 90, "the fresh member serves")
        wait_until(lambda: caught_up(fresh, url, list(range(PARTITIONS))), 30, "caught up")
        assert digests(fresh.state_dir, list(range(PARTITIONS))) == truth
    finally:
        fresh.stop()


def test_restores_equal_a_full_replay_made_before_compaction(kafka_bootstrap: str,
                                                             tmp_path: Path) -> None:
    url = compacted_url(kafka_bootstrap)
    with opened(url) as log:
        keys = write_histories(log, per_reason=3)
    replay = tmp_path / "replay"
    first = Serve(tmp_path, "a", url, None)
    try:
        wait_until(lambda: len(serving(first)) == PARTITIONS, 60, "a serves every partition")
        replayed(url, replay)  # a full replay of every record, before compaction
        verdicts_before = audit_verdicts(url, published=False)
        compact(url)
        # the truth: that replay, resumed at its own offset over what came after (the sealers)
        truth = replayed(url, replay)
        wait_until(lambda: published_everything(url), 30, "a published its state")
        with pytest.raises(CompactionGap):  # its first records are gone: of unknown age
            replayed(url, tmp_path / "guarded")
        assert replayed(url, tmp_path / "compacted-alone", accept_gaps=True) != truth, \
            "the compacted events topic alone gives other states (the test can fail)"
        audit_keeps_its_meaning(url, verdicts_before, keys)

        second = Serve(tmp_path, "b", url, None)  # a new member: restores what it is given
        try:
            wait_until(lambda: len(serving(second)) >= 1
                       and len(serving(first)) + len(serving(second)) == PARTITIONS, 90,
                       "b took some partitions")
            taken = serving(second)
            wait_until(lambda: caught_up(second, url, taken), 30, "b caught up")
            assert digests(second.state_dir, taken) == {p: truth[p] for p in taken}
        finally:
            second.stop()
    finally:
        first.stop()
    rebuilt = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url,
                              "--state", str(first.state_dir), "rebuild", "--quiet"],
                             capture_output=True, text=True, timeout=120)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert digests(first.state_dir, list(range(PARTITIONS))) == truth
    assert len(keys) == 3 * (len(REASONS) + len(EXPIRIES))


def audit_verdicts(url: str, published: bool) -> tuple[dict[tuple[int, int], bool], int]:
    """Accepted or not, per position, as ``replay`` judges them (by the publications when
    ``published``), and how many accepted events it says compaction removed."""
    with opened(url) as log:
        marks = read_published(log, range(PARTITIONS)) if published else None
        assert not published or (marks is not None and len(marks) == PARTITIONS)
        run = Replay(log, published=marks)
        verdicts = {(i.record.partition, i.record.offset): i.violation is None for i in run}
    return verdicts, run.summary.compacted_accepted


def audit_keeps_its_meaning(url: str, before: tuple[dict[tuple[int, int], bool], int],
                            keys: list[str]) -> None:
    """After compaction, ``replay`` and ``history`` give each surviving record the verdict a
    replay gave it before, and name the accepted events compaction removed."""
    truth, _ = before
    after, removed = audit_verdicts(url, published=True)
    surviving = {position: ok for position, ok in after.items() if position in truth}
    assert surviving == {position: truth[position] for position in surviving}
    rejected_latest = [p for p, ok in surviving.items() if not ok]
    assert len(rejected_latest) >= 3 * len(REASONS), "every rejected latest record survives"
    gone = [p for p, ok in truth.items() if ok and p not in after]
    assert 0 < removed <= len(gone)  # exact but for the lives expiries ended
    cli = [sys.executable, "-m", "effectlog.cli.main", "--log", url]
    stale = next(k for k in keys if ":stale_epoch-0:" in k)
    shown = subprocess.run([*cli, "history", stale, "--json"], capture_output=True, text=True,
                           timeout=60)
    assert shown.returncode == 0, shown.stderr
    rows = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [r["verdict"].split(":")[0] for r in rows if not r.get("removed")] == [
        "rejected (stale_epoch)"], rows
    assert sum(1 for r in rows if r.get("removed")) == 3  # create, reserve, claim
    audit = subprocess.run([*cli, "replay", "--out", "/dev/null"], capture_output=True,
                           text=True, timeout=120)
    assert audit.returncode == 3 and f"compaction removed {removed} accepted" in audit.stderr


def pausing_serve(tmp_path: Path, name: str, url: str, point: str, on: int = 2,
                  release: Path | None = None) -> tuple[subprocess.Popen[bytes], Path, str]:
    """A serve that stops at ``point`` of a partition's ``on``-th publication with changes
    (until ``release`` exists, when given)."""
    from tests.kafka_broker import free_port

    port = free_port()
    err = tmp_path / f"{name}.err"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.crash.serve_main", "--pause-at", point, "--pause-on",
         str(on), *(("--release-file", str(release)) if release else ()), "--", "--log", url,
         "--state", str(tmp_path / f"state-{name}"),
         "--log-level", "INFO", "serve", "--http", f"127.0.0.1:{port}",
         "--session-timeout", "6s", "--no-recovery"],
        stdout=subprocess.DEVNULL, stderr=err.open("w"), stdin=subprocess.DEVNULL)
    return process, err, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("point", ["before", "inside", "after"])
def test_an_owner_killed_anywhere_in_its_publication_restores_to_a_full_replay(
        kafka_bootstrap: str, tmp_path: Path, point: str) -> None:
    """SIGKILL of the owner at each point of the changelog write path: after its store took
    the batch and before it published, inside the publication's transaction, after the
    commit; a fresh member then restores, and equals a full replay."""
    url = compacted_url(kafka_bootstrap)
    with opened(url) as log:
        write_histories(log, per_reason=2, tag="one-")
    owner, err, _ = pausing_serve(tmp_path, "owner", url, point)
    try:
        wait_until(lambda: published_everything(url), 60, "the owner published once")
        with opened(url) as log:
            write_histories(log, per_reason=2, tag="two-")  # its second publication
        wait_until(lambda: f"paused {point}" in err.read_text(), 60, f"paused {point}")
    finally:
        owner.kill()
        owner.wait(30)
    truth = replayed(url, tmp_path / "replay")
    a_fresh_member_restores(tmp_path, url, truth)


def test_a_zombie_owner_cannot_publish_what_a_restore_adopts(kafka_bootstrap: str,
                                                            tmp_path: Path) -> None:
    """The owner stops inside a publication (its records produced, not committed) and is
    SIGSTOPped through a rebalance: another member takes its partitions, fencing it, and
    publishes. Resumed, the zombie's commit is refused, nothing of it is read by a restore,
    and a restore equals a full replay."""
    import signal

    url = compacted_url(kafka_bootstrap)
    with opened(url) as log:
        write_histories(log, per_reason=2, tag="z1-")
    release = tmp_path / "release"
    zombie, err, _ = pausing_serve(tmp_path, "zombie", url, "inside", release=release)
    successor: Serve | None = None
    try:
        wait_until(lambda: published_everything(url), 60, "the owner published")
        with opened(url) as log:
            write_histories(log, per_reason=2, tag="z2-")
        wait_until(lambda: "paused inside" in err.read_text(), 60, "paused mid-publication")
        zombie.send_signal(signal.SIGSTOP)
        successor = Serve(tmp_path, "successor", url, None)
        wait_until(lambda: len(serving(successor)) == PARTITIONS, 90, "the successor took over")
        with opened(url) as log:
            write_histories(log, per_reason=1, tag="z3-")
        wait_until(lambda: published_everything(url), 30, "the successor published")
        release.touch()
        zombie.send_signal(signal.SIGCONT)
        wait_until(lambda: "this writer was fenced" in err.read_text(), 60,
                   "the zombie's commit was refused")
    finally:
        zombie.send_signal(signal.SIGCONT)
        zombie.kill()
        zombie.wait(30)
        if successor is not None:
            successor.stop()
    truth = replayed(url, tmp_path / "replay")
    a_fresh_member_restores(tmp_path, url, truth)


def test_a_promoted_standby_publishes_nothing_older_than_the_changelog(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """Two members with a standby copy of each other's partitions; the owner of some is
    SIGKILLed and its standby promoted: the promoted copy's digests, and a restore after it,
    equal a full replay."""
    url = compacted_url(kafka_bootstrap)
    with opened(url) as log:
        write_histories(log, per_reason=2, tag="s1-")
    members = [Serve(tmp_path, name, url, None, None, "--standbys", "1") for name in ("x", "y")]
    try:
        wait_until(lambda: sum(len(serving(m)) for m in members) == PARTITIONS
                   and all(serving(m) for m in members), 90, "both members serve")
        wait_until(lambda: published_everything(url), 30, "published")
        victim, survivor = members
        lost = serving(victim)
        victim.kill()
        with opened(url) as log:
            write_histories(log, per_reason=1, tag="s2-")
        wait_until(lambda: len(serving(survivor)) == PARTITIONS, 90, "the standby was promoted")
        wait_until(lambda: caught_up(survivor, url, list(range(PARTITIONS))), 30, "caught up")
        wait_until(lambda: published_everything(url), 30, "the survivor published")
        truth = replayed(url, tmp_path / "replay")
        assert digests(survivor.state_dir, lost) == {p: truth[p] for p in lost}
    finally:
        for member in members:
            member.stop()
    a_fresh_member_restores(tmp_path, url, truth)


def unpublished_s(member: Serve, partition: int) -> float:
    """The member's effectlog_changelog_unpublished_seconds of ``partition`` (-1: none)."""
    from tests.cluster_support import HTTP

    text = HTTP.request("GET", member.url + "/metrics").data.decode()
    for line in text.splitlines():
        if line.startswith(f'effectlog_changelog_unpublished_seconds{{partition="{partition}"}}'):
            return float(line.split()[-1])
    return -1.0


def test_an_owner_whose_writer_was_fenced_publishes_again_while_the_group_gives_it_the_partition(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    """The owner's changelog writer of partition 0 is fenced by a producer outside the group
    (as the coordinator ends one whose publication stayed open past its timeout). The owner
    lets the writer go, takes it again once its time came (30 s) since the group still gives
    it the partition, and publishes what changed meanwhile; a fresh member restores it to a
    full replay."""
    from confluent_kafka import Producer

    from effectlog.log.kafka.changelog import transactional_id

    url = compacted_url(kafka_bootstrap)
    settings = KafkaSettings.from_url(url)
    with opened(url) as log:
        write_histories(log, per_reason=1, tag="f1-")
    owner = Serve(tmp_path, "owner", url, None)
    try:
        wait_until(lambda: len(serving(owner)) == PARTITIONS, 90, "the owner serves")
        wait_until(lambda: published_everything(url), 30, "the owner published")
        fencer = Producer({**settings.client_config(),
                           "transactional.id": transactional_id(settings, 0)})
        fencer.init_transactions(30)  # bumps the epoch: the owner's writer is fenced
        with opened(url) as log:
            write_histories(log, per_reason=2, tag="f2-")
        wait_until(lambda: "taking it again" in owner.err_path.read_text(), 30,
                   "the owner's publication was fenced")
        assert not published_everything(url)
        wait_until(lambda: unpublished_s(owner, 0) >= 5, 30,
                   "effectlog_changelog_unpublished_seconds shows partition 0 aging")
        wait_until(lambda: published_everything(url), 90, "the owner published again")
        wait_until(lambda: unpublished_s(owner, 0) < 5, 30, "and current again")
        text = owner.err_path.read_text()
        assert "partition 0: publishing its state to the changelog" in text.split(
            "taking it again")[-1], "the writer was taken again"
    finally:
        owner.stop()
    truth = replayed(url, tmp_path / "replay")
    a_fresh_member_restores(tmp_path, url, truth)
