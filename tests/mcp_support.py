"""What the ``effectlog mcp`` tests share: a config for the counting upstream
(:mod:`tests.mcp_upstream`), ``effectlog mcp`` and upstream processes, and the SDK's client as
the agent, connected to the proxy over stdio (the client spawns it) or streamable HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters

from tests.kafka_broker import free_port

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 30.0

EFFECTS = """
[effects.charge]
kind = "payment.charge"
target = "customer:{customer}"
exclude = ["note"]
key_argument = "idempotency_key"
epoch_argument = "fencing_epoch"
lookup = "get_charge_by_idempotency_key"

[effects.send_email]
kind = "email.send"
target = "mailto:{to}"
exclude = ["trace_id"]
operation_id = "message_id"

[effects.slow_charge]
kind = "payment.slow"
target = "customer:{customer}"
"""


def upstream_command(db: Path) -> list[str]:
    return [sys.executable, "-m", "tests.mcp_upstream", "--db", str(db)]


def write_config(tmp: Path, db: Path, *, url: str | None = None, timeout: str = "20s",
                 effects: str = EFFECTS, proxy: str = "") -> Path:
    """A config for the counting upstream at ``db`` (spawned, or at ``url``)."""
    where = f"url = {json.dumps(url)}" if url else \
        f"command = {json.dumps(upstream_command(db))}\ncwd = {json.dumps(str(REPO))}"
    path = tmp / "effects.toml"
    path.write_text(f"[upstream]\n{where}\ntimeout = {json.dumps(timeout)}\n\n{proxy}\n{effects}")
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def proxy_args(log_url: str, config: Path, *extra: str) -> list[str]:
    """``effectlog mcp`` as a command line."""
    return ["-m", "effectlog.cli.main", "--log", log_url, "mcp", "--config", str(config), *extra]


def wait_for_port(port: int, process: subprocess.Popen[Any], err: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"exited {process.returncode}: {err.read_text()[-2000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} within {START_TIMEOUT_S}s: {err.read_text()}")


class Background:
    """A server process listening on 127.0.0.1 (an HTTP proxy or upstream)."""

    def __init__(self, args: Sequence[str], err: Path, port: int) -> None:
        self.port = port
        self.err = err
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.process = subprocess.Popen([sys.executable, *args], cwd=REPO, env=env(),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=err.open("w"))
        try:
            wait_for_port(port, self.process, err)
        except BaseException:
            self.stop()
            raise

    @classmethod
    def upstream(cls, tmp: Path, db: Path) -> Background:
        port = free_port()
        return cls([*upstream_command(db)[1:], "--http", str(port)], tmp / "upstream.err", port)

    @classmethod
    def proxy(cls, tmp: Path, log_url: str, config: Path, *extra: str,
              name: str = "proxy") -> Background:
        port = free_port()
        return cls(proxy_args(log_url, config, "--http", f"127.0.0.1:{port}", *extra),
                   tmp / f"{name}.err", port)

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.err.read_text()


class StdioProxy:
    """``effectlog mcp`` spawned by the agent's SDK client over stdio; its pid is written to a
    file first (``exec`` keeps it), so a test can SIGKILL it."""

    def __init__(self, tmp: Path, log_url: str, config: Path, *extra: str,
                 name: str = "proxy") -> None:
        self.pid_file = tmp / f"{name}.pid"
        self.pid_file.unlink(missing_ok=True)
        self.err = tmp / f"{name}.err"
        command = " ".join(_quote(a) for a in [sys.executable, *proxy_args(log_url, config,
                                                                          *extra)])
        self.params = StdioServerParameters(
            command="/bin/sh", cwd=str(REPO), env=env(),
            args=["-c", f"echo $$ > {_quote(str(self.pid_file))}; exec {command} "
                        f"2>>{_quote(str(self.err))}"])

    def kill(self) -> None:
        pid = int(self.pid_file.read_text())
        os.kill(pid, signal.SIGKILL)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


@asynccontextmanager
async def agent(server: StdioProxy | str, mode: Literal["auto", "legacy"] = "auto"
                ) -> AsyncIterator[Client]:
    """The SDK's client, connected to the proxy (stdio) or to a URL."""
    target = server.params if isinstance(server, StdioProxy) else server
    async with Client(target, cache=None, mode=mode) as client:
        yield client


class KeyedCall(types.Request[dict[str, Any], Literal["tools/call"]]):
    """``tools/call`` with SEP-3182's ``idempotencyKey`` beside name and arguments."""

    method: Literal["tools/call"] = "tools/call"
    params: dict[str, Any]


async def call_with_key(client: Client, name: str, arguments: dict[str, Any], key: str,
                        meta: dict[str, Any] | None = None) -> types.CallToolResult:
    """A tool call carrying a SEP-3182 idempotency key in its params, as a client that
    implements the proposal sends it."""
    params: dict[str, Any] = {"name": name, "arguments": arguments, "idempotencyKey": key}
    if meta:
        params["_meta"] = meta
    return await client.session.send_request(KeyedCall(params=params), types.CallToolResult)


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def meta(result: types.CallToolResult) -> dict[str, Any]:
    return dict(result.meta or {})


async def wait_for(condition: Any, within_s: float, what: str) -> None:
    """Poll ``condition()`` until true; AssertionError after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {within_s}s")
        await anyio.sleep(0.05)


def cli(log_url: str, state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """One ``effectlog`` command, as a person runs it."""
    return subprocess.run([sys.executable, "-m", "effectlog.cli.main", "--log", log_url,
                           "--state", str(state), *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
