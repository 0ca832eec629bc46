"""The cluster path of docs/kafka/cluster.md on Apache Kafka: three ``effectlog serve``
instances with the provider named once (EFFECTLOG_PROVIDER), a worker whose payment is left
in doubt, its partition's owner SIGKILLed, a person's decision through ``effectlog approve
--server``, and nothing else run by hand: the owning instance's recovery parks the effect
for a decision, the new owner's reconciler sends it again with the same key, and history
says who did. Then ``recover`` and ``reconcile`` by hand against the cluster: every partition
covered, or the ones that were not named."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from consumers.providers.fake import FakeProvider
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from tests.cluster_support import Serve, wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]
PARTITIONS = 6
OP = "order-7"
KEY = f"agent:{OP}:payment.charge:stripe:cus_42"
#: Why a member may answer /readyz 503 while it joins (anything else fails the test).
JOINING = ("waiting for group ", "restoring partition(s) ")


def cli(url: str, *args: str, stdin: str = "", env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if k not in ("EFFECTLOG_SERVER", "EFFECTLOG_PROVIDER")}
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, *args],
                          input=stdin, capture_output=True, text=True, timeout=120,
                          env={**base, **(env or {})}, cwd=cwd)


def worker_lines() -> str:
    """What a worker writes before its payment call times out and it is killed."""
    line = {"operation_id": OP, "kind": "payment.charge", "target": "stripe:cus_42",
            "worker_id": "billing-1"}
    steps = [{"transition": "create", "payload": {"amount_cents": 4200, "currency": "EUR"}},
             {"transition": "reserve"}, {"transition": "dispatch"},
             {"transition": "unknown", "error": "provider timed out after 30s"}]
    return "".join(json.dumps({**line, **step}) + "\n" for step in steps)


def state(url: str, servers: str) -> str | None:
    done = cli(url, "--timeout", "3", "get", KEY, "--json", "--server", servers)
    return json.loads(done.stdout)["state"] if done.returncode == 0 else None


def joins(member: Serve, seen: list[str]) -> bool:
    """Whether ``member`` is ready; a 503 before must say why in a way a joining member may."""
    assert member.process.poll() is None, member.err_path.read_text()[-2000:]
    status, body = member.ready()
    if status == 503:
        assert body is not None and str(body["why"]).startswith(JOINING), body
        seen.append(str(body["why"]))
    return status == 200


def test_an_effect_in_doubt_is_settled_by_a_persons_decision_alone(kafka_url: str,
                                                                   tmp_path: Path) -> None:
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    os.environ["EFFECTLOG_PROVIDER"] = f"fake:///{provider}"  # named once, for every member
    try:
        members = [Serve(tmp_path, name, kafka_url, None) for name in ("a", "b", "c")]
    finally:
        del os.environ["EFFECTLOG_PROVIDER"]
    try:
        seen: list[str] = []
        wait_until(lambda: all(joins(m, seen) for m in members), 90, "every member ready")
        wait_until(lambda: sum(len(m.serving()) for m in members) == PARTITIONS, 60,
                   "the members serve every partition")
        print(f"/readyz before ready: {sorted(set(seen))}")
        servers = ",".join(m.url for m in members)

        written = cli(kafka_url, "append", "--server", servers, stdin=worker_lines())
        assert written.returncode == 0, written.stderr
        with open_log(kafka_url) as log:
            partition = log.partition_for(EVENTS, KEY)
        (owner,) = [m for m in members if partition in m.serving()]
        wait_until(lambda: state(kafka_url, servers) == "AWAITING_APPROVAL", 60,
                   "the owner's recovery parks the payment for a decision")
        fake = FakeProvider(provider)
        assert fake.calls(KEY) == 0  # an UNKNOWN payment is never sent again by itself

        owner.kill()  # the member owning the key's partition dies
        survivors = [m for m in members if m is not owner]
        wait_until(lambda: any(partition in m.serving() for m in survivors), 60,
                   "a survivor serves the partition")
        (new_owner,) = [m for m in survivors if partition in m.serving()]
        alive = ",".join(m.url for m in survivors)

        decided = cli(kafka_url, "approve", KEY, "--decision", "retry", "--by", "dana",
                      "--reason", "Stripe shows no charge under this key", "--server", alive)
        assert decided.returncode == 0, decided.stderr
        assert decided.stdout.strip().endswith("-> RESERVED (epoch 3)"), decided.stdout
        wait_until(lambda: state(kafka_url, alive) == "SUCCEEDED", 60,
                   "the new owner's reconciler sends it again")

        history = [json.loads(line)["event"] for line in
                   cli(kafka_url, "history", KEY, "--json").stdout.splitlines()]
        flow = [(e["transition"], e["state"], e["fencing_epoch"]) for e in history
                if e["worker_id"].startswith(("billing-1", "approval:", "reconciler:"))]
        assert flow[:4] == [("CREATE", "CREATED", 0), ("RESERVE", "RESERVED", 1),
                            ("DISPATCH", "DISPATCHED", 1), ("UNKNOWN", "UNKNOWN", 1)]
        assert flow[4:6] == [("CLAIM", "UNKNOWN", 2), ("AWAIT_APPROVAL", "AWAITING_APPROVAL", 2)]
        assert flow[-4:] == [("APPROVE", "RESERVED", 3), ("CLAIM", "RESERVED", 4),
                             ("DISPATCH", "DISPATCHED", 4), ("RECORD", "SUCCEEDED", 4)], flow
        (parked,) = [e for e in history if e["transition"] == "AWAIT_APPROVAL"]
        sent = history[-3:]
        assert parked["worker_id"].endswith(f":{owner.process.pid}"), parked  # the old owner
        assert {e["worker_id"] for e in sent} == {
            f"reconciler:{socket.gethostname()}:{new_owner.process.pid}"}, sent  # the new one
        assert sent[-1]["outcome"]["source"] == "redispatch"
        table = cli(kafka_url, "history", KEY).stdout
        assert "SUCCEEDED (reconciler: re-dispatch)" in table and "RETRY by dana" in table
        assert (fake.executions(KEY), fake.calls(KEY)) == (1, 1)  # once, with the same key
        fake.close()

        err = new_owner.err_path.read_text()
        assert "assigned partition(s)" in err and f"partition {partition} serving" in err, err
        status, ready = new_owner.ready()
        assert status == 200 and ready is not None and ready["ready"] is True, ready
    finally:
        for member in members:
            member.stop()


def settled(members: list[Serve]) -> bool:
    """Every partition served, and by every member some: a member still starting (a slow
    import on a loaded machine) leaves the other serving all of them for a while."""
    shares = [m.serving() for m in members]
    return sum(len(s) for s in shares) == PARTITIONS and all(shares)


def one_effect_per_partition(url: str, servers: str) -> None:
    from effectlog.keys import make_key
    from effectlog.worker import Worker

    with open_log(url) as log, Worker(log, "filler", server=servers) as worker:
        missing = set(range(PARTITIONS))
        for i in range(1000):
            key = make_key(f"fill-{i}", "email.send", "mailto:f@example.com")
            if log.partition_for(EVENTS, key) in missing:
                missing.discard(log.partition_for(EVENTS, key))
                worker.create(f"fill-{i}", "email.send", "mailto:f@example.com", {"i": i})
            if not missing:
                return
    raise AssertionError(f"no key for partitions {missing}")


def test_recover_and_reconcile_by_hand_cover_every_partition_or_name_the_rest(
        kafka_url: str, tmp_path: Path) -> None:
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    spec = f"fake:///{provider}"
    recovering = Serve(tmp_path, "r", kafka_url, provider)
    quiet = Serve(tmp_path, "q", kafka_url, None)  # --no-recovery
    members = [recovering, quiet]
    try:
        wait_until(lambda: settled(members), 90, "both members serve their share")
        servers = ",".join(m.url for m in members)
        nowhere = tmp_path / "nowhere"
        one_effect_per_partition(kafka_url, servers)  # copies left behind now lag the log

        alone = cli(kafka_url, "--state", str(nowhere), "recover", "--once")
        assert alone.returncode == 2 and "pass --server URL" in alone.stderr, alone.stderr
        fresh = tmp_path / "fresh-provider.db"
        refused = cli(kafka_url, "--state", str(nowhere), "reconcile", "--once", "--provider",
                      f"fake:///{fresh}")
        assert refused.returncode == 2 and "pass --server URL" in refused.stderr, refused.stderr
        assert not fresh.exists()  # a refused run leaves no provider file behind

        # a loaded machine can make the group rebalance meanwhile: ask a settled group
        wait_until(lambda: settled(members), 90, "both members serve their share again")
        asked = cli(kafka_url, "--state", str(nowhere), "recover", "--once", "--json",
                    "--stuck-after", "1h", "--server", servers)
        assert asked.returncode == 4, asked.stderr
        report: dict[str, Any] = json.loads(asked.stdout)
        assert report["members"][recovering.url] == recovering.serving()
        assert {int(p) for p in report["uncovered"]} == set(quiet.serving()), report
        assert all(why == f"its owner {quiet.url} runs with --no-recovery"
                   for why in report["uncovered"].values()), report
        assert asked.stderr.count("\n") == 1 and "--no-recovery" in asked.stderr

        one = cli(kafka_url, "--state", str(recovering.state_dir), "recover", "--once",
                  "--stuck-after", "1h", "--json")
        assert one.returncode == 4, one.stderr
        missing = json.loads(one.stdout)["uncovered"]
        assert {int(p) for p in missing} == set(quiet.serving()), missing
        assert all("not in the projection under" in why or "records behind the log" in why
                   for why in missing.values()), missing

        by_hand = cli(kafka_url, "--state", str(tmp_path / "hand"), "reconcile", "--once",
                      "--server", servers, env={"EFFECTLOG_PROVIDER": spec})  # named once
        assert by_hand.returncode == 0, by_hand.stderr
        assert not nowhere.exists()
    finally:
        for member in members:
            member.stop()


def test_a_member_the_group_gives_nothing_is_ready_and_says_so(kafka_bootstrap: str,
                                                                tmp_path: Path) -> None:
    """Readiness waits for the group's answer, not for a partition: a second member of a
    one-partition log gets none (librdkafka calls back with an empty assignment) and is ready,
    forwarding."""
    from effectlog.log.kafka import KafkaSettings, create_topics

    url = f"kafka://{kafka_bootstrap}?prefix=t{uuid.uuid4().hex[:12]}&partitions=1"
    create_topics(KafkaSettings.from_url(url))
    first = Serve(tmp_path, "first", url, None)
    second: Serve | None = None
    try:
        wait_until(lambda: first.serving() == [0], 60, "the first member serves partition 0")
        second = Serve(tmp_path, "second", url, None)
        seen: list[str] = []
        wait_until(lambda: joins(second, seen), 60, "the second member ready")
        status, body = second.ready()
        assert status == 200 and body is not None and body["partitions"] == {}, body
        assert "assigned this member no partition" in str(body["note"])
        assert "assigned no partition to this member" in second.err_path.read_text()
    finally:
        for member in (first, second):
            if member is not None:
                member.stop()
