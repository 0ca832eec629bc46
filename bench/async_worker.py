"""AsyncWorker on SQLite: event-loop lateness and throughput against 8 sync worker threads.

One asyncio loop runs 100 concurrent effects (``AsyncWorker.perform``, an ``async def``
provider call that answers at once, so the log is the bottleneck). In a second run of the same
load a ticker in the same loop sleeps 1 ms at a time and records how late each wake-up is; the
floor is the same ticker on an idle loop for a second after each round (on a shared machine the
neighbours' load shows in both). The raw baseline for throughput is 8 threads, each with its
own sync ``Worker`` on the same ``SqliteLog`` object, performing the same effects. Rounds
alternate between the three on fresh files; medians are reported.

Usage: python bench/async_worker.py [--effects N] [--concurrency C] [--threads T] [--rounds R]
                                   [--pool P]   (the AsyncWorker's threads; default 1 on SQLite)
The last line is the async throughput as a ratio to the threads' (target >= 0.8) with both
absolute rates, and the ticker's max and p99 lateness (target: max < 5 ms) beside the idle
floor's.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import median, percentile, threaded

from effectlog.log.sqlite import SqliteLog
from effectlog.worker import AsyncEffectCall, AsyncWorker, Worker

KIND = "email.send"


def target(i: int) -> str:
    return f"mailto:u{i}@example.com"


async def ticker(stop: asyncio.Event, lateness: list[float]) -> None:
    """Sleep 1 ms at a time until ``stop``; record how late each wake-up was (seconds)."""
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lateness.append(time.perf_counter() - start - 0.001)


async def async_round(log: SqliteLog, prefix: str, effects: int, concurrency: int,
                      lateness: list[float] | None, pool: int | None) -> float:
    """Seconds for ``effects`` effects, ``concurrency`` at a time; with a ``lateness`` list the
    ticker runs beside them and records into it."""

    async def send(call: AsyncEffectCall) -> dict[str, str]:
        return {"id": call.key}

    async with AsyncWorker(log, f"aio-{prefix}", threads=pool) as worker:
        async def lane(lane_no: int) -> None:
            for i in range(lane_no, effects, concurrency):
                await worker.perform(f"{prefix}-{i}", KIND, target(i), {"n": i}, send)

        stop = asyncio.Event()
        tick = None if lateness is None else asyncio.create_task(ticker(stop, lateness))
        await asyncio.sleep(0.01)  # the ticker is running before the load starts
        start = time.perf_counter()
        await asyncio.gather(*(lane(n) for n in range(concurrency)))
        elapsed = time.perf_counter() - start
        stop.set()
        if tick is not None:
            await tick
    return elapsed


async def idle_lateness(seconds: float) -> list[float]:
    lateness: list[float] = []
    stop = asyncio.Event()
    tick = asyncio.create_task(ticker(stop, lateness))
    await asyncio.sleep(seconds)
    stop.set()
    await tick
    return lateness


def threads_round(log: SqliteLog, prefix: str, effects: int, threads: int) -> float:
    """Seconds for ``effects`` effects performed by ``threads`` sync workers on one log."""

    def run(thread_no: int) -> None:
        worker = Worker(log, f"thr-{prefix}-{thread_no}")
        for i in range(thread_no, effects, threads):
            worker.perform(f"{prefix}-{i}", KIND, target(i), {"n": i},
                           lambda call: {"id": call.key})

    return threaded(threads, run)


def bench(tmp: Path, effects: int, concurrency: int, threads: int, rounds: int,
          pool: int | None) -> dict[str, Any]:
    runs: dict[str, list[float]] = {"async": [], "threads": [], "ticking": []}
    lateness: list[float] = []
    idle: list[float] = []
    round_max: list[float] = []
    for r in range(rounds):
        log = SqliteLog(tmp / f"threads{r}.db")
        runs["threads"].append(threads_round(log, f"t{r}", effects, threads))
        log.close()
        log = SqliteLog(tmp / f"async{r}.db")
        runs["async"].append(asyncio.run(async_round(log, f"a{r}", effects, concurrency, None,
                                                     pool)))
        log.close()
        log = SqliteLog(tmp / f"ticking{r}.db")
        this_round: list[float] = []
        runs["ticking"].append(asyncio.run(async_round(log, f"k{r}", effects, concurrency,
                                                       this_round, pool)))
        log.close()
        lateness += this_round
        round_max.append(max(this_round))
        idle += asyncio.run(idle_lateness(1.0))  # the floor, under the same neighbours
    return {
        "async_eps": effects / median(runs["async"]),
        "ticking_eps": effects / median(runs["ticking"]),
        "threads_eps": effects / median(runs["threads"]),
        "late_max_ms": max(lateness) * 1000, "late_p99_ms": percentile(lateness, 99) * 1000,
        "late_p50_ms": percentile(lateness, 50) * 1000,
        "round_max_ms": [m * 1000 for m in round_max], "ticks": len(lateness),
        "idle_max_ms": max(idle) * 1000, "idle_p99_ms": percentile(idle, 99) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=2000, help="effects per round and side")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pool", type=int, default=None,
                        help="the AsyncWorker's threads (default: the log's concurrent_appends, 1)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        s = bench(Path(tmp), args.effects, args.concurrency, args.threads, args.rounds,
                  args.pool)
    ratio = s["async_eps"] / s["threads_eps"]
    print(f"sqlite {args.threads} threads, sync Worker each   {s['threads_eps']:8.0f} effects/s")
    print(f"sqlite {args.concurrency} concurrent effects, 1 loop {s['async_eps']:8.0f} effects/s "
          f"({ratio:.2f}x the threads; target >= 0.8)")
    print(f"the same with the 1 ms ticker running  {s['ticking_eps']:8.0f} effects/s "
          f"({s['ticking_eps'] / s['threads_eps']:.2f}x; the ticker's wake-ups cost the loop too)")
    print(f"1 ms ticker in that loop: {s['ticks']} wake-ups, late p50 {s['late_p50_ms']:.2f} ms, "
          f"p99 {s['late_p99_ms']:.2f} ms, max {s['late_max_ms']:.2f} ms (target < 5 ms); "
          f"max per round {', '.join(f'{m:.2f}' for m in s['round_max_ms'])} ms")
    print(f"same ticker, idle loop: p99 {s['idle_p99_ms']:.2f} ms, max {s['idle_max_ms']:.2f} ms")
    print(f"async_worker: {ratio:.2f}x {args.threads} sync threads ({s['async_eps']:.0f} vs "
          f"{s['threads_eps']:.0f} effects/s, {args.concurrency} concurrent effects); ticker "
          f"late max {s['late_max_ms']:.2f} ms, p99 {s['late_p99_ms']:.2f} ms (idle loop: max "
          f"{s['idle_max_ms']:.2f} ms, p99 {s['idle_p99_ms']:.2f} ms)")


if __name__ == "__main__":
    main()
