"""A tool call through ``effectlog mcp`` against the same call made directly to the upstream.

The upstream is the tests' counting server (``tests/mcp_upstream.py``, its ``charge`` tool
writes one SQLite row per call). The agent is the SDK's client, over stdio both ways, as an
``mcpServers`` entry runs them: directly it spawns the upstream; through the proxy it spawns
``effectlog mcp`` (log: SQLite in a temporary directory), which spawns the upstream. Measured
in one run, one after the other:

- direct: ``charge`` with a new key each call, one call at a time, then ``--concurrency``
  calls in flight;
- effect: the same through the proxy (each a new effect: created, reserved, dispatched and
  recorded on the log around the upstream call);
- replay: the effect calls again with the same keys (answered from the log, upstream not
  called);
- pass-through: the read-only ``get_balance``, forwarded as it came.

Usage: python bench/mcp_proxy.py [--calls N] [--concurrency C]
The last line gives the effect call's p50 and p99 and its calls/s as ratios to the direct
call, with the absolute figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _common import percentile
from mcp import Client, StdioServerParameters

from tests.mcp_support import StdioProxy, call_with_key, upstream_command, write_config

WARMUP = 20


async def latencies(calls: int, call: Callable[[int], Awaitable[Any]]) -> list[float]:
    """Seconds of each of ``calls`` calls, one at a time, after a warm-up."""
    for i in range(WARMUP):
        await call(-1 - i)
    out = []
    for i in range(calls):
        start = time.perf_counter()
        await call(i)
        out.append(time.perf_counter() - start)
    return out


async def rate(calls: int, concurrency: int, call: Callable[[int], Awaitable[Any]]) -> float:
    """Calls per second with ``concurrency`` calls in flight."""
    todo = iter(range(calls))

    async def lane() -> None:
        for i in todo:
            await call(i)

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(lane)
    return calls / (time.perf_counter() - start)


def charger(client: Client, run: str) -> Callable[[int], Awaitable[Any]]:
    async def call(i: int) -> None:
        result = await call_with_key(client, "charge", {"customer": f"c{i}", "amount": 5},
                                     f"{run}-{i}")
        assert not result.is_error, result
    return call


def row(name: str, samples: list[float], per_s: float | None = None) -> str:
    ms = [s * 1000 for s in samples]
    tail = f", {per_s:7.0f} calls/s concurrent" if per_s else ""
    return f"{name:14s} p50 {percentile(ms, 50):6.2f} ms, p99 {percentile(ms, 99):6.2f} ms{tail}"


async def measure(tmp: Path, calls: int, concurrency: int) -> None:
    db = tmp / "upstream.db"
    config = write_config(tmp, db)
    command = upstream_command(db)
    direct_params = StdioServerParameters(command=command[0], args=command[1:])
    proxy = StdioProxy(tmp, f"sqlite:///{tmp}/log.db", config, "--run-id", "bench")
    async with Client(direct_params, cache=None) as direct:
        run = uuid.uuid4().hex[:8]
        direct_lat = await latencies(calls, charger(direct, f"d{run}"))
        direct_rate = await rate(calls, concurrency, charger(direct, f"dc{run}"))
    async with Client(proxy.params, cache=None) as through:
        effect_lat = await latencies(calls, charger(through, f"e{run}"))
        replay_lat = await latencies(calls, charger(through, f"e{run}"))
        effect_rate = await rate(calls, concurrency, charger(through, f"ec{run}"))

        async def balance(i: int) -> None:
            await through.call_tool("get_balance", {"customer": f"c{i}"})

        pass_lat = await latencies(calls, balance)
    print(f"{calls} calls per phase, {concurrency} in flight for calls/s; log {tmp}/log.db",
          file=sys.stderr)
    print(row("direct", direct_lat, direct_rate))
    print(row("effect", effect_lat, effect_rate))
    print(row("replay", replay_lat))
    print(row("pass-through", pass_lat))
    d50, d99 = percentile(direct_lat, 50) * 1000, percentile(direct_lat, 99) * 1000
    e50, e99 = percentile(effect_lat, 50) * 1000, percentile(effect_lat, 99) * 1000
    print(f"mcp_proxy: an effect call through effectlog mcp p50 {e50 / d50:.2f}x the direct call "
          f"({e50:.2f} vs {d50:.2f} ms), p99 {e99 / d99:.2f}x ({e99:.2f} vs {d99:.2f} ms), "
          f"{effect_rate / direct_rate:.2f}x the calls/s ({effect_rate:.0f} vs "
          f"{direct_rate:.0f} at {concurrency} in flight)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mcp-bench-") as tmp:
        anyio.run(measure, Path(tmp), args.calls, args.concurrency)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    main()
