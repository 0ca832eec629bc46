"""The query API of a node on SQLite: real log, real RocksDB, real HTTP (aiohttp + urllib3)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import urllib3
from aiohttp import web

from consumers.node.gate import PartitionGate
from consumers.node.http_api import NODE_KEY
from consumers.node.node import Node, NodeSettings
from effectlog.client import StateClient
from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable, InvalidInput
from effectlog.judge import CannotJudge, Query, worker_fingerprint
from effectlog.judge.client import ClusterJudge
from effectlog.log import open_log
from effectlog.log.base import EVENTS, EventLog
from effectlog.machine import advance
from effectlog.model import Transition as T
from effectlog.worker import Worker

pytestmark = pytest.mark.timeout(120)


def _extra(app: web.Application) -> None:
    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"node": request.app[NODE_KEY].url})

    app.router.add_get("/console/hello", hello)


@pytest.fixture
def log_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/log.db"


@pytest.fixture
def log(log_url: str) -> Iterator[EventLog]:
    handle = open_log(log_url)
    yield handle
    handle.close()


@pytest.fixture
def node(log_url: str, log: EventLog, tmp_path: Path) -> Iterator[Node]:
    worker = Worker(log, "w1")
    for i in range(5):
        key = worker.create(f"op{i}", "email.send", f"mailto:u{i}@x.org/box", {"n": i}).idempotency_key
        if i % 2:
            worker.reserve(key)
    running = Node(log_url, NodeSettings(state_dir=tmp_path / "state", http_port=0),
                   extra_routes=_extra).start()
    # the node restores a partition before it serves it (503 meanwhile): wait for that
    deadline = time.monotonic() + 30
    while running.gate.status(0) != "serving":
        assert time.monotonic() < deadline, "the node did not start serving"
        time.sleep(0.02)
    yield running
    assert running.stop() == []
    running.close()


@pytest.fixture
def http() -> urllib3.PoolManager:
    return urllib3.PoolManager(retries=False, timeout=10)


def _key(i: int) -> str:
    return f"agent:op{i}:email.send:mailto:u{i}@x.org/box"


def _cli(tmp_path: Path, log_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", log_url,
                           "--state", str(tmp_path / "nowhere"), *args],
                          capture_output=True, text=True, timeout=60)


def test_a_key_answers_with_the_json_of_get_and_its_partition_offset(
        node: Node, http: urllib3.PoolManager, tmp_path: Path, log_url: str) -> None:
    answer = http.request("GET", f"{node.url}/v1/effects/{_key(1)}?fresh=1")
    assert answer.status == 200
    assert answer.headers["Effectlog-Partition"] == "0"
    assert answer.headers["Effectlog-Applied-Offset"] == "7"
    through_cli = _cli(tmp_path, log_url, "get", _key(1), "--json", "--server", node.url)
    assert through_cli.returncode == 0, through_cli.stderr
    assert json.loads(answer.data) == json.loads(through_cli.stdout)
    assert json.loads(answer.data)["state"] == "RESERVED"
    unknown = http.request("GET", f"{node.url}/v1/effects/agent:nope:x:y?fresh=1")
    assert unknown.status == 404 and unknown.headers["Effectlog-Applied-Offset"] == "7"


def test_min_offset_answers_once_the_own_append_is_applied(node: Node, log: EventLog) -> None:
    client = StateClient(node.url)
    worker = Worker(log, "w2")
    created = worker.create("fresh", "email.send", "mailto:f@x.org", {})
    position = worker.last_position
    assert position is not None
    state = client.get(created.idempotency_key, min_offset=position.offset, timeout_ms=5000)
    assert state.snapshot is not None and state.snapshot["event_id"] == created.event_id
    assert state.applied_offset > position.offset and state.rejected is None


def test_a_refused_append_is_named_in_the_answer(node: Node, log: EventLog) -> None:
    client = StateClient(node.url)
    current = client.get(_key(1), fresh=True).snapshot
    assert current is not None and current["fencing_epoch"] == 1
    claimed = Worker(log, "w2").reserve(_key(1))  # epoch 2 now belongs to w2
    stale = replace(advance(replace(claimed, worker_id="w1", fencing_epoch=1), T.DISPATCH, "w1"),
                    event_id="stale-dispatch")
    offset = log.append(EVENTS, _key(1), event_codec().encode(stale.to_record())).offset
    state = client.get(_key(1), min_offset=offset)
    assert state.rejected == "stale_epoch"
    assert state.snapshot is not None and state.snapshot["event_id"] == claimed.event_id


def test_an_unknown_key_also_waits_for_its_offset(node: Node, log: EventLog) -> None:
    Worker(log, "w3").create("other", "email.send", "mailto:o@x.org", {})
    end = log.end_offsets(EVENTS)[0]
    state = StateClient(node.url).get("agent:never:email.send:x", min_offset=end - 1)
    assert state.snapshot is None and state.applied_offset >= end


def test_a_wait_past_the_log_end_times_out_with_504(node: Node,
                                                    http: urllib3.PoolManager) -> None:
    answer = http.request("GET", f"{node.url}/v1/effects/{_key(0)}?min_offset=999&timeout_ms=50")
    assert answer.status == 504 and "short of 1000" in json.loads(answer.data)["error"]
    with pytest.raises(BackendUnavailable, match="short of 1000"):
        StateClient(node.url).get(_key(0), min_offset=999, timeout_ms=50)
    started = time.monotonic()  # timeout_ms=0: do not wait (it used to wait the default 5 s)
    answer = http.request("GET", f"{node.url}/v1/effects/{_key(0)}?min_offset=999&timeout_ms=0")
    assert answer.status == 504 and time.monotonic() - started < 4.0


def test_list_and_stats_read_like_the_cli(node: Node, tmp_path: Path, log_url: str) -> None:
    client = StateClient(node.url)
    reserved = client.list("RESERVED")
    assert [s["idempotency_key"] for s in reserved] == [_key(1), _key(3)]
    assert len(client.list(limit=2)) == 2
    listed = _cli(tmp_path, log_url, "list", "--state", "reserved", "--json", "--server", node.url)
    assert json.loads(listed.stdout) == reserved
    figures = client.stats()
    assert figures["states"]["CREATED"] == 3 and figures["states"]["RESERVED"] == 2
    assert figures["lag"] == {"0": 0} and figures["members"] == {node.url: [0]}
    local = _cli(tmp_path.parent, log_url, "--state", str(tmp_path / "state"), "stats", "--json")
    assert {k: v for k, v in figures.items() if k not in ("projection", "members", "unserved")} \
        == {k: v for k, v in json.loads(local.stdout).items() if k != "projection"}


def test_a_cut_list_says_how_many_more_and_pages_on_through_the_server(
        node: Node, tmp_path: Path, log_url: str) -> None:
    whole = _cli(tmp_path, log_url, "list", "--keys", "--server", node.url).stdout.splitlines()
    assert sorted(whole) == [_key(i) for i in range(5)]
    first = _cli(tmp_path, log_url, "list", "--keys", "--limit", "2", "--server", node.url)
    assert first.returncode == 0 and first.stdout.splitlines() == whole[:2]
    *_, last = first.stderr.splitlines()
    assert last.startswith("3 more — --limit N (up to 10,000) or --after "), first.stderr
    cursor = last.split("--after ")[1].split()[0]
    rest = _cli(tmp_path, log_url, "list", "--keys", "--limit", "3", "--after", cursor,
                "--server", node.url)
    assert rest.returncode == 0 and rest.stderr == ""  # the end: no line about more
    assert rest.stdout.splitlines() == whole[2:]
    too_many = _cli(tmp_path, log_url, "list", "--limit", "10001", "--server", node.url)
    assert too_many.returncode == 2 and "1<=x<=10000" in too_many.stderr


def test_bad_parameters_are_refused_with_400(node: Node, http: urllib3.PoolManager) -> None:
    for query in ("/v1/effects/k?min_offset=x", "/v1/effects/k?timeout_ms=999999",
                  "/v1/effects?state=NOPE", "/v1/effects?limit=0", "/v1/effects?older_than=5q",
                  "/v1/effects?limit=10001"):
        answer = http.request("GET", node.url + query)
        assert answer.status == 400, query
        assert json.loads(answer.data)["error"]
    with pytest.raises(InvalidInput, match="state must be one of"):
        StateClient(node.url).list("NOPE")


def test_cli_exit_codes_through_the_server(node: Node, tmp_path: Path, log_url: str) -> None:
    missing = _cli(tmp_path, log_url, "get", "agent:no:such:key", "--json", "--server", node.url)
    assert missing.returncode == 1 and "no effect with key agent:no:such:key" in missing.stderr
    down = _cli(tmp_path, log_url, "get", _key(0), "--server", "http://127.0.0.1:9")
    assert down.returncode == 4 and down.stderr.count("\n") == 1, down.stderr
    failover = _cli(tmp_path, log_url, "get", _key(0), "--json",
                    "--server", f"http://127.0.0.1:9,{node.url}")
    assert failover.returncode == 0 and json.loads(failover.stdout)["idempotency_key"] == _key(0)


def test_extra_routes_plug_into_the_same_server(node: Node, http: urllib3.PoolManager) -> None:
    answer = http.request("GET", f"{node.url}/console/hello")
    assert answer.status == 200 and json.loads(answer.data) == {"node": node.url}
    metrics = http.request("GET", f"{node.url}/metrics")
    assert metrics.status == 200 and b"effectlog_partition_restore_seconds_count 1.0" in metrics.data
    health = json.loads(http.request("GET", f"{node.url}/healthz").data)
    assert health["ok"] and health["partitions"] == {"0": "serving"}


def test_a_second_node_on_the_same_state_directory_is_refused(node: Node, tmp_path: Path,
                                                               log_url: str) -> None:
    second = _cli(tmp_path.parent, log_url, "--state", str(tmp_path / "state"), "serve",
                  "--http", "127.0.0.1:0", "--no-recovery")
    assert second.returncode == 4
    assert second.stderr.strip().splitlines()[-1].startswith(
        f"error: state directory {tmp_path / 'state'} is in use by effectlog serve")
    assert StateClient(node.url).get(_key(0)).snapshot is not None  # the first one serves on


def test_gate_serves_a_partition_once_restored_and_wakes_waiters() -> None:
    restored: list[tuple[int, int]] = []
    gate = PartitionGate(on_restored=lambda p, n, _: restored.append((p, n)))
    gate.assigned(3, position=10, target=25)
    assert gate.status(3) == "restoring" and gate.serving() == [] and gate.restore_left(3) == 15
    woke = threading.Event()
    waiter = threading.Thread(target=lambda: gate.wait(3, 30, 10) and woke.set())
    waiter.start()
    gate.applied(3, 25)
    assert gate.status(3) == "serving" and restored == [(3, 15)] and not woke.is_set()
    gate.applied(3, 31)
    waiter.join(5)
    assert woke.is_set()
    assert not gate.wait(3, 40, 0.01)
    gate.revoked(3)
    assert gate.status(3) is None and not gate.wait(3, 1, 0.01)


def _judge_body(queries: list[dict[str, object]], judge: str | None = None) -> bytes:
    return json.dumps({"judge": judge or worker_fingerprint(), "timeout_ms": 2000,
                       "queries": queries}).encode()


def test_the_judge_answers_many_keys_with_their_premises(node: Node, http: urllib3.PoolManager,
                                                       log: EventLog) -> None:
    keys = [_key(3), "agent:nope:x:y", _key(0)]
    answer = http.request("POST", f"{node.url}/v1/judge",
                          body=_judge_body([{"key": k} for k in keys]),
                          headers={"Content-Type": "application/json"})
    assert answer.status == 200
    body = json.loads(answer.data)
    assert body["unanswered"] == []
    found = {entry["key"]: entry for entry in body["answers"]}
    assert sorted(found) == sorted(keys)
    for key in (_key(3), _key(0)):
        single = http.request("GET", f"{node.url}/v1/effects/{key}")
        assert found[key]["snapshot"] == json.loads(single.data)
        assert found[key]["partition"] == 0
        assert found[key]["applied"] == int(single.headers["Effectlog-Applied-Offset"])
        assert found[key]["premises"] == {
            "topic_id": log.identity(), "generation": single.headers["Effectlog-Generation"],
            "judge": worker_fingerprint(), "served_by": node.url}
    assert found["agent:nope:x:y"]["snapshot"] is None


def test_the_judge_refuses_bad_questions_and_unknown_fingerprints(
        node: Node, http: urllib3.PoolManager) -> None:
    def post(body: bytes) -> urllib3.BaseHTTPResponse:
        return http.request("POST", f"{node.url}/v1/judge", body=body,
                            headers={"Content-Type": "application/json"})

    for body in (b"{", _judge_body([]), _judge_body([{"key": ""}]),
                 _judge_body([{"key": "k", "written": [[-1, "e"]]}]),
                 json.dumps({"queries": [{"key": "k"}]}).encode()):
        refused = post(body)
        assert refused.status == 400 and json.loads(refused.data)["error"], body
    unknown = post(_judge_body([{"key": _key(0)}], judge="0123456789abcdef"))
    assert unknown.status == 409 and json.loads(unknown.data)["reason"] == "cannot_judge"
    with pytest.raises(CannotJudge, match="cannot judge"):
        ClusterJudge(node.url, fingerprint="0123456789abcdef").ask([Query(_key(0))])


def test_questions_from_many_threads_share_requests_and_match_single_ones(node: Node) -> None:
    judge = ClusterJudge(node.url)  # shared by the threads, as a process's workers share it
    keys = [_key(i % 5) for i in range(400)] + ["agent:nope:x:y"] * 40
    answers: dict[int, object] = {}

    def read(start: int) -> None:
        for i in range(start, len(keys), 8):
            answers[i] = judge.ask([Query(keys[i])])[0].snapshot

    threads = [threading.Thread(target=read, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive()
    assert judge.batched > 0
    single = StateClient(node.url)
    for i, key in enumerate(keys):
        assert answers[i] == single.get(key).snapshot
    for client in (judge, single):
        client.close()
