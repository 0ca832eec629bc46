"""``effectlog mcp`` SIGKILLed after it forwarded a tool call and before it recorded the
answer: the restarted proxy answers the same call "in doubt" without calling the upstream,
the reconciler settles it through the upstream's lookup tool (``--provider mcp:``), and the
call then returns the recorded result. The upstream counts every call it receives: one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import pytest
from mcp import Client

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
    wait_for,
    write_config,
)
from tests.mcp_upstream import calls

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

CHARGE = {"customer": "c-42", "amount": 1200}


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    """The counting upstream's database; its ``charge`` holds the answer until released."""
    path = tmp_path / "upstream.db"
    (tmp_path / "hold").touch()
    yield path
    (tmp_path / "release").touch()  # an orphaned upstream still holding: let it end


async def kill_mid_call(server: StdioProxy | str, send: Callable[[Client], Awaitable[Any]],
                        db: Path, kill: Callable[[], None]) -> None:
    """Send a call through the proxy, wait until the upstream received it (it holds the
    answer), then SIGKILL the proxy: forwarded, the answer not recorded."""
    async def sending(client: Client) -> None:
        await send(client)

    with pytest.raises(Exception):  # noqa: B017 - the client's connection dies with the proxy
        async with agent(server) as client, anyio.create_task_group() as tg:
            tg.start_soon(sending, client)
            await wait_for(lambda: len(calls(db, "charge")) == 1, 30, "the call arrives")
            kill()


def settle(log_url: str, tmp: Path, config: Path) -> list[str]:
    """project, recover and reconcile --once through the CLI; the reconcile JSON lines."""
    state = tmp / "state"
    for args in (("project", "--once", "--quiet"),
                 ("recover", "--once", "--stuck-after", "0s", "--command-timeout", "0s"),
                 ("reconcile", "--once", "--json", "--provider", f"mcp://{config}")):
        done = cli(log_url, state, *args)
        assert done.returncode == 0, f"{args[0]} exited {done.returncode}: {done.stderr}"
    return done.stdout.splitlines()


def state_of(log_url: str, key: str) -> State | None:
    with open_log(log_url) as log:
        current = LogView(log).current(key)
    return current.state if current else None


def test_a_killed_stdio_proxy_leaves_the_call_in_doubt_until_the_lookup_tool_settles_it(
        tmp_path: Path, db: Path) -> None:
    log_url = f"sqlite:///{tmp_path}/log.db"
    config = write_config(tmp_path, db)
    key = "agent:crash-1.1:payment.charge:customer:c-42"

    async def scenario() -> None:
        first = StdioProxy(tmp_path, log_url, config, "--run-id", "crash-1", name="first")
        await kill_mid_call(first, lambda client: client.call_tool("charge", CHARGE), db,
                            first.kill)
        assert state_of(log_url, key) is State.DISPATCHED

        second = StdioProxy(tmp_path, log_url, config, "--run-id", "crash-1", name="second")
        async with agent(second) as client:
            doubt = await client.call_tool("charge", CHARGE)
            assert doubt.is_error and "in doubt" in text(doubt) and key in text(doubt)
            assert meta(doubt)["effectlog/state"] == "DISPATCHED"
            assert "get_charge_by_idempotency_key" in text(doubt)

        lines = settle(log_url, tmp_path, config)
        assert any('"action": "record"' in line and key in line for line in lines), lines

        third = StdioProxy(tmp_path, log_url, config, "--run-id", "crash-1", name="third")
        async with agent(third) as client:
            settled = await client.call_tool("charge", CHARGE)
            assert not settled.is_error, text(settled)
            assert settled.structured_content == {"charge_id": "ch_1", "customer": "c-42",
                                                  "amount": 1200}
            assert meta(settled)["effectlog/replayed"] is True

    anyio.run(scenario)
    assert state_of(log_url, key) is State.SUCCEEDED
    assert len(calls(db, "charge")) == 1  # one charge, however many calls


