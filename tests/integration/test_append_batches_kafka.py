"""``effectlog append`` on Kafka goes through the judge of ``serve``, in batches, and gives the
line-by-line results of SQLite: a line is printed only once the judge accepted its event."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster_support import Serve, wait_until

pytestmark = pytest.mark.kafka


@pytest.fixture
def judge(kafka_url: str, tmp_path: Path) -> Iterator[Serve]:
    node = Serve(tmp_path, "judge", kafka_url, None)
    try:
        wait_until(lambda: len(node.serving()) == 6, 60, "serve serves every partition")
        yield node
    finally:
        node.stop()


def transitions(keys: int, seed: int = 5) -> list[dict[str, object]]:
    """create, reserve, dispatch, record per key, the keys' lines interleaved."""
    rng = random.Random(seed)
    per_key = []
    for k in range(keys):
        base = {"operation_id": f"b-{k}", "kind": "email.send", "target": f"mailto:{k}@x",
                "worker_id": f"w{k % 3}"}
        per_key.append([{**base, "transition": "create", "payload": {"k": k}},
                        {**base, "transition": "reserve"}, {**base, "transition": "dispatch"},
                        {**base, "transition": "record",
                         "outcome": {"status": "succeeded", "result": {"id": k}}}])
    lines = []
    while any(per_key):
        queue = rng.choice([q for q in per_key if q])
        lines.append(queue.pop(0))
    return lines


def append(url: str, lines: list[dict[str, object]],
           *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", url, "append",
                           *args], input="".join(json.dumps(x) + "\n" for x in lines),
                          capture_output=True, text=True, timeout=300)


def shape(out: str) -> list[tuple[object, ...]]:
    rows = [json.loads(line) for line in out.splitlines()]
    return [(r["idempotency_key"], r["transition"], r["state"], r["fencing_epoch"], r["existing"])
            for r in rows]


def test_batched_append_gives_the_results_of_line_by_line(kafka_url: str, tmp_path: Path,
                                                          judge: Serve) -> None:
    lines = transitions(700)  # 2,800 lines: more than one batch
    lines.insert(1500, {**lines[0], "payload": {"k": "other"}})  # a payload mismatch
    on_kafka = append(kafka_url, lines, "--server", judge.url)
    on_sqlite = append(f"sqlite:///{tmp_path}/log.db", lines)
    assert on_kafka.returncode == on_sqlite.returncode == 3, (on_kafka.stderr, on_sqlite.stderr)
    assert on_kafka.stderr == on_sqlite.stderr  # the same one-line error
    assert "line 1501" in on_kafka.stderr
    assert shape(on_kafka.stdout) == shape(on_sqlite.stdout)
    assert len(shape(on_kafka.stdout)) == 1500


def test_append_on_kafka_without_the_judge_is_refused_before_writing(kafka_url: str,
                                                                     judge: Serve) -> None:
    lines = transitions(2)
    for args, problem in (((), "needs the judge: --server URL"),
                          (("--server", judge.url, "--no-verify"), "--no-verify is refused")):
        done = append(kafka_url, lines, *args)
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.count("\n") == 1 and problem in done.stderr, done.stderr
    stats = subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url,
                            "stats", "--json", "--server", judge.url],
                           capture_output=True, text=True, timeout=60)
    assert not any(json.loads(stats.stdout)["states"].values()), stats.stdout  # none written


def test_a_line_the_judge_refused_is_not_printed_as_accepted(kafka_url: str,
                                                            judge: Serve) -> None:
    """The batch plans on a read that is behind the log (another writer's claim came
    between the read and the append): the judge refuses the planned RESERVE, so its line
    fails (exit 3) instead of being printed as accepted."""
    from dataclasses import replace

    from effectlog.cli.append_batch import run_batch
    from effectlog.cli.log_commands import _apply
    from effectlog.errors import Fenced
    from effectlog.judge.client import ClusterJudge
    from effectlog.log import open_log
    from effectlog.worker import Worker
    from tests.judges import LyingJudge

    log = open_log(kafka_url)
    real = ClusterJudge(judge.url)
    try:
        created = Worker(log, "w1", judge=real).create("raced", "email.send", "mailto:r@x", {})
        Worker(log, "other", judge=real).reserve(created.idempotency_key)
        stale = LyingJudge(real, lambda q, a: a if q.written else replace(a, state=created))
        emitted: list[object] = []
        line = {"operation_id": "raced", "kind": "email.send", "target": "mailto:r@x",
                "worker_id": "w1", "transition": "reserve"}
        with pytest.raises(Fenced, match=r"line 7: .*did not accept"):
            run_batch(log, [(7, line)], stale, _apply, lambda e, p: emitted.append(e), 10.0)
        assert emitted == []
    finally:
        real.close()
        log.close()


def test_a_worker_waiting_for_its_answer_gets_it_before_writing_more(kafka_url: str,
                                                                      judge: Serve) -> None:
    """A non-Python worker writes one line, keeps stdin open, and reads the answer before its
    next line: a batch ends when no next line comes (it used to wait for 2,000 lines or EOF)."""
    import os
    import select

    worker = subprocess.Popen([sys.executable, "-m", "effectlog.cli.main", "--log", kafka_url,
                               "append", "--server", judge.url], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert worker.stdin is not None and worker.stdout is not None
    try:
        for line in transitions(1):
            worker.stdin.write(json.dumps(line) + "\n")
            worker.stdin.flush()
            ready, _, _ = select.select([worker.stdout.fileno()], [], [], 30)
            assert ready, f"no answer to {line['transition']} within 30 s, stdin open"
            answer = json.loads(worker.stdout.readline())
            assert answer["transition"] == str(line["transition"]).upper()
        worker.stdin.close()
        assert worker.wait(60) == 0, worker.stderr.read() if worker.stderr else ""
    finally:
        if worker.poll() is None:
            worker.kill()
            os.waitpid(worker.pid, 0)
