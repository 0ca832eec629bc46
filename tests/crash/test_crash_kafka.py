"""The crash matrix on a real Kafka-protocol broker.

Each scenario has its own topics, projection, provider file and `effectlog serve` (the
judge of every write: workers' and the reconciler's), so independent scenarios run side by
side (a few at a time on a small machine), and a failure names its scenario.
"""

from __future__ import annotations

import json
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from consumers.table import Action
from effectlog.log.kafka import KafkaSettings, create_topics
from effectlog.model import State
from tests.cluster_support import Serve, answer, wait_until
from tests.crash import scenarios
from tests.crash.harness import Env, Job, actions
from tests.kafka_broker import KafkaBroker, private_broker

pytestmark = [pytest.mark.crash, pytest.mark.kafka, pytest.mark.timeout(300)]


SIDE_BY_SIDE = 4  # scenarios at once: each runs a serve and worker processes
_SERVES: list[Serve] = []


@pytest.fixture(autouse=True)
def _stop_serves() -> Iterator[None]:
    yield
    while _SERVES:
        _SERVES.pop().stop()


def kafka_env(bootstrap: str, tmp: Path, *, lookup_complete: bool = True,
              timeout_s: float = 10.0, accept_timeout_s: float = 30.0) -> Env:
    """An Env on topics of its own, judged by an `effectlog serve` of its own."""
    url = f"kafka://{bootstrap}?prefix=crash{uuid.uuid4().hex[:10]}&timeout_s={timeout_s}"
    create_topics(KafkaSettings.from_url(url))
    tmp.mkdir(parents=True, exist_ok=True)
    serve = Serve(tmp, "judge", url, None, None, "--stuck-after", "1h")  # the scenarios recover
    _SERVES.append(serve)
    return Env(tmp, url, lookup_complete=lookup_complete, server=serve.url,
               accept_timeout_s=accept_timeout_s)


def _serves_every_partition(server: str | None) -> bool:
    status, body = answer(f"{server}/healthz")
    partitions = body.get("partitions", {}) if isinstance(body, dict) else {}
    return status == 200 and bool(partitions) and set(partitions.values()) == {"serving"}


def run_side_by_side(named: dict[str, Callable[[], None]]) -> None:
    """Run independent scenarios a few at a time; fail with every scenario that failed."""
    with ThreadPoolExecutor(max_workers=SIDE_BY_SIDE) as pool:
        futures = {name: pool.submit(fn) for name, fn in named.items()}
    failed = {name: f.exception() for name, f in futures.items() if f.exception() is not None}
    if failed:
        report = "\n\n".join(f"--- {name} ---\n" + "".join(traceback.format_exception(exc))
                             for name, exc in failed.items() if exc is not None)
        raise AssertionError(f"{len(failed)} of {len(named)} scenarios failed: "
                             f"{', '.join(failed)}\n{report}")


def test_kill_at_every_transition_on_kafka(kafka_bootstrap: str, tmp_path: Path) -> None:
    named: dict[str, Callable[[], None]] = {}
    for point in scenarios.KILL_POINTS:
        env = kafka_env(kafka_bootstrap, tmp_path / point)
        named[point] = partial(scenarios.kill_at, env, point)
    for point in ("after_reserve", "after_provider_call"):
        env = kafka_env(kafka_bootstrap, tmp_path / f"{point}-recovery-first")
        named[f"{point} (recovery first)"] = partial(scenarios.kill_at, env, point,
                                                     recovery_first=True)
    run_side_by_side(named)


def test_faults_stale_workers_duplicates_and_approvals_on_kafka(kafka_bootstrap: str,
                                                               tmp_path: Path) -> None:
    def env(name: str, **kwargs: bool) -> Env:
        return kafka_env(kafka_bootstrap, tmp_path / name, **kwargs)

    run_side_by_side({
        "timeout after accept": partial(scenarios.timeout_after_accept, env("timeout")),
        "stale dispatch": partial(scenarios.stale_dispatch, env("stale-dispatch")),
        "stale record": partial(scenarios.stale_record,
                                env("stale-record", lookup_complete=False)),
        "duplicate, sequential": partial(scenarios.duplicate_sequential, env("dup-seq")),
        "duplicate, concurrent": partial(scenarios.duplicate_concurrent, env("dup-conc")),
        "payload mismatch": partial(scenarios.payload_mismatch, env("mismatch")),
        "lookup outage": partial(scenarios.lookup_outage, env("lookup")),
        "approval: browser retry": partial(scenarios.approval, env("approve-retry"),
                                           "browser.click", "retry"),
        "approval: payment abandon": partial(scenarios.approval, env("approve-abandon"),
                                             "payment.charge", "abandon"),
    })


@pytest.fixture
def own_broker() -> Iterator[KafkaBroker]:
    """An Apache Kafka of this test's own, so pausing it disturbs no other test."""
    with private_broker() as broker:
        yield broker


def test_broker_unavailable_during_recovery_on_kafka(own_broker: KafkaBroker,
                                                    tmp_path: Path) -> None:
    env = kafka_env(own_broker.bootstrap, tmp_path, timeout_s=3.0, accept_timeout_s=5.0)
    job = Job("broker-outage", "email.send", "mailto:bob@example.com", {"subject": "receipt"})
    env.crash(job, "after_provider_call")
    assert env.cli("project", "--once", "--quiet").returncode == 0
    before = [e.event_id for e in env.history(job.key)]

    own_broker.pause()  # SIGSTOP: the broker hangs, answering nothing
    try:
        for args in (("project", "--once", "--quiet"),
                     ("recover", "--once", "--stuck-after", "0s", "--command-timeout", "0s"),
                     ("reconcile", "--once", "--provider", env.provider_spec, "--server", str(env.server))):
            done = env.cli(*args)
            assert done.returncode == 4, (args, done.returncode, done.stderr)
            assert "error: " in done.stderr
        code, result = env.run(job)  # the job queue retries the job meanwhile
        assert (code, result["status"]) == (4, "unavailable")
    finally:
        own_broker.resume()
    # A broker stopped past its session is fenced by its controller; once it runs again it
    # takes a while (15-20 s here, longer on a loaded machine) to lead its partitions again,
    # and serve's member rejoins after that: recovery below asks serve's judge.
    serve = _SERVES[-1]
    wait_until(lambda: _serves_every_partition(env.server), 120, "serve serves again",
               lambda: f"healthz: {answer(f'{env.server}/healthz')}, serve's exit code: "
                       f"{serve.process.poll()}\n--- serve's log ---\n"
                       f"{serve.tail()}\n--- the broker's log ---\n{own_broker.output(4000)}")
    assert env.provider.calls(job.key) == 1
    assert [e.event_id for e in env.history(job.key)] == before  # nothing written meanwhile

    # The failed pass undid its ledger entry when the append had no delivery report, so the
    # first pass after the outage issues the command at once ...
    done = env.cli("recover", "--once", "--json", "--stuck-after", "0s", "--command-timeout", "0s")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert len(report["issued"]) == 1, report
    handled = env.settle()  # ... and it is settled by lookup, not re-sent
    assert [a for a in actions(handled, job.key) if a is not Action.SKIP] == [Action.RECORD]
    final = env.current(job.key)
    assert final is not None and final.state is State.SUCCEEDED
    assert env.run(job)[0] == 0
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)
