"""The crash scenarios, each a function of an :class:`Env` so it runs on any log backend.

Every scenario drives real worker processes (killed, frozen, duplicated), settles the
effect by provider lookup per the recovery table, and asserts one logical provider
effect per operation (the provider does not deduplicate, so a second dispatch would
count as a second execution).
"""

from __future__ import annotations

from consumers.policy import ApprovalPolicy
from consumers.table import Action, Facts, decide
from effectlog.machine import fold
from effectlog.model import State, Transition
from tests.crash.harness import Env, Job, actions, provider_result

#: The kill points: the key's state the kill leaves behind, what the next delivery of the
#: job (a replacement worker) does with it (exit code, status), and what recovery does
#: with the state left behind (the recovery table's row; None: nothing is stuck).
KILL_POINTS: dict[str, tuple[State, int, str, Action | None]] = {
    "after_create": (State.CREATED, 0, "succeeded", None),
    "after_reserve": (State.RESERVED, 0, "succeeded", Action.DISPATCH),
    "after_dispatch": (State.DISPATCHED, 5, "in_doubt", Action.DISPATCH),  # not found
    "after_provider_call": (State.DISPATCHED, 5, "in_doubt", Action.RECORD),  # confirmed
    "after_record": (State.SUCCEEDED, 0, "succeeded", None),
}


def kill_at(env: Env, point: str, *, recovery_first: bool = False) -> None:
    """SIGKILL a worker at ``point``; a replacement worker and recovery finish the job.

    ``recovery_first``: recovery settles the key before the job is re-delivered.
    """
    job = Job(f"kill-{point.replace('_', '-')}")
    left, code, status, row = KILL_POINTS[point]
    env.crash(job, point)
    crashed = env.current(job.key)
    assert crashed is not None and crashed.state is left, crashed
    lookup = env.provider.lookup(job.key)
    expected = decide(Facts(state=left, lookup=lookup.status, lookup_complete=True))
    assert row is None or expected.action is row, (expected, row)

    if recovery_first:
        handled = env.settle()
        replacement = env.run(job)
        assert (replacement[0], replacement[1]["status"]) == (0, "succeeded"), replacement
    else:
        replacement = env.run(job)
        assert replacement[0] == code and replacement[1]["status"] == status, replacement
        handled = env.settle()
    settled = [a for a in actions(handled, job.key) if a not in (Action.SKIP, Action.WAIT)]
    if left in (State.RESERVED, State.DISPATCHED) and (recovery_first or left is State.DISPATCHED):
        assert settled == [expected.action], (settled, expected)  # the recovery table's row
    else:
        assert settled == [], settled  # the replacement worker finished it

    final = env.current(job.key)
    assert final is not None and final.state is State.SUCCEEDED, final
    assert final.outcome is not None and final.outcome.result == provider_result(env, job.key)
    assert env.provider.executions(job.key) == 1  # one logical effect
    assert env.provider.calls(job.key) == 1       # and nothing was ever sent twice
    again = env.run(job)  # the queue delivers the job once more: the original result
    assert again == (0, {"event": "done", "status": "succeeded", "result": final.outcome.result})
    assert env.provider.calls(job.key) == 1


def timeout_after_accept(env: Env) -> None:
    """The provider performs the call, then times out: UNKNOWN, reconciled by lookup."""
    job = Job("timeout-after-accept", "ticket.create", "jira:OPS", {"title": "disk full"})
    env.provider.inject_timeout_after_accept(1)
    code, done = env.run(job)
    assert (code, done["status"]) == (6, "provider_error"), done
    assert done["errors"][0]["type"] == "ProviderTimeout"
    assert env.current(job.key).state is State.UNKNOWN  # type: ignore[union-attr]
    code, done = env.run(job)  # the queue retries the failed job: it is in doubt, not re-run
    assert (code, done["status"]) == (5, "in_doubt")
    handled = env.settle()
    assert actions(handled, job.key) == [Action.RECORD]
    final = env.current(job.key)
    assert final is not None and final.state is State.SUCCEEDED
    assert final.outcome is not None and final.outcome.source == "lookup"
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)