def test_a_killed_http_proxy_in_front_of_an_http_upstream_settles_the_same_way(
        tmp_path: Path, db: Path) -> None:
    log_url = f"sqlite:///{tmp_path}/log.db"
    upstream = Background.upstream(tmp_path, db)
    config = write_config(tmp_path, db, url=upstream.url)
    sep_key = "3f6c2a9e-order-881"
    key = f"agent:{sep_key}:payment.charge:customer:c-42"
    try:
        async def scenario() -> None:
            first = Background.proxy(tmp_path, log_url, config, name="first")
            try:
                await kill_mid_call(first.url, lambda client: call_with_key(
                    client, "charge", CHARGE, sep_key), db, first.kill)
            finally:
                first.stop()
            assert state_of(log_url, key) is State.DISPATCHED

            second = Background.proxy(tmp_path, log_url, config, name="second")
            try:
                async with agent(second.url) as client:
                    doubt = await call_with_key(client, "charge", CHARGE, sep_key)
                    assert doubt.is_error and "in doubt" in text(doubt), text(doubt)
                    assert meta(doubt)["effectlog/idempotencyKey"] == key
                    lines = settle(log_url, tmp_path, config)
                    assert any('"action": "record"' in line for line in lines), lines
                    settled = await call_with_key(client, "charge", CHARGE, sep_key)
                    assert not settled.is_error, text(settled)
                    assert settled.structured_content == {"charge_id": "ch_1",
                                                          "customer": "c-42", "amount": 1200}
            finally:
                second.stop()

        anyio.run(scenario)
    finally:
        (tmp_path / "release").touch()
        upstream.stop()
    assert len(calls(db, "charge")) == 1


@pytest.mark.kafka
def test_on_kafka_the_call_stays_in_doubt_until_serve_settles_it_by_the_lookup_tool(
        tmp_path: Path, db: Path, kafka_url: str) -> None:
    """On Kafka the proxy reads through `effectlog serve`; a serve started with
    ``--provider mcp:`` settles the killed call by itself."""
    from tests.cluster_support import Serve, answer, wait_until

    config = write_config(tmp_path, db)
    key = "agent:kafka-1.1:payment.charge:customer:c-42"
    state = tmp_path / "state"
    quiet = Serve(tmp_path, "quiet", kafka_url, None, state, "--stuck-after", "1h")
    try:
        wait_until(lambda: len(quiet.serving()) == 6, 60, "serve owns every partition")

        async def in_doubt() -> None:
            first = StdioProxy(tmp_path, kafka_url, config, "--run-id", "kafka-1", "--server",
                               quiet.url, name="first")
            await kill_mid_call(first, lambda client: client.call_tool("charge", CHARGE), db,
                                first.kill)
            second = StdioProxy(tmp_path, kafka_url, config, "--run-id", "kafka-1", "--server",
                                quiet.url, name="second")
            async with agent(second) as client:
                doubt = await client.call_tool("charge", CHARGE)
                assert doubt.is_error and "in doubt" in text(doubt), text(doubt)
                assert meta(doubt)["effectlog/idempotencyKey"] == key

        anyio.run(in_doubt)
    finally:
        quiet.stop()

    settling = Serve(tmp_path, "settling", kafka_url, None, state, "--provider",
                     f"mcp://{config}")
    try:
        def settled() -> bool:
            status, body = answer(f"{settling.url}/v1/effects/{quote(key, safe='')}")
            return status == 200 and body.get("state") == "SUCCEEDED"

        wait_until(settled, 60, "serve's reconciler records the lookup's result")

        async def replayed() -> None:
            third = StdioProxy(tmp_path, kafka_url, config, "--run-id", "kafka-1", "--server",
                               settling.url, name="third")
            async with agent(third) as client:
                result = await client.call_tool("charge", CHARGE)
                assert not result.is_error, text(result)
                assert result.structured_content == {"charge_id": "ch_1", "customer": "c-42",
                                                     "amount": 1200}

        anyio.run(replayed)
    finally:
        settling.stop()
    assert len(calls(db, "charge")) == 1
