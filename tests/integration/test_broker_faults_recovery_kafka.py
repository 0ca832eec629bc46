"""Apache Kafka SIGSTOPped and resumed, or SIGKILLed and restarted, while effects are stuck
(RESERVED, DISPATCHED, UNKNOWN) and ``serve``'s recovery and reconciler loops work on them.

While the broker is away the CLI's recovery and log commands (``recover``, ``reconcile``,
``project``, ``history``, ``stats --server``) exit 4 with one ``error:`` line within their
timeout and create nothing, and so does ``get --server`` once serve's group session lapsed;
``get`` on a local projection answers, as it needs no broker. Once
it is back recovery settles every effect with one provider call each and one recorded outcome
each, and a second recoverer (the CLI) finds nothing left to do.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from consumers.providers.fake import FakeProvider
from effectlog.codec import event_codec
from effectlog.errors import BackendUnavailable
from effectlog.log import EVENTS, open_log
from effectlog.log.kafka import KafkaSettings
from effectlog.log.kafka.admin import topic_id
from effectlog.log.kafka.group import GroupMembership, GroupSettings
from effectlog.machine import advance, new_effect
from effectlog.model import State
from effectlog.model import Transition as T
from effectlog.view import decode_events
from tests.broker_faults import (
    FAULTS,
    TIMEOUT_S,
    assert_unavailable,
    broker_away,
    cli,
    equals_clean_rebuild,
    fault_url,
    lag_is_zero,
)
from tests.cluster_support import Serve, answer, wait_until
from tests.kafka_broker import KafkaBroker

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(240)]
PARTITIONS = 2
#: A CLI command's bound while the broker is away: its waits on the broker (TIMEOUT_S each,
#: a few in a row), plus the interpreter's start.
CLI_BOUND_S = 4 * TIMEOUT_S + 4
#: Reads through serve (`--server`) wait and retry a 503 for at most `--timeout` seconds
#: (a request, then its retries); before that was honoured they took 13 s here.
SERVER_TIMEOUT_S = 1.5
SERVER_BOUND_S = 2 * SERVER_TIMEOUT_S + 6
STUCK = ("reserved", "dispatched", "unknown")
STUCK_AFTER_S = 4


def _stuck_effects(url: str, provider: Path) -> list[str]:
    """Effects a crashed worker left behind, written as it wrote them: RESERVED (crashed
    before the call), DISPATCHED and UNKNOWN (the provider performed the call)."""
    codec = event_codec()
    fake = FakeProvider(provider)
    keys = []
    with open_log(url) as log:
        for n, kind in enumerate(STUCK * 2):
            create = new_effect(f"stuck{n}", "email.send", f"mailto:s{n}@example.com",
                                {"n": n}, "crashed")
            events = [create, advance(create, T.RESERVE, "crashed")]
            if kind != "reserved":
                events.append(advance(events[-1], T.DISPATCH, "crashed"))
                fake.execute(create.target, create.payload_hash, create.idempotency_key,
                             events[-1].fencing_epoch, {"n": n})
            if kind == "unknown":
                events.append(advance(events[-1], T.UNKNOWN, "crashed", error="timed out"))
            log.append_many(EVENTS, [(create.idempotency_key, codec.encode(e.to_record()))
                                     for e in events])
            keys.append(create.idempotency_key)
    fake.close()
    return keys


def _outcomes(url: str, key: str) -> list[State]:
    with open_log(url, create=False) as log:
        return [e.state for e in decode_events(log, key) if e.state.terminal]


@pytest.mark.parametrize("fault", FAULTS)
def test_recovery_and_read_commands_through_a_broker_fault(fault_broker: KafkaBroker,
                                                            fault: str, tmp_path: Path) -> None:
    url = fault_url(fault_broker, PARTITIONS)
    provider = tmp_path / "provider.db"
    spec = f"fake:///{provider}"
    state = str(tmp_path / "cli-state")
    # Effects count as stuck 4 s after their last transition: after the fault has begun.
    serve = Serve(tmp_path, "s", url, provider, None, "--stuck-after", f"{STUCK_AFTER_S}s")
    try:
        wait_until(lambda: len(serve.serving()) == PARTITIONS, 60, "serve serves")
        t0 = time.monotonic()
        keys = _stuck_effects(url, provider)
        written = time.monotonic()
        assert cli("--log", url, "--state", state, "project", "--once", "--quiet").code == 0
        wait_until(lambda: lag_is_zero(serve, PARTITIONS), 30, "serve projected them")
        nowhere = tmp_path / "no-state"
        print(f"{fault}: stuck effects projected after {time.monotonic() - t0:.1f}s")
        with broker_away(fault_broker, fault):
            # Past --stuck-after, serve's recovery passes find them and fail; then its group
            # session lapses and it holds no partition, so `get --server` answers 503 (exit
            # 4) rather than vouch for a partition another member may own by now.
            time.sleep(max(0.0, written + STUCK_AFTER_S + 1.5 - time.monotonic()))
            wait_until(lambda: not serve.serving(), 30, "serve let its partitions go")
            on_state = ("--log", url, "--state", state)
            server = ("--timeout", f"{SERVER_TIMEOUT_S:g}")
            commands = {
                "recover": (*on_state, "recover", "--once", "--stuck-after", "0s",
                            "--command-timeout", "0s"),
                "reconcile": (*on_state, "reconcile", "--once", "--provider", spec,
                              "--server", serve.url),
                "project": (*on_state, "project", "--once", "--quiet"),
                "history": (*on_state, "history", keys[1]),
                "history, no state": ("--log", url, "--state", str(nowhere), "history", keys[1]),
                "stats --server": (*server, "stats", "--server", serve.url),
                "get --server": (*server, "get", keys[1], "--server", serve.url),
            }
            with ThreadPoolExecutor(len(commands)) as pool:
                runs = dict(zip(commands, pool.map(lambda a: cli(*a), commands.values()),
                                strict=True))
            print(f"{fault}: {({w: round(r.elapsed_s, 1) for w, r in runs.items()})}")
            for what, run in runs.items():
                assert_unavailable(run, SERVER_BOUND_S if "server" in what else CLI_BOUND_S,
                                   what)
            # A local projection needs no broker: `get` shows what it applied.
            got = cli("--log", url, "--state", state, "get", keys[1], "--json")
            # (DISPATCHED, or SUCCEEDED when serve's own recovery settled it before the local
            # projection ran: on a loaded machine the setup can outlast --stuck-after)
            assert got.code == 0 and json.loads(got.stdout)["state"] in (
                "DISPATCHED", "SUCCEEDED"), got
            assert serve.process.poll() is None, serve.err_path.read_text()[-2000:]
        assert not nowhere.exists()
        print(f"{fault}: broker back after {time.monotonic() - t0:.1f}s")

        def state_of(key: str) -> str | None:
            status, body = answer(f"{serve.url}/v1/effects/{key}?fresh=1")
            return str(body["state"]) if status == 200 else None

        wait_until(lambda: all(state_of(k) == "SUCCEEDED" for k in keys), 60,
                   "recovery settled every effect")
        wait_until(lambda: lag_is_zero(serve, PARTITIONS), 30, "lag back to 0")
        print(f"{fault}: settled after {time.monotonic() - t0:.1f}s")
        # The CLI's own recoverer, run now, finds nothing left to issue or apply.
        assert cli("--log", url, "--state", state, "project", "--once", "--quiet").code == 0
        for args in (("recover", "--once", "--json", "--stuck-after", "0s"),
                     ("reconcile", "--once", "--provider", spec, "--server", serve.url)):
            done = cli("--log", url, "--state", state, *args)
            assert done.code == 0, (args, done.stderr)
        fake = FakeProvider(provider)
        try:
            assert {fake.calls(k) for k in keys} == {1}
            assert {fake.executions(k) for k in keys} == {1}
        finally:
            fake.close()
        assert {k: _outcomes(url, k) for k in keys} == {k: [State.SUCCEEDED] for k in keys}
    finally:
        errors = serve.stop()
    assert "Traceback" not in errors, errors[-3000:]
    assert serve.process.returncode == 0, errors[-2000:]
    equals_clean_rebuild(url, serve.state_dir, tmp_path / "clean")


def test_identity_and_group_checks_call_a_paused_broker_unavailable(
        fault_broker: KafkaBroker) -> None:
    """What serve's log-watch and membership loops ask every few seconds: while the broker
    answers nothing, ``topic_id`` raises BackendUnavailable (it raised a bare TimeoutError,
    which stopped serve) and a group refresh keeps the last answer; both answer again after."""
    url = fault_url(fault_broker, PARTITIONS)
    settings = KafkaSettings.from_url(url)
    name = settings.topic(EVENTS)
    known = topic_id(settings, name)
    membership = GroupMembership(settings, GroupSettings(f"{settings.prefix}.g", "http://m"),
                                 min_interval_s=0)
    membership.refresh()
    with broker_away(fault_broker, "pause"):
        started = time.monotonic()
        with pytest.raises(BackendUnavailable):
            topic_id(settings, name)
        membership.refresh()  # logged, not raised
        assert time.monotonic() - started < 4 * TIMEOUT_S
        assert membership.members() == ["http://m"]
    def answers() -> bool:
        try:
            return topic_id(settings, name) == known
        except BackendUnavailable:  # a broker just resumed may answer its backlog first
            return False

    wait_until(answers, 20, "the topic ID is read again")
    wait_until(lambda: membership.refresh() is None and membership._admin is not None, 20,
               "the group is described again")
