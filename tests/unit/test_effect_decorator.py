"""@effectlog.effect and effectlog.run: stable operation ids, replay, in-doubt, secrets."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import effectlog
from effectlog.agent import EffectAbandoned, current_call
from effectlog.errors import InvalidInput, PayloadMismatch
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.model import State
from effectlog.provider import ProviderFailed
from effectlog.worker import AsyncWorker, EffectInDoubt, Worker

sent: list[dict[str, Any]] = []


@effectlog.effect("email.send", target=lambda to, **_: f"mailto:{to}")
def send_email(to: str, subject: str, body: str = "") -> dict[str, Any]:
    sent.append({"to": to, "subject": subject})
    return {"message_id": f"m-{len(sent)}", "pair": (1, 2)}


@effectlog.effect("email.send", target=lambda to, **_: f"mailto:{to}")
async def send_email_async(to: str, subject: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    sent.append({"to": to, "subject": subject})
    return {"message_id": f"m-{len(sent)}"}


@pytest.fixture(autouse=True)
def reset_sent() -> None:
    sent.clear()


@pytest.fixture
def log(tmp_path: Path) -> EventLog:
    return open_log(f"sqlite:///{tmp_path}/log.db")


def keys(log: EventLog) -> list[str]:
    return sorted({r.key for r in log.scan(EVENTS, 0)})


def test_calls_in_a_run_are_numbered_per_kind_and_target(log: EventLog) -> None:
    with effectlog.run("job-1", worker=Worker(log, "w1")):
        send_email("ann@example.com", "hello")
        send_email("bob@example.com", "hello")
        send_email("ann@example.com", "again")
    assert keys(log) == ["agent:job-1.1:email.send:mailto:ann@example.com",
                         "agent:job-1.1:email.send:mailto:bob@example.com",
                         "agent:job-1.2:email.send:mailto:ann@example.com"]
    created = Worker(log, "r").history("agent:job-1.2:email.send:mailto:ann@example.com")[0]
    assert json.loads(created.payload or b"") == {"to": "ann@example.com", "subject": "again",
                                                  "body": ""}


def test_a_restarted_run_making_the_same_calls_replays_without_calling(log: EventLog) -> None:
    with effectlog.run("job-2", worker=Worker(log, "w1")):
        first = [send_email("ann@example.com", "a"), send_email("ann@example.com", "b")]
    with effectlog.run("job-2", worker=Worker(log, "w2")):  # the restarted job
        again = [send_email("ann@example.com", "a"), send_email("ann@example.com", "b")]
    assert len(sent) == 2
    assert first == again == [{"message_id": "m-1", "pair": [1, 2]},
                              {"message_id": "m-2", "pair": [1, 2]}]


def test_a_restarted_run_that_changes_a_call_is_refused_not_replayed(log: EventLog) -> None:
    with effectlog.run("job-3", worker=Worker(log, "w1")):
        send_email("ann@example.com", "invoice 1")
    with effectlog.run("job-3", worker=Worker(log, "w2")), pytest.raises(PayloadMismatch):
        send_email("ann@example.com", "invoice 2")
    assert len(sent) == 1


def test_an_effect_in_doubt_raises_with_its_key_and_never_reruns(log: EventLog) -> None:
    worker = Worker(log, "crashed")
    key = "agent:job-4.1:email.send:mailto:ann@example.com"
    worker.create("job-4.1", "email.send", "mailto:ann@example.com",
                  {"to": "ann@example.com", "subject": "s", "body": ""})
    worker.reserve(key)
    worker.dispatch(key)  # the process died during the call
    with effectlog.run("job-4", worker=Worker(log, "w2")), pytest.raises(EffectInDoubt) as info:
        send_email("ann@example.com", "s")
    assert info.value.key == key and sent == []


def test_failed_and_abandoned_effects_replay_as_refusals(log: EventLog) -> None:
    @effectlog.effect("payment.charge", target="stripe:cus_1")
    def charge(amount: int) -> None:
        sent.append({"amount": amount})
        raise ProviderFailed("card declined", {"code": "declined"})

    worker = Worker(log, "w1")
    with effectlog.run("job-5", worker=worker):
        with pytest.raises(ProviderFailed):
            charge(10)
        key = "agent:job-5.2:payment.charge:stripe:cus_1"
        worker.create("job-5.2", "payment.charge", "stripe:cus_1", {"amount": 20})
        worker.reserve(key)
        worker.dispatch(key)
        worker.unknown(key, "timed out")
        worker.approve(key, "abandon", "alice", "customer cancelled")
    with effectlog.run("job-5", worker=Worker(log, "w2")):
        with pytest.raises(ProviderFailed) as failed:
            charge(10)
        with pytest.raises(EffectAbandoned, match="alice"):
            charge(20)
    assert failed.value.result == {"code": "declined"} and sent == [{"amount": 10}]


def test_a_pinned_operation_id_needs_no_run_numbering(log: EventLog, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    @effectlog.effect("ticket.create", target="jira:OPS")
    def open_ticket(title: str, operation_id: str) -> str:
        return f"{operation_id}: {title}"

    with effectlog.run("job-6", worker=Worker(log, "w1")):
        send_email("ann@example.com", "x", operation_id="order-1042")
        send_email("ann@example.com", "y")  # the run's numbering is not consumed by a pin
        assert open_ticket("disk full", operation_id="inc-7") == "inc-7: disk full"
    monkeypatch.setenv("EFFECTLOG_LOG", f"sqlite:///{tmp_path}/log.db")
    assert open_ticket("disk full", operation_id="inc-7") == "inc-7: disk full"  # no run: env log
    assert keys(log) == ["agent:inc-7:ticket.create:jira:OPS",
                         "agent:job-6.1:email.send:mailto:ann@example.com",
                         "agent:order-1042:email.send:mailto:ann@example.com"]
    with pytest.raises(InvalidInput, match="outside effectlog"):
        send_email("ann@example.com", "z")


def test_an_operation_id_derived_from_an_argument_and_excluded_arguments(log: EventLog) -> None:
    @effectlog.effect("email.send", target=lambda to, **_: f"mailto:{to}",
                      operation_id=lambda tool_call_id, **_: tool_call_id,
                      exclude=("tool_call_id", "client"))
    def tool(to: str, tool_call_id: str, client: object) -> str:
        sent.append({"to": to})
        return "sent"

    with effectlog.run("job-7", worker=Worker(log, "w1")):
        tool("ann@example.com", "call_abc", object())
        tool("ann@example.com", "call_abc", object())  # another client object: same effect
    key = "agent:call_abc:email.send:mailto:ann@example.com"
    assert keys(log) == [key] and len(sent) == 1
    assert json.loads(Worker(log, "r").history(key)[0].payload or b"") == {"to": "ann@example.com"}


def test_secret_arguments_bind_the_effect_but_stay_off_the_log(log: EventLog) -> None:
    @effectlog.effect("payment.charge", target=lambda customer, **_: f"stripe:{customer}",
                      secret=("card_number",))
    def charge(customer: str, amount: int, card_number: str) -> str:
        return "charged"

    with effectlog.run("job-8", worker=Worker(log, "w1")):
        charge("cus_1", 10, "4242424242424242")
    raw = b"".join(r.value for r in log.scan(EVENTS, 0))
    created = Worker(log, "r").history("agent:job-8.1:payment.charge:stripe:cus_1")[0]
    assert b"4242424242424242" not in raw
    assert created.payload is None and created.payload_ref == "withheld:card_number"
    with effectlog.run("job-8", worker=Worker(log, "w2")), pytest.raises(PayloadMismatch):
        charge("cus_1", 10, "5555555555554444")  # another card is another effect


def test_current_call_hands_the_key_and_epoch_to_the_provider(log: EventLog) -> None:
    @effectlog.effect("email.send", target="mailto:ann@example.com")
    def send() -> dict[str, Any]:
        call = current_call()
        return {"key": call.key, "epoch": call.fencing_epoch}

    with effectlog.run("job-9", worker=Worker(log, "w1")):
        assert send() == {"key": "agent:job-9.1:email.send:mailto:ann@example.com", "epoch": 1}
    with pytest.raises(LookupError):
        current_call()


def test_a_result_that_is_not_json_leaves_the_effect_unknown(log: EventLog) -> None:
    @effectlog.effect("email.send", target="mailto:ann@example.com")
    def send() -> object:
        return object()

    worker = Worker(log, "w1")
    with effectlog.run("job-10", worker=worker), pytest.raises(TypeError, match="JSON"):
        send()
    state = worker.get("agent:job-10.1:email.send:mailto:ann@example.com")
    assert state is not None and state.state is State.UNKNOWN


def test_async_effects_in_concurrent_tasks_share_the_run(log: EventLog) -> None:
    async def main() -> list[Any]:
        async with AsyncWorker(log, "w1") as worker, effectlog.run("job-11", worker=worker):
            return await asyncio.gather(*(send_email_async(f"u{i}@example.com", "hi")
                                          for i in range(10)),
                                        send_email_async("u0@example.com", "second"))

    results = asyncio.run(main())
    assert len(results) == 11 and len(sent) == 11
    assert "agent:job-11.2:email.send:mailto:u0@example.com" in keys(log)
    assert len(keys(log)) == 11


def test_runs_without_a_worker_open_the_env_log(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EFFECTLOG_LOG", f"sqlite:///{tmp_path}/env.db")

    async def main() -> Any:
        async with effectlog.run("job-12") as active:
            assert isinstance(active.worker, AsyncWorker)
            return await send_email_async("ann@example.com", "hi")

    with effectlog.run("job-12") as active:
        assert isinstance(active.worker, Worker)
        assert send_email("bob@example.com", "hi") == {"message_id": "m-1", "pair": [1, 2]}
    assert asyncio.run(main()) == {"message_id": "m-2"}
    assert active.worker is None  # the run closed what it opened
    assert len(keys(open_log(f"sqlite:///{tmp_path}/env.db"))) == 2


def test_a_sub_run_scopes_ids_and_shares_the_worker(log: EventLog) -> None:
    with effectlog.run("job-13", worker=Worker(log, "w1")):
        send_email("ann@example.com", "top")
        with effectlog.run("branch-a"):
            send_email("ann@example.com", "in a branch")
    assert keys(log) == ["agent:job-13.1:email.send:mailto:ann@example.com",
                         "agent:job-13.branch-a.1:email.send:mailto:ann@example.com"]


def test_a_function_and_worker_of_different_kinds_are_refused_before_writing(
        log: EventLog) -> None:
    async def main() -> None:
        async with AsyncWorker(log, "w1") as worker, effectlog.run("job-14", worker=worker):
            with pytest.raises(TypeError, match=r"must be Worker\(...\), not AsyncWorker"):
                send_email("ann@example.com", "hi")

    asyncio.run(main())
    with effectlog.run("job-14", worker=Worker(log, "w1")), \
            pytest.raises(TypeError, match=r"must be AsyncWorker\(...\)"):
        asyncio.run(send_email_async("ann@example.com", "hi"))
    assert keys(log) == [] and sent == []


def test_decorating_refuses_unknown_argument_names() -> None:
    with pytest.raises(TypeError, match="api_key"):
        effectlog.effect("email.send", target="mailto:a@example.com",
                         secret=("api_key",))(lambda to: None)


def test_import_effectlog_loads_neither_fastavro_nor_click() -> None:
    code = ("import sys, effectlog; print('fastavro' in sys.modules, 'click' in sys.modules);"
            "effectlog.effect; effectlog.run; effectlog.AsyncWorker; effectlog.EffectInDoubt;"
            "print(effectlog.Worker.__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "effectlog.worker.sync"]
