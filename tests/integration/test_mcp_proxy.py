"""``effectlog mcp`` as an agent sees it: the SDK's client in front of a real proxy process,
in front of the counting upstream (:mod:`tests.mcp_upstream`, which performs every call it
receives). Most tests share one proxy served over streamable HTTP; each uses customers,
addresses and keys of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import StdioServerParameters

from effectlog.log import open_log
from effectlog.model import State
from effectlog.view import LogView
from tests.mcp_support import (
    Background,
    StdioProxy,
    agent,
    call_with_key,
    cli,
    meta,
    text,
    upstream_command,
    write_config,
)
from tests.mcp_upstream import calls

pytestmark = pytest.mark.timeout(120)


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.db = tmp / "upstream.db"
        self.log_url = f"sqlite:///{tmp}/log.db"
        self.config = write_config(tmp, self.db)
        self.proxy = Background.proxy(tmp, self.log_url, self.config, "--run-id", "itest")

    def state(self, key: str) -> State | None:
        with open_log(self.log_url) as log:
            current = LogView(log).current(key)
        return current.state if current else None

    def charges(self, customer: str) -> list[dict[str, Any]]:
        return [c for c in calls(self.db, "charge") if c["arguments"]["customer"] == customer]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    w = World(tmp_path_factory.mktemp("mcp"))
    yield w
    w.proxy.stop()


def run(world: World, scenario: Any) -> None:
    async def main() -> None:
        async with agent(world.proxy.url) as client:
            await scenario(client)

    anyio.run(main)


def test_tools_are_listed_as_the_upstream_lists_them(world: World) -> None:
    async def direct() -> list[dict[str, Any]]:
        from mcp import Client

        params = StdioServerParameters(command=upstream_command(world.db)[0],
                                       args=upstream_command(world.db)[1:])
        async with Client(params, cache=None) as client:
            listed = await client.list_tools()
        return [t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools]

    proxied: list[dict[str, Any]] = []

    async def through(client: Any) -> None:
        listed = await client.list_tools()
        proxied.extend(t.model_dump(by_alias=True, exclude_none=True) for t in listed.tools)

    run(world, through)
    assert proxied == anyio.run(direct)
    assert {t["name"] for t in proxied} >= {"charge", "get_balance", "send_email"}


def test_a_read_only_tool_passes_straight_through_every_time(world: World) -> None:
    async def scenario(client: Any) -> None:
        for _ in range(2):
            result = await client.call_tool("get_balance", {"customer": "ro-1"})
            assert result.structured_content == {"customer": "ro-1", "balance": 100}
            assert "effectlog/idempotencyKey" not in meta(result)

    run(world, scenario)
    assert len([c for c in calls(world.db, "get_balance")
                if c["arguments"]["customer"] == "ro-1"]) == 2


def test_a_repeated_sep3182_key_returns_the_recorded_result_without_calling_upstream(
        world: World) -> None:
    answers = []

    async def scenario(client: Any) -> None:
        for _ in range(3):
            answers.append(await call_with_key(client, "charge",
                                               {"customer": "sep-1", "amount": 7}, "sep-key-1"))

    run(world, scenario)
    assert [meta(a)["effectlog/replayed"] for a in answers] == [False, True, True]
    assert {str(a.structured_content) for a in answers} == {str(answers[0].structured_content)}
    assert len(world.charges("sep-1")) == 1
    assert world.state("agent:sep-key-1:payment.charge:customer:sep-1") is State.SUCCEEDED


def test_a_key_in_meta_is_the_clients_key_too(world: World) -> None:
    async def scenario(client: Any) -> None:
        for _ in range(2):
            result = await client.call_tool("charge", {"customer": "sep-2", "amount": 7},
                                            meta={"idempotencyKey": "meta key/2"})
            assert not result.is_error

    run(world, scenario)
    assert len(world.charges("sep-2")) == 1  # a key that is no operation id: used by its hash
    assert world.charges("sep-2")[0]["arguments"]["idempotency_key"].startswith("agent:h-")


def test_the_same_key_with_other_arguments_is_refused_without_calling_upstream(
        world: World) -> None:
    async def scenario(client: Any) -> None:
        await call_with_key(client, "charge", {"customer": "mm-1", "amount": 5}, "mm-key")
        other = await call_with_key(client, "charge", {"customer": "mm-1", "amount": 6}, "mm-key")
        assert other.is_error and text(other).startswith("refused:"), text(other)
        assert "other arguments" in text(other)

    run(world, scenario)
    assert len(world.charges("mm-1")) == 1


def test_an_excluded_argument_is_not_part_of_the_effect(world: World) -> None:
    async def scenario(client: Any) -> None:
        first = await call_with_key(client, "charge",
                                    {"customer": "ex-1", "amount": 5, "note": "a"}, "ex-key")
        again = await call_with_key(client, "charge",
                                    {"customer": "ex-1", "amount": 5, "note": "b"}, "ex-key")
        assert meta(again)["effectlog/replayed"] is True
        assert again.structured_content == first.structured_content

    run(world, scenario)
    assert len(world.charges("ex-1")) == 1


def test_the_key_and_fencing_epoch_reach_the_upstream_as_arguments_and_in_meta(
        world: World) -> None:
    run(world, lambda client: call_with_key(client, "charge", {"customer": "ke-1", "amount": 5},
                                            "ke-key"))
    [received] = world.charges("ke-1")
    key = "agent:ke-key:payment.charge:customer:ke-1"
    assert received["arguments"]["idempotency_key"] == key
    assert received["arguments"]["fencing_epoch"] >= 1
    assert received["meta"]["effectlog/idempotencyKey"] == key
    assert received["meta"]["effectlog/fencingEpoch"] == received["arguments"]["fencing_epoch"]


def test_an_upstream_tool_error_is_recorded_failed_and_given_again(world: World) -> None:
    answers = []

    async def scenario(client: Any) -> None:
        for _ in range(2):
            answers.append(await call_with_key(client, "charge",
                                               {"customer": "fail-1", "amount": 0}, "fail-key"))

    run(world, scenario)
    assert all(a.is_error and "amount must be positive" in text(a) for a in answers)
    assert meta(answers[1])["effectlog/replayed"] is True
    assert world.state("agent:fail-key:payment.charge:customer:fail-1") is State.FAILED
    assert len(world.charges("fail-1")) == 1


def test_the_named_argument_is_the_operation_id(world: World) -> None:
    async def scenario(client: Any) -> None:
        for trace in ("t1", "t2"):  # trace_id is excluded: the same effect
            result = await client.call_tool("send_email", {"to": "op@example.com", "subject": "hi",
                                                           "message_id": "m-1", "trace_id": trace})
            assert meta(result)["effectlog/idempotencyKey"] == \
                "agent:m-1:email.send:mailto:op@example.com"

    run(world, scenario)
    assert len([c for c in calls(world.db, "send_email")
                if c["arguments"]["to"] == "op@example.com"]) == 1


def test_calls_without_a_key_are_numbered_per_kind_and_target_of_the_run(world: World) -> None:
    keys: list[str] = []

    async def scenario(client: Any) -> None:
        run_meta = {"effectlog/runId": "num-1"}
        for to in ("a@example.com", "a@example.com", "b@example.com"):
            result = await client.call_tool("send_email", {"to": to, "subject": "s"},
                                            meta=run_meta)
            keys.append(meta(result)["effectlog/idempotencyKey"])

    run(world, scenario)
    assert keys == ["agent:num-1.1:email.send:mailto:a@example.com",
                    "agent:num-1.2:email.send:mailto:a@example.com",
                    "agent:num-1.1:email.send:mailto:b@example.com"]


def test_a_call_without_its_target_argument_is_refused_before_anything_is_sent(
        world: World) -> None:
    async def scenario(client: Any) -> None:
        result = await client.call_tool("send_email", {"subject": "no address"})
        assert result.is_error and "'to' is needed" in text(result), text(result)

    run(world, scenario)
    assert not [c for c in calls(world.db, "send_email") if c["arguments"]["subject"] == "no address"]


def test_a_hundred_concurrent_calls_from_one_session_are_each_performed_once(
        world: World) -> None:
    first: dict[int, Any] = {}
    second: dict[int, Any] = {}

    async def scenario(client: Any) -> None:
        async def one(i: int, into: dict[int, Any]) -> None:
            into[i] = await call_with_key(client, "charge",
                                          {"customer": f"many-{i}", "amount": i + 1}, f"many-{i}")

        for into in (first, second):
            async with anyio.create_task_group() as tg:
                for i in range(100):
                    tg.start_soon(one, i, into)

    run(world, scenario)
    assert not any(r.is_error for r in [*first.values(), *second.values()])
    assert all(meta(second[i])["effectlog/replayed"] for i in range(100))
    assert all(second[i].structured_content == first[i].structured_content for i in range(100))
    assert len({str(first[i].structured_content["charge_id"]) for i in range(100)}) == 100
    assert sum(len(world.charges(f"many-{i}")) for i in range(100)) == 100


def test_the_mcp_provider_looks_effects_up_with_the_configured_lookup_tool(world: World) -> None:
    from consumers.providers import load_provider
    from effectlog.provider import LookupStatus

    run(world, lambda client: call_with_key(client, "charge", {"customer": "lk-1", "amount": 3},
                                            "lk-key"))
    provider = load_provider(f"mcp://{world.config}")
    try:
        found = provider.lookup("agent:lk-key:payment.charge:customer:lk-1")
        assert found.status is LookupStatus.CONFIRMED and found.outcome is not None
        assert found.outcome.result["structuredContent"]["customer"] == "lk-1"
        missing = provider.lookup("agent:lk-none:payment.charge:customer:lk-1")
        assert missing.status is LookupStatus.NOT_FOUND
        no_tool = provider.lookup("agent:x:email.send:mailto:a@example.com")
        assert no_tool.status is LookupStatus.UNAVAILABLE
        again = provider.execute("customer:lk-2", "h", "agent:lk-2:payment.charge:customer:lk-2",
                                 7, {"customer": "lk-2", "amount": 4})
        assert again["structuredContent"]["customer"] == "lk-2"
        [sent] = world.charges("lk-2")
        assert sent["arguments"]["fencing_epoch"] == 7
        assert sent["arguments"]["idempotency_key"] == "agent:lk-2:payment.charge:customer:lk-2"
    finally:
        provider.close()  # type: ignore[attr-defined]


# -- proxies of their own --------------------------------------------------------------------


def test_over_stdio_with_the_handshake_era_client_a_repeat_is_replayed(tmp_path: Path) -> None:
    db = tmp_path / "upstream.db"
    proxy = StdioProxy(tmp_path, f"sqlite:///{tmp_path}/log.db", write_config(tmp_path, db),
                       "--run-id", "legacy")

    async def scenario() -> None:
        async with agent(proxy, mode="legacy") as client:
            first = await client.call_tool("charge", {"customer": "lg-1", "amount": 2},
                                           meta={"idempotencyKey": "lg"})
            again = await client.call_tool("charge", {"customer": "lg-1", "amount": 2},
                                           meta={"idempotencyKey": "lg"})
            assert again.structured_content == first.structured_content
            assert meta(again)["effectlog/replayed"] is True

    anyio.run(scenario)
    assert len(calls(db, "charge")) == 1


def test_no_answer_in_time_leaves_the_effect_unknown_and_it_is_not_sent_again(
        tmp_path: Path) -> None:
    db = tmp_path / "upstream.db"
    log_url = f"sqlite:///{tmp_path}/log.db"
    proxy = StdioProxy(tmp_path, log_url, write_config(tmp_path, db, timeout="1s"))
    key = "agent:slow-1:payment.slow:customer:sl-1"

    async def scenario() -> None:
        async with agent(proxy) as client:
            for _ in range(2):
                result = await client.call_tool("slow_charge", {"customer": "sl-1", "amount": 1,
                                                                "delay_s": 4},
                                                meta={"idempotencyKey": "slow-1"})
                assert result.is_error and "in doubt" in text(result), text(result)
                assert meta(result)["effectlog/state"] == "UNKNOWN"
                assert "effectlog approve" in text(result)  # no lookup tool: a person decides

    anyio.run(scenario)
    with open_log(log_url) as log:
        current = LogView(log).current(key)
    assert current is not None and current.state is State.UNKNOWN
    assert len(calls(db, "slow_charge")) == 1


def test_passthrough_read_only_refuses_tools_that_are_neither_effects_nor_read_only(
        tmp_path: Path) -> None:
    db = tmp_path / "upstream.db"
    config = write_config(tmp_path, db, proxy='[proxy]\npassthrough = "read-only"\n',
                          effects='[effects.charge]\nkind = "payment.charge"\n'
                                  'target = "customer:{customer}"\n')
    proxy = StdioProxy(tmp_path, f"sqlite:///{tmp_path}/log.db", config)

    async def scenario() -> None:
        async with agent(proxy) as client:
            refused = await client.call_tool("send_email", {"to": "x@example.com", "subject": "s"})
            assert refused.is_error and "neither an effect" in text(refused)
            allowed = await client.call_tool("get_balance", {"customer": "p"})
            assert not allowed.is_error

    anyio.run(scenario)
    assert not calls(db, "send_email")


def test_an_effect_a_person_approves_for_retry_is_sent_again_on_the_next_call(
        tmp_path: Path) -> None:
    db = tmp_path / "upstream.db"
    log_url = f"sqlite:///{tmp_path}/log.db"
    proxy = StdioProxy(tmp_path, log_url, write_config(tmp_path, db, timeout="1s"))
    key = "agent:ap-1:payment.charge:customer:ap"
    args = {"customer": "ap", "amount": 9}
    (tmp_path / "hold").touch()  # the upstream holds its answer past the proxy's timeout

    async def scenario() -> None:
        async with agent(proxy) as client:
            doubt = await call_with_key(client, "charge", args, "ap-1")
            assert doubt.is_error and meta(doubt)["effectlog/state"] == "UNKNOWN", text(doubt)
            (tmp_path / "hold").unlink()
            (tmp_path / "release").touch()
            decided = cli(log_url, tmp_path / "state", "approve", key, "--decision", "retry",
                          "--by", "ops", "--reason", "the charge is not in the dashboard")
            assert decided.returncode == 0, decided.stderr
            retried = await call_with_key(client, "charge", args, "ap-1")
            assert not retried.is_error and meta(retried)["effectlog/replayed"] is False
            again = await call_with_key(client, "charge", args, "ap-1")
            assert again.structured_content == retried.structured_content

    anyio.run(scenario)
    assert len(calls(db, "charge")) == 2  # the first (lost) and the approved retry


def test_the_proxy_connects_again_when_the_upstream_comes_back(tmp_path: Path) -> None:
    from mcp.shared.exceptions import MCPError

    db = tmp_path / "upstream.db"
    upstream = Background.upstream(tmp_path, db)
    proxy = StdioProxy(tmp_path, f"sqlite:///{tmp_path}/log.db",
                       write_config(tmp_path, db, url=upstream.url))
    outcomes: list[bool] = []

    async def scenario() -> None:
        nonlocal upstream
        async with agent(proxy) as client:
            assert not (await client.call_tool("get_balance", {"customer": "r"})).is_error
            upstream.kill()
            upstream = Background([*upstream.process.args[1:]], tmp_path / "again.err",
                                  upstream.port)
            for _ in range(3):  # the first call may meet the lost connection
                try:
                    result = await client.call_tool("get_balance", {"customer": "r"})
                except MCPError:
                    outcomes.append(False)
                    continue
                outcomes.append(not result.is_error)
                if outcomes[-1]:
                    break

    try:
        anyio.run(scenario)
    finally:
        upstream.stop()
    assert outcomes[-1] is True and len(outcomes) <= 2, outcomes
