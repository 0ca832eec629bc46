"""The projection cluster on Apache Kafka: three `effectlog serve` processes in one consumer
group over six partitions, effects appended throughout, one member SIGKILLed, a fourth
joining, and a second process refused on a state directory in use."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from consumers.providers.fake import FakeProvider
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from projections.projector import Projector
from projections.rocksdb.digest import partition_digest
from tests.cluster_support import HTTP, Serve, Workload, answer, ask_judge, wait_until
from tests.restore_support import RESTORED

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
PARTITIONS = 6
SESSION_S = 6


def _owners(members: list[Serve]) -> dict[int, Serve]:
    return {p: m for m in members for p in m.serving()}


def _all_keys_answer(members: list[Serve], keys: list[str]) -> bool:
    return all(answer(f"{m.url}/v1/effects/{key}")[0] == 200 for m in members for key in keys)


class _Prober(threading.Thread):
    """GETs sample keys from every member until stopped; counts failures per partition."""

    def __init__(self, members: list[Serve], keys: dict[int, str]) -> None:
        super().__init__(name="prober", daemon=True)
        self.members, self.keys = members, keys
        self.failures: dict[int, int] = dict.fromkeys(keys, 0)
        self.requests = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for partition, key in self.keys.items():
                for member in self.members:
                    status, _ = answer(f"{member.url}/v1/effects/{key}")
                    self.requests += 1
                    if status != 200:
                        self.failures[partition] += 1
            time.sleep(0.05)


def test_a_group_of_serve_processes_fails_over_and_scales_out(kafka_url: str,
                                                              tmp_path: Path) -> None:
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    workload = Workload(kafka_url, provider)
    workload.start()
    members = [Serve(tmp_path, f"s{i}", kafka_url, provider) for i in range(3)]
    joined: Serve | None = None
    t0 = time.monotonic()

    def mark(what: str) -> None:
        print(f"{time.monotonic() - t0:6.1f}s {what} ({len(workload.keys)} effects)")

    try:
        wait_until(lambda: len(_owners(members)) == PARTITIONS and all(
            m.serving() for m in members), 60, "three members share all partitions")
        wait_until(lambda: len(workload.keys) >= 40, 60, "effects appended")
        mark('wait_until(lambda: len(workloa')
        sample = list(workload.keys[:30])
        wait_until(lambda: _all_keys_answer(members, sample), 10,
                   "every key answers from every member")
        _assert_lookup_answers(members, sample)

        # SIGKILL the member with the most partitions while effects keep coming.
        victim = max(members, key=lambda m: len(m.serving()))
        moved = victim.serving()
        survivors = [m for m in members if m is not victim]
        victim.kill()
        killed_at = time.monotonic()
        wait_until(lambda: sorted(_owners(survivors)) == list(range(PARTITIONS)),
                   SESSION_S + 30, "survivors took the victim's partitions")
        keys_now = list(workload.keys)
        wait_until(lambda: _all_keys_answer(survivors, keys_now), 30,
                   "every key answers from every survivor")
        failover_s = time.monotonic() - killed_at
        _assert_lookup_answers(survivors, keys_now, dead=victim.url)
        mark('failover_s = time.monotonic() ')
        assert failover_s < SESSION_S + 30
        assert all(p in _owners(survivors) for p in moved)

        # A fourth member joins; partitions it does not take keep answering meanwhile.
        before = _owners(survivors)
        probe_keys = _key_per_partition(kafka_url, workload.keys)
        prober = _Prober(survivors, probe_keys)
        prober.start()
        joined = Serve(tmp_path, "s3", kafka_url, provider)
        wait_until(lambda: bool(joined.serving()), 60, "the fourth member serves partitions")
        current = [*survivors, joined]
        wait_until(lambda: sorted(_owners(current)) == list(range(PARTITIONS)), 60,
                   "all partitions served after the join")
        prober.stop.set()
        prober.join(30)
        mark('prober.join(30)')
        after = _owners(current)
        stayed = [p for p in range(PARTITIONS) if after[p] is before[p]]
        assert stayed and len(stayed) < PARTITIONS, "cooperative rebalance moved some only"
        assert prober.requests > 0
        assert all(prober.failures[p] == 0 for p in stayed), prober.failures

        # A second process on a state directory in use is refused; the first serves on.
        clash = Serve(tmp_path, "clash", kafka_url, provider, survivors[0].state_dir)
        clash.process.wait(60)
        err = clash.err_path.read_text().strip().splitlines()
        assert clash.process.returncode == 4
        mark('assert clash.process.returncod')
        assert err[-1].startswith(f"error: state directory {survivors[0].state_dir} is in use")

        # Stop appending; recovery settles every effect with one provider call each.
        workload.stop.set()
        workload.join(30)
        mark('workload.join(30)')
        assert workload.error is None, workload.error
        keys = list(workload.keys)
        fake = FakeProvider(provider)
        try:
            wait_until(lambda: all(_state(current, k) == "SUCCEEDED" for k in keys), 120,
                       "every effect settled")
            assert {fake.calls(k) for k in keys} == {1}
            mark('assert {fake.calls(k) for k in')
            assert {fake.executions(k) for k in keys} == {1}
        finally:
            fake.close()
        assert _all_keys_answer(current, keys[-20:])

        # Each partition's projection equals a clean rebuild of it.
        log = open_log(kafka_url)
        ends = log.end_offsets(EVENTS)
        wait_until(lambda: _applied(current, ends), 30, "every partition applied the log end")
        with Projector(log, tmp_path / "clean", from_changelog=False) as clean:
            clean.run(once=True)  # a full replay (owners that restored keep no old rejections)
        mark('project(log, tmp_path / "clean')
        log.close()
        owners = _owners(current)
        for partition in range(PARTITIONS):
            assert partition_digest(owners[partition].state_dir, partition, RESTORED) == \
                partition_digest(tmp_path / "clean", partition, RESTORED), f"partition {partition}"
    finally:
        workload.stop.set()
        errors = {m.name: m.stop() for m in members + ([joined] if joined else [])}
    for name, err in errors.items():
        assert "Traceback" not in err, f"{name}: {err[-3000:]}"


def _assert_lookup_answers(members: list[Serve], keys: list[str], dead: str = "") -> None:
    """One question to the judge of each member answers keys of every partition: its own,
    and the others' through their owners (a key whose owner it cannot reach now is listed
    as unanswered, never answered wrong)."""
    owners = {p: m.url for p, m in _owners(members).items()}
    for member in members:
        status, body = ask_judge(member.url, keys)
        assert status == 200, body
        found = {entry["key"]: entry for entry in body["answers"]}
        unanswered = {entry["key"] for entry in body["unanswered"]}
        assert set(found) | unanswered == set(keys) and not set(found) & unanswered
        assert len(found) >= (len(keys) if not dead else 1)
        for entry in found.values():
            served_by = entry["premises"]["served_by"]
            assert served_by == owners[entry["partition"]] != dead
            assert entry["snapshot"]["idempotency_key"] == entry["key"]
        served = {entry["premises"]["served_by"] for entry in found.values()}
        assert dead or served == {m.url for m in members}, served


def _state(members: list[Serve], key: str) -> str | None:
    status, body = answer(f"{members[0].url}/v1/effects/{key}")
    return body["state"] if status == 200 else None


def _applied(members: list[Serve], ends: dict[int, int]) -> bool:
    positions: dict[int, int] = {}
    for member in members:
        health = member.health() or {}
        positions.update({int(p): n for p, n in health.get("projected_offsets", {}).items()})
    return all(positions.get(p, -1) >= end for p, end in ends.items())


def _key_per_partition(log_url: str, keys: list[str]) -> dict[int, str]:
    log = open_log(log_url)
    try:
        found: dict[int, str] = {}
        for key in keys:
            found.setdefault(log.partition_for(EVENTS, key), key)
        return found
    finally:
        log.close()


def test_a_read_resumes_a_partition_an_earlier_read_paused(kafka_url: str) -> None:
    """The reconciler alternates reads of several partitions, some stopped by their limit;
    a partition paused at its end by one read must answer the next read of it."""
    log = open_log(kafka_url)
    writer = open_log(kafka_url)
    try:
        keys = {p: [k for k in (f"k{i}" for i in range(500))
                    if log.partition_for(EVENTS, k) == p][:3] for p in (0, 1)}
        writer.append(EVENTS, keys[0][0], b"a")
        for key in keys[1]:
            writer.append(EVENTS, key, b"b")
        assert len(log.read(EVENTS, 0, 0, 10)) == 1  # to its end: paused there
        assert len(log.read(EVENTS, 1, 0, 1)) == 1   # stopped by the limit, not the end
        writer.append(EVENTS, keys[0][1], b"c")
        assert [r.value for r in log.read(EVENTS, 0, 1, 10)] == [b"c"]  # not a 10 s timeout
    finally:
        writer.close()
        log.close()


def test_a_standby_copy_is_promoted_with_nothing_left_to_restore(kafka_url: str,
                                                                   tmp_path: Path) -> None:
    workload = Workload(kafka_url, tmp_path / "provider.db", pause_s=0.0, limit=150)
    FakeProvider(tmp_path / "provider.db").close()
    workload.run()  # in this thread: all appended before the members start
    assert workload.error is None, workload.error
    members = [Serve(tmp_path, f"w{i}", kafka_url, None, None, "--standbys", "1")
               for i in range(2)]
    try:
        wait_until(lambda: len(_owners(members)) == PARTITIONS and all(
            m.serving() for m in members), 60, "two members share all partitions")
        log = open_log(kafka_url)
        ends = log.end_offsets(EVENTS)
        log.close()

        def warm(member: Serve, other: Serve) -> bool:
            standbys = {int(p): n for p, n in (member.health() or {}).get("standbys", {}).items()}
            return sorted(standbys) == other.serving() and all(
                n >= ends[p] for p, n in standbys.items())

        wait_until(lambda: warm(members[1], members[0]) and warm(members[0], members[1]), 60,
                   "each member keeps the other's partitions warm")
        victim, survivor = members
        moved = victim.serving()
        restored_before = _restored_records(survivor)
        victim.kill()
        wait_until(lambda: survivor.serving() == list(range(PARTITIONS)), SESSION_S + 30,
                   "the survivor serves every partition")
        assert _restored_records(survivor) == restored_before  # promoted: no tail to apply
        err = survivor.err_path.read_text()
        for partition in moved:  # said at INFO: who got what, promoted where, serving
            assert f"partition {partition}: standby promoted, applied up to offset " in err, err
            assert f"partition {partition} serving: restored 0 records" in err, err
        assert "assigned partition(s) " in err
        assert all(answer(f"{survivor.url}/v1/effects/{k}")[0] == 200 for k in workload.keys)
        assert moved
    finally:
        for member in members:
            member.stop()


def _restored_records(member: Serve) -> float:
    text = HTTP.request("GET", member.url + "/metrics").data.decode()
    for line in text.splitlines():
        if line.startswith("effectlog_partition_restored_records_total"):
            return float(line.split()[-1])
    raise AssertionError("no restored-records metric")
