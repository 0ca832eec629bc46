"""Apache Kafka SIGSTOPped and resumed, or SIGKILLed and restarted on its port and data,
while worker processes perform effects through a running ``effectlog serve``.

While the broker is away every perform that fails says so within a bounded time (the log is
unavailable, or the effect is in doubt), ``serve`` keeps running and answers ``?fresh=1`` with
503 rather than with state it cannot vouch for. Once the broker is back: every job is
delivered again until acknowledged, every event a worker was told is durable is in the log,
the fake provider performed each key once, recovery settles what was left, the projection
catches up (lag 0) and equals a clean rebuild.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import urllib3

from consumers.providers.fake import FakeProvider
from tests.broker_faults import (
    FAULTS,
    TIMEOUT_S,
    Feeder,
    broker_away,
    equals_clean_rebuild,
    fault_url,
    lag_is_zero,
    logged_event_ids,
)
from tests.cluster_support import Serve, answer, wait_until
from tests.kafka_broker import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
PARTITIONS = 2
#: The longest a perform may take while the broker is away: the sum of its waits, each
#: TIMEOUT_S-bounded: the fresh read (a request of up to 2 x TIMEOUT_S, its 503 retried for
#: 2 x TIMEOUT_S more), the append's delivery report, the acceptance read. Seen: up to 13.2 s.
PERFORM_BOUND_S = 8 * TIMEOUT_S
STUCK_AFTER = f"{TIMEOUT_S + 3:g}s"  # above the workers' accept timeout (TIMEOUT_S)
PROBE_TIMEOUT_S = 3.0  # a health probe's client timeout (a functional bound)


def _timed(url: str) -> tuple[int, float]:
    started = time.monotonic()
    status, _ = answer(url)
    return status, time.monotonic() - started


def _health_answers_at_once_without_the_log(serve: Serve, since: float) -> None:
    """Alive (200: a liveness probe must not restart serve for an outage it rides out)
    within a probe's timeout (not after the log's own timeout_s), saying why the figures are
    missing, with those read before the outage and their age."""
    probe = urllib3.PoolManager(retries=False, timeout=PROBE_TIMEOUT_S)
    started = time.monotonic()
    reply = probe.request("GET", f"{serve.url}/healthz")  # a timeout raises: the test fails
    took, body = time.monotonic() - started, json.loads(reply.data)
    assert reply.status == 200 and took < PROBE_TIMEOUT_S, (reply.status, took, body)
    assert body["ok"] is True and body["projector_lag"] is None, body
    assert body["log_error"].endswith("; projector lag unknown"), body
    last = body["last_known"]
    assert set(last["log_end_offsets"]) == {str(p) for p in range(PARTITIONS)}, body
    assert isinstance(last["projector_lag"], int), body
    assert last["age_s"] >= time.monotonic() - since - 1.5, body  # read before the outage
    print(f"/healthz during the outage: 200 in {took:.2f}s, {body['log_error']!r}, "
          f"last known {last}")


def _state(serve: Serve, key: str) -> str | None:
    status, body = answer(f"{serve.url}/v1/effects/{key}?fresh=1")
    return str(body["state"]) if status == 200 else None


@pytest.mark.parametrize("fault", FAULTS)
def test_workers_and_serve_through_a_broker_fault(fault_broker: KafkaBroker, fault: str,
                                                  tmp_path: Path) -> None:
    url = fault_url(fault_broker, PARTITIONS)
    provider = tmp_path / "provider.db"
    FakeProvider(provider).close()
    # Recovery waits longer than a worker may wait for its verdict (the rule in
    # docs/agents/worker.md), so a late verdict never meets a reconciler's claim.
    serve = Serve(tmp_path, "s", url, provider, None, "--stuck-after", STUCK_AFTER)
    feeder: Feeder | None = None
    t0 = time.monotonic()
    try:
        wait_until(lambda: len(serve.serving()) == PARTITIONS, 60, "serve serves")
        feeder = Feeder(url, provider, serve.url)
        wait_until(lambda: sum(r.body["status"] == "succeeded" for r in feeder.replies) >= 4,
                   60, "the workers perform")
        key = feeder.key(feeder.replies[0].op)
        with broker_away(fault_broker, fault):
            away = time.monotonic()
            status, took = _timed(f"{serve.url}/v1/effects/{key}?fresh=1&timeout_ms=3000")
            assert status == 503 and took < 2 * TIMEOUT_S + 2, (status, took)
            if fault == "pause":  # the member holds its partitions until its session lapses
                # Without fresh=1 the projection answers as it is (its applied offset in a
                # header); a killed broker's consumer may let them go sooner: then 503.
                assert answer(f"{serve.url}/v1/effects/{key}")[0] == 200
            _health_answers_at_once_without_the_log(serve, since=away)
            wait_until(lambda: {r.worker for r in feeder.replies if r.finished_at > away
                                and r.body["status"] == "error"} == {"w0", "w1"},
                       3 * PERFORM_BOUND_S, "each worker told the log is unavailable")
            assert serve.process.poll() is None, serve.err_path.read_text()[-2000:]
            print(f"{fault}: away for {time.monotonic() - away:.1f}s")
        back = time.monotonic()
        feeder.drain(120)
        print(f"{fault}: drained {time.monotonic() - back:.1f}s after the broker came back")
        during = [r for r in feeder.replies if away <= r.finished_at <= back + PERFORM_BOUND_S]
        print(f"{fault}: {len(feeder.ops)} jobs, {len(feeder.replies)} deliveries, during the "
              f"fault: {sorted((r.body['status'], r.body['elapsed_s']) for r in during)}")
        slow = [(r.op, r.body) for r in feeder.replies if r.body["elapsed_s"] > PERFORM_BOUND_S]
        assert not slow, slow
        statuses = {r.body["status"] for r in feeder.replies}
        assert statuses <= {"succeeded", "error", "in_doubt", "unknown"}, statuses

        # Nothing acknowledged is lost; recovery settles the rest; each key performed once.
        assert feeder.acknowledged_events() - logged_event_ids(url) == set()
        keys = [feeder.key(op) for op in feeder.ops]
        wait_until(lambda: all(_state(serve, k) == "SUCCEEDED" for k in keys), 60,
                   "recovery settled every effect")
        fake = FakeProvider(provider)
        try:
            assert {fake.calls(k) for k in keys} == {1}
            assert {fake.executions(k) for k in keys} == {1}
        finally:
            fake.close()
        wait_until(lambda: lag_is_zero(serve, PARTITIONS), 30, "lag back to 0")
        print(f"{fault}: settled, {time.monotonic() - t0:.1f}s in all")
    finally:
        stopping = time.monotonic()
        worker_errors = feeder.stop() if feeder is not None else ""
        if "most recent call first" in worker_errors:  # a job outlived its bounds: its stacks
            print(worker_errors[-20000:])
        print(f"{fault}: workers stopped in {time.monotonic() - stopping:.1f}s")
        serve_errors = serve.stop()
        print(f"{fault}: serve stopped in {time.monotonic() - stopping:.1f}s")
    assert "Traceback" not in worker_errors, worker_errors[-3000:]
    assert "Traceback" not in serve_errors, serve_errors[-3000:]
    assert serve.process.returncode == 0, serve_errors[-2000:]
    equals_clean_rebuild(url, serve.state_dir, tmp_path / "clean")
