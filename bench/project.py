"""Projector throughput and ``effectlog get`` latency, each against a raw baseline.

1. Builds a SQLite log of 200,000 events (50,000 effects x 4 transitions, plus some
   events the projector must reject) in a temporary directory.
2. Baseline: read the same records in the same batches, decode each with the shared Avro
   codec (fastavro), blind-overwrite key -> value in a rocksdict WriteBatch per batch.
   effectlog: the real projector (checks, snapshots, index, counters, offsets).
3. Process latency of ``.venv/bin/effectlog get KEY --json`` (which first checks that the
   projection is not behind the log) against ``python -c pass``, with ``--no-catch-up``
   (the check's cost is the difference) and ``effectlog --help`` (the click CLI) beside
   it; the commands take turns, so load changes hit all alike. Bytecode is cached as in
   an installed package.

The last line gives both effectlog figures as ratios to their baselines, with the
absolute figures.

Usage: python bench/project.py [--events N] [--runs N] [--get-runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rocksdict import Options, Rdict, WriteBatch

from effectlog.codec import event_codec
from effectlog.log import EVENTS, EventLog, open_log
from effectlog.machine import new_effect
from projections.projector import DecoderChoice, Projector, ProjectorSettings

BATCH = ProjectorSettings().batch_size
BIN = Path(sys.executable).parent


def build_log(url: str, count: int) -> tuple[EventLog, str]:
    """``count`` events: create/reserve/dispatch/record per effect, 1% stale re-sends.
    Returns the log and the key of the first effect (complete: SUCCEEDED)."""
    log = open_log(url)
    codec = event_codec()
    chunk: list[tuple[str, bytes]] = []
    written, i, first = 0, 0, ""
    while written < count:
        create = new_effect(f"op{i}", "email.send", f"mailto:user{i}@example.com",
                            {"to": f"user{i}@example.com", "n": i}, "bench")
        key = create.idempotency_key
        first = first or key
        rec = create.to_record()
        records = [dict(rec)]
        rec.update(payload=None, transition="RESERVE", state="RESERVED", fencing_epoch=1,
                   event_id=f"{i}r", occurred_at=rec["occurred_at"] + 1)
        records.append(dict(rec))
        rec.update(transition="DISPATCH", state="DISPATCHED", attempt=1, event_id=f"{i}d",
                   occurred_at=rec["occurred_at"] + 1)
        records.append(dict(rec))
        if i % 100 == 99:  # a stale, duplicate reserve: rejected
            records.append(records[1])
        rec.update(transition="RECORD", state="SUCCEEDED", event_id=f"{i}s",
                   outcome={"status": "SUCCEEDED", "result_json": f'{{"id":{i}}}',
                            "source": "worker"}, occurred_at=rec["occurred_at"] + 1)
        records.append(dict(rec))
        for r in records[: count - written]:
            chunk.append((key, codec.encode(r)))
        written += min(len(records), count - written)
        i += 1
        if len(chunk) >= 5000:
            log.append_many(EVENTS, chunk)
            chunk = []
    if chunk:
        log.append_many(EVENTS, chunk)
    return log, first


def baseline(log: EventLog, path: Path) -> float:
    """Events/s of read + decode + blind WriteBatch overwrite."""
    codec = event_codec()
    db = Rdict(str(path), Options(raw_mode=True))
    start = time.perf_counter()
    offset = total = 0
    while True:
        records = log.read(EVENTS, 0, offset, BATCH)
        if not records:
            break
        batch = WriteBatch(raw_mode=True)
        for record in records:
            codec.decode(record.value)
            batch.put(record.key.encode("utf-8"), record.value)
        db.write(batch)
        offset = records[-1].offset + 1
        total += len(records)
    elapsed = time.perf_counter() - start
    db.close()
    return total / elapsed


def projector(log: EventLog, state: Path, decoder: DecoderChoice = "auto") -> float:
    """Events/s of the real projector from an empty projection to the log's end."""
    with Projector(log, state, ProjectorSettings(decoder=decoder)) as proj:
        start = time.perf_counter()
        progress = proj.run(once=True)
        elapsed = time.perf_counter() - start
    return progress.records / elapsed


def median_seconds(commands: dict[str, list[str]], runs: int,
                   env: dict[str, str]) -> dict[str, float]:
    """Median wall time of each command, the commands taking turns ``runs`` times."""
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            start = time.perf_counter()
            subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=env)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(samples) for name, samples in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="throughput runs (best is kept)")
    parser.add_argument("--get-runs", type=int, default=30)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="effectlog-bench-"))
    try:
        url = f"sqlite:///{work}/log.db"
        started = time.perf_counter()
        log, key = build_log(url, args.events)
        print(f"log: {args.events} events in {time.perf_counter() - started:.1f}s ({url})")
        base_rates, rates, inline_rates = [], [], []
        for run in range(args.runs):  # interleaved, so load changes hit all alike
            base_rates.append(baseline(log, work / f"baseline-{run}"))
            rates.append(projector(log, work / f"state-{run}"))
            inline_rates.append(projector(log, work / f"inline-{run}", "inline"))
        base, ours, inline = max(base_rates), max(rates), max(inline_rates)
        print(f"baseline (read + fastavro decode + blind WriteBatch): {base:,.0f} events/s")
        print(f"projector, decoding in this process only: {inline:,.0f} events/s "
              f"({inline / base:.2f}x)")
        print(f"projector, default (decoding in a helper process while catching up): "
              f"{ours:,.0f} events/s ({ours / base:.2f}x)")
        # Like an installed package, use compiled bytecode: cache it outside the tree even
        # where PYTHONDONTWRITEBYTECODE is set (the first run below compiles it).
        env = {**os.environ, "EFFECTLOG_LOG": url, "EFFECTLOG_STATE": str(work / "state-0"),
               "PYTHONPYCACHEPREFIX": str(work / "pycache")}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        check = subprocess.run([str(BIN / "effectlog"), "get", key, "--json"], env=env,
                               capture_output=True, text=True, check=True)
        shown: dict[str, Any] = json.loads(check.stdout)
        assert shown["state"] == "SUCCEEDED", shown
        get = [str(BIN / "effectlog"), "get", key, "--json"]
        medians = median_seconds({"get": get, "raw": [*get, "--no-catch-up"],
                                  "help": [str(BIN / "effectlog"), "--help"],
                                  "pass": [sys.executable, "-c", "pass"]}, args.get_runs, env)
        get_s, pass_s = medians["get"], medians["pass"]
        print(f"`effectlog get KEY --json`: median {get_s * 1000:.1f} ms, {get_s / pass_s:.2f}x "
              f"`python -c pass` ({pass_s * 1000:.1f} ms; target <= 2x); with --no-catch-up "
              f"{medians['raw'] * 1000:.1f} ms (the is-it-behind check costs "
              f"{(get_s - medians['raw']) * 1000:.1f} ms); `effectlog --help` (the click CLI) "
              f"{medians['help'] * 1000:.1f} ms, {medians['help'] / pass_s:.2f}x")
        log.close()
        print(f"effectlog projector: {ours / base:.2f}x the baseline (target >= 0.7), "
              f"{ours:,.0f} events/s; effectlog get KEY --json: {get_s / pass_s:.2f}x "
              f"python -c pass (target <= 2x), {get_s * 1000:.1f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