def stale_dispatch(env: Env) -> None:
    """A worker frozen after DISPATCH wakes up after the reconciler re-dispatched under a
    higher epoch: the provider refuses its call, and its UNKNOWN write is refused too (never
    written on SQLite, rejected by the projector on Kafka)."""
    job = Job("stale-dispatch", "deploy.release", "deploy:billing@prod", {"version": "2.4.1"})
    first = env.worker(job, pause_at="after_dispatch")
    assert first.wait_paused("after_dispatch")["epoch"] == 1
    first.freeze()
    handled = env.settle()  # not found, lookup complete: re-dispatch with the original key
    assert actions(handled, job.key) == [Action.DISPATCH]
    settled = env.current(job.key)
    assert settled is not None and settled.state is State.SUCCEEDED and settled.fencing_epoch == 2
    first.thaw()
    code, done = first.finish()
    assert (code, done["status"]) == (3, "conflict"), done
    assert "FencedByProvider" in {e["type"] for e in done["errors"]}
    _assert_nothing_accepted_after_takeover(env, job, first.worker_id)
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 2)
    assert env.current(job.key) == settled


def stale_record(env: Env) -> None:
    """A worker frozen after DISPATCH wakes up after the reconciler claimed the key (epoch 2,
    UNKNOWN: the provider's lookup is incomplete); its call lands once, its RECORD is fenced
    as stale_epoch, and the reconciler records the one effect by lookup."""
    job = Job("stale-record", "email.send", "mailto:cfo@example.com", {"subject": "Q3"})
    first = env.worker(job, pause_at="after_dispatch")
    first.wait_paused("after_dispatch")
    first.freeze()
    handled = env.settle_pass()  # not found, lookup incomplete: UNKNOWN under a new epoch
    assert actions(handled, job.key) == [Action.MARK_UNKNOWN]
    claimed = env.current(job.key)
    assert claimed is not None and (claimed.state, claimed.fencing_epoch) == (State.UNKNOWN, 2)
    first.thaw()
    code, done = first.finish()
    assert (code, done["status"]) == (3, "conflict"), done
    assert "stale_epoch" in {e["reason"] for e in done["errors"]}, done
    _assert_nothing_accepted_after_takeover(env, job, first.worker_id)
    handled = env.settle()
    assert actions(handled, job.key)[0] is Action.RECORD
    final = env.current(job.key)
    assert final is not None and final.state is State.SUCCEEDED
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)


def _assert_nothing_accepted_after_takeover(env: Env, job: Job, stale_worker: str) -> None:
    """Every write of the stale worker after the takeover is refused: on SQLite its
    conditional append fails, so none is written; on Kafka its record is judged after it
    lands, so it may be in the log, and the projector rejects it (a lower epoch)."""
    history = env.history(job.key)
    takeover = next(i for i, e in enumerate(history) if e.transition is Transition.CLAIM)
    _, rejected = fold(history)
    refused = {event.event_id for event, _ in rejected}
    stale = [e for e in history[takeover:] if e.worker_id == stale_worker]
    assert all(e.event_id in refused for e in stale), \
        [(e.transition.value, e.worker_id, e.fencing_epoch) for e in history]


def duplicate_sequential(env: Env) -> None:
    """The queue delivers a finished job again: the original result, no second call."""
    job = Job("dup-sequential", "ticket.create", "jira:SUP", {"title": "refund #8812"})
    first = env.run(job)
    second = env.run(job)
    assert first[0] == second[0] == 0 and first[1]["result"] == second[1]["result"]
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)


def duplicate_concurrent(env: Env, copies: int = 4) -> None:
    """The same job delivered to several workers at once, released together: one effect."""
    job = Job("dup-concurrent", "payment.charge", "stripe:cus_4411",
              {"amount_cents": 1999, "currency": "EUR"})
    procs = [env.worker(job, pause_at="after_create") for _ in range(copies)]
    # A copy that loses the race to create the effect ends at once; the others wait.
    paused = [proc for proc in procs if (proc.wait_line() or {}).get("event") == "paused"]
    assert paused, "no copy got past create"
    for proc in paused:
        proc.release()
    results = [proc.finish() for proc in procs]
    codes = sorted(code for code, _ in results)
    assert set(codes) <= {0, 3, 5} and 0 in codes, results
    env.settle()
    final = env.current(job.key)
    assert final is not None and final.state is State.SUCCEEDED
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)


