"""The crash matrix on the embedded SQLite log: real worker processes, SIGKILL/SIGSTOP at
every transition boundary, replacement workers, recovery by provider lookup; one logical
provider effect per operation in every case."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from consumers.policy import ApprovalPolicy
from consumers.table import Action
from effectlog.model import State
from projections import open_reader
from tests.crash import scenarios
from tests.crash.harness import Env, Job, actions

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path, f"sqlite:///{tmp_path}/log.db")


@pytest.mark.parametrize("point", list(scenarios.KILL_POINTS))
def test_kill_then_replacement_worker_then_recovery_gives_one_effect(env: Env, point: str) -> None:
    scenarios.kill_at(env, point)


@pytest.mark.parametrize("point", ["after_reserve", "after_dispatch", "after_provider_call"])
def test_kill_then_recovery_before_redelivery_gives_one_effect(env: Env, point: str) -> None:
    scenarios.kill_at(env, point, recovery_first=True)


def test_provider_timeout_after_accept_is_reconciled_not_resent(env: Env) -> None:
    scenarios.timeout_after_accept(env)


def test_stale_worker_dispatch_is_refused_by_the_provider(env: Env) -> None:
    scenarios.stale_dispatch(env)


def test_stale_worker_record_is_fenced_stale_epoch(tmp_path: Path) -> None:
    scenarios.stale_record(Env(tmp_path, f"sqlite:///{tmp_path}/log.db", lookup_complete=False))


def test_duplicate_delivery_after_completion_returns_the_original_result(env: Env) -> None:
    scenarios.duplicate_sequential(env)


def test_concurrent_duplicate_deliveries_give_one_effect(env: Env) -> None:
    scenarios.duplicate_concurrent(env)


def test_payload_mismatch_under_the_same_key_is_rejected_without_effect(env: Env) -> None:
    scenarios.payload_mismatch(env)


def test_lookup_outage_keeps_the_effect_in_doubt_until_lookup_answers(env: Env) -> None:
    scenarios.lookup_outage(env)


@pytest.mark.parametrize("decision", ["retry", "abandon"])
@pytest.mark.parametrize("kind", ["browser.click", "payment.charge"])
def test_unknown_risky_action_waits_for_a_human_decision(env: Env, kind: str,
                                                          decision: str) -> None:
    scenarios.approval(env, kind, decision)


def test_log_unavailable_during_recovery_fails_loudly_then_recovers(env: Env) -> None:
    job = Job("log-outage", "email.send", "mailto:bob@example.com", {"subject": "receipt"})
    env.crash(job, "after_provider_call")
    assert env.cli("project", "--once", "--quiet").returncode == 0
    projected = _projection(env)

    log = env.tmp / "log.db"
    away = env.tmp / "away"
    away.mkdir()
    for path in env.tmp.glob("log.db*"):
        path.rename(away / path.name)
    log.mkdir()  # the log path is there but is no database: every open fails
    try:
        for args in (("project", "--once", "--quiet"),
                     ("recover", "--once", "--stuck-after", "0s"),
                     ("reconcile", "--once", "--provider", env.provider_spec)):
            done = env.cli(*args)
            assert done.returncode == 4, (args, done.returncode, done.stderr)
            assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
        code, result = env.run(job)  # the job queue retries the job meanwhile
        assert (code, result["status"]) == (4, "unavailable")
    finally:
        log.rmdir()
        for path in away.iterdir():
            path.rename(env.tmp / path.name)
    assert _projection(env) == projected  # nothing written anywhere meanwhile
    assert not (env.tmp / "state.consumers").exists()
    assert env.provider.calls(job.key) == 1

    rows = env.settle_cli()
    assert [(r["action"], r["state"]) for r in rows] == [("record", "SUCCEEDED")]
    assert env.run(job)[0] == 0
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)
    shutil.rmtree(away)


def _projection(env: Env) -> tuple[dict[int, int], dict[str, int]]:
    with open_reader(env.state_dir) as reader:
        return reader.next_offsets(), reader.counts()


def test_auto_retry_policy_settles_a_dispatched_effect_when_lookup_is_down(env: Env) -> None:
    job = Job("policy-dispatched")
    env.crash(job, "after_dispatch")
    env.provider.inject_lookup_outage(1000, key=job.key)
    handled = env.settle(ApprovalPolicy(auto_retry=("email.",)))
    assert Action.SKIP not in actions(handled, job.key)
    assert env.current(job.key).state is State.SUCCEEDED  # type: ignore[union-attr]
    assert env.provider.executions(job.key) == 1