def payload_mismatch(env: Env) -> None:
    """Same key, another payload: rejected (exit 3) with nothing appended and no effect,
    both while the original is in flight and after it finished."""
    job = Job("mismatch", "payment.charge", "stripe:cus_7000", {"amount_cents": 500})
    forged = job.with_payload({"amount_cents": 50_000})
    env.crash(job, "after_reserve")
    before = len(env.history(job.key))
    code, done = env.run(forged)
    assert (code, done["status"]) == (3, "conflict")
    assert done["errors"][0]["type"] == "PayloadMismatch"
    assert len(env.history(job.key)) == before and env.provider.calls(job.key) == 0
    assert env.run(job)[0] == 0
    code, done = env.run(forged)
    assert (code, done["errors"][0]["type"]) == (3, "PayloadMismatch")
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)


def lookup_outage(env: Env) -> None:
    """Provider lookup down for two lookups: DISPATCHED -> UNKNOWN -> AWAITING_APPROVAL,
    then recorded by lookup once it answers again, never re-dispatched."""
    job = Job("lookup-outage", "email.send", "mailto:ann@example.com", {"subject": "welcome"})
    env.crash(job, "after_provider_call")
    env.provider.inject_lookup_outage(2, key=job.key)
    states = []
    for _ in range(3):
        env.settle_pass()
        states.append(env.current(job.key).state)  # type: ignore[union-attr]
    assert states == [State.UNKNOWN, State.AWAITING_APPROVAL, State.SUCCEEDED]
    assert (env.provider.executions(job.key), env.provider.calls(job.key)) == (1, 1)


def approval(env: Env, kind: str, decision: str) -> None:
    """An UNKNOWN browser or payment action whose lookup does not answer waits for a person,
    even under an auto-retry policy that does retry an UNKNOWN email; ``effectlog approve``
    then settles it: retry -> exactly one effect, abandon -> none."""
    target = {"browser.click": "https://shop.example.com/orders/77#confirm",
              "payment.charge": "stripe:cus_9001"}[kind]
    job = Job(f"approve-{kind.replace('.', '-')}-{decision}", kind, target, {"step": 1})
    control = Job(f"control-{kind.replace('.', '-')}-{decision}")  # email.send
    policy = ApprovalPolicy(auto_retry=("browser.", "payment.", "email."))
    for each in (job, control):
        env.provider.inject_execute_outage(1)  # the call fails before the provider acts
        code, done = env.run(each)
        assert (code, done["errors"][0]["type"]) == (6, "ProviderUnavailable"), done
        assert env.current(each.key).state is State.UNKNOWN  # type: ignore[union-attr]
        env.provider.inject_lookup_outage(1000, key=each.key)
    handled = env.settle(policy)
    assert actions(handled, job.key) == [Action.AWAIT_APPROVAL, Action.WAIT]
    assert actions(handled, control.key) == [Action.POLICY_RETRY]
    assert env.current(job.key).state is State.AWAITING_APPROVAL  # type: ignore[union-attr]
    assert env.provider.calls(job.key) == 0  # never auto-retried
    assert env.current(control.key).state is State.SUCCEEDED  # type: ignore[union-attr]

    approved = env.cli("approve", job.key, "--decision", decision, "--by", "alice",
                       "--reason", "checked with the customer")
    assert approved.returncode == 0, approved.stderr
    rows = env.settle_cli()
    final = env.current(job.key)
    assert final is not None and final.approval is not None and final.approval.by == "alice"
    if decision == "retry":  # the decision's own command, and recovery's, found it moved on
        assert [r["action"] for r in rows
                if r["idempotency_key"] == job.key and r["action"] != "skip"] == ["dispatch"]
        assert final.state is State.SUCCEEDED and env.provider.executions(job.key) == 1
    else:
        assert [r for r in rows if r["idempotency_key"] == job.key] == []
        assert final.state is State.ABANDONED and env.provider.calls(job.key) == 0
    assert env.provider.executions(control.key) == 1
