"""The console's list page at a million effects: first, middle and last page.

Fill (bench-only, not measured): N CREATE events appended to a SQLite log in large
batches, one millisecond apart, then a real ``effectlog serve`` projects them (RocksDB,
the state/time index) and serves the console.

Measured: ``GET /effects?state=CREATED&limit=50[&after=CURSOR]``, the console's HTML page
through the real server (console handler -> query API -> cursor page of the reader ->
Jinja2 page), at the first page, the middle (cursor after entry N/2) and the last page;
also the query API's JSON page and two filtered pages (a kind prefix held by 10% of the
effects, and a target matched by none: the page stops at the scan budget). Floor: a bare
rocksdict range scan of the same 50 index entries plus their 50 snapshot reads, at the
same positions, on the same database (opened as a secondary).

Usage: python bench/console_list.py [--effects N] [--samples N] [--dir DIR]
The last line gives the list page's p50 as a ratio to the bare range scan, and absolute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import urllib3
from _common import ROOT, percentile
from rocksdict import ReadOptions

from effectlog.codec import event_codec
from effectlog.log import open_log
from effectlog.log.base import EVENTS
from effectlog.machine import new_effect
from projections.paging import format_cursor
from projections.rocksdb import layout
from projections.rocksdb.db import INDEX, STATE, PartitionDB
from projections.rocksdb.snapshot import index_range, pack_u64
from tools.kafka.broker import free_port

PAGE = 50
KINDS = (("email.send", 35), ("payment.charge", 20), ("ticket.create", 20),
         ("browser.click", 15), ("deploy.release", 10))
HTTP = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=2, read=60))


def fill(log_url: str, n: int, base_ms: int) -> list[str]:
    """N CREATE events, effect i at ``base_ms + i``; returns the keys in index order."""
    kinds = [k for k, weight in KINDS for _ in range(weight)]
    codec = event_codec()
    log = open_log(log_url)
    keys: list[str] = []
    batch: list[tuple[str, bytes]] = []
    start = time.monotonic()
    try:
        for i in range(n):
            kind = kinds[i % len(kinds)]
            event = new_effect(f"bench-{i:07d}", kind, f"acct:cus_{i % 9973}", {"n": i}, "w")
            event = replace(event, created_at=base_ms + i, occurred_at=base_ms + i)
            keys.append(event.idempotency_key)
            batch.append((event.idempotency_key, codec.encode(event.to_record())))
            if len(batch) == 20_000 or i == n - 1:
                log.append_many(EVENTS, batch)
                batch = []
            if (i + 1) % 100_000 == 0:
                print(f"  filled {i + 1:,} effects ({time.monotonic() - start:.0f} s)",
                      file=sys.stderr)
    finally:
        log.close()
    return keys


def serve(log_url: str, state: Path, port: int, err: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "effectlog.cli.main", "--log", log_url, "--state", str(state),
         "serve", "--http", f"127.0.0.1:{port}", "--stuck-after", "1h", "--poll", "1h",
         "--no-recovery"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err.open("w"))


def wait_projected(url: str, n: int, process: subprocess.Popen[bytes], err: Path) -> float:
    start = time.monotonic()
    last = 0.0
    while True:
        assert process.poll() is None, err.read_text()
        try:
            answer = HTTP.request("GET", url + "/v1/stats")
            if answer.status == 200:
                figures = json.loads(answer.data)
                done = figures["states"]["CREATED"]
                if done >= n and not any(figures["lag"].values()):
                    return time.monotonic() - start
                if time.monotonic() - last > 10:
                    print(f"  projected {done:,} of {n:,}", file=sys.stderr)
                    last = time.monotonic()
        except urllib3.exceptions.HTTPError:
            pass
        if time.monotonic() - start > 1800:
            raise SystemExit("the projection did not catch up within 30 minutes")
        time.sleep(1)


def timed_get(url: str, samples: int) -> list[float]:
    for _ in range(5):  # warm up: templates compiled, connections open, caches filled
        HTTP.request("GET", url)
    out = []
    for _ in range(samples):
        start = time.perf_counter()
        answer = HTTP.request("GET", url)
        elapsed = time.perf_counter() - start
        assert answer.status == 200, (answer.status, answer.data[:300])
        out.append(elapsed)
    return out


def raw_scan(part: PartitionDB, lower: bytes, upper: bytes, skip: int) -> int:
    """The floor: PAGE index entries from ``lower`` and their snapshots, bare rocksdict."""
    opts = ReadOptions()
    opts.set_iterate_upper_bound(upper)
    it = part.cf[INDEX].iter(opts)
    it.seek(lower)
    state = part.cf[STATE]
    got = 0
    while it.valid() and got < PAGE:
        state.get(it.key()[skip + 8:])
        got += 1
        it.next()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--effects", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--dir", type=Path, default=None, help="where to keep the log and state")
    args = parser.parse_args()
    n, samples = args.effects, args.samples
    work = args.dir or Path(tempfile.mkdtemp(prefix="console-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    log_url, state = f"sqlite:///{work}/log.db", work / "state"
    base_ms = int(time.time() * 1000) - n - 3_600_000
    print(f"filling {n:,} effects into {work}", file=sys.stderr)
    keys = fill(log_url, n, base_ms)
    port = free_port()
    url, err = f"http://127.0.0.1:{port}", work / "serve.err"
    process = serve(log_url, state, port, err)
    try:
        took = wait_projected(url, n, process, err)
        print(f"projected {n:,} effects in {took:.0f} s", file=sys.stderr)
        positions = {"first": None, "middle": n // 2, "last": n - PAGE - 1}
        cursors = {name: None if i is None else format_cursor((base_ms + i, keys[i]))
                   for name, i in positions.items()}
        generation = layout.current_generation(state)
        assert generation is not None
        part = PartitionDB(0, layout.partition_dir(generation, 0), "secondary")
        prefix, upper = index_range("CREATED", None)
        rows = []
        for name, cursor in cursors.items():
            after = "" if cursor is None else f"&after={quote(cursor, safe='')}"
            page = timed_get(f"{url}/effects?state=CREATED&limit={PAGE}{after}", samples)
            api = timed_get(f"{url}/v1/effects?state=CREATED&limit={PAGE}{after}", samples)
            i = positions[name]
            lower = prefix if i is None else \
                prefix + pack_u64(base_ms + i) + keys[i].encode("utf-8") + b"\x00"
            assert raw_scan(part, lower, upper, len(prefix)) == PAGE
            floor = []
            for _ in range(samples * 5):
                start = time.perf_counter()
                raw_scan(part, lower, upper, len(prefix))
                floor.append(time.perf_counter() - start)
            rows.append((name, page, api, floor))
        filtered = {
            "kind=deploy (10% match)": timed_get(
                f"{url}/effects?state=CREATED&limit={PAGE}&kind=deploy", samples // 4),
            "target=nobody (0 match, scan budget)": timed_get(
                f"{url}/effects?state=CREATED&limit={PAGE}&target=nobody", samples // 4),
        }
        part.close()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)

    def ms(seconds: float) -> str:
        return f"{seconds * 1000:.2f}"

    print(f"\n{n:,} effects in CREATED, pages of {PAGE}, {samples} requests each "
          f"(p50 / p99 in ms)")
    print(f"{'page':<8} {'console HTML page':>20} {'query API JSON':>18} {'bare range scan':>18}"
          f" {'ratio p50':>10}")
    ratios = []
    for name, page, api, floor in rows:
        ratio = percentile(page, 50) / percentile(floor, 50)
        ratios.append(ratio)
        print(f"{name:<8} {ms(percentile(page, 50)):>9} / {ms(percentile(page, 99)):<8} "
              f"{ms(percentile(api, 50)):>8} / {ms(percentile(api, 99)):<7} "
              f"{ms(percentile(floor, 50)):>8} / {ms(percentile(floor, 99)):<7} {ratio:>9.0f}x")
    for label, times in filtered.items():
        print(f"filtered {label}: p50 {ms(percentile(times, 50))} ms, "
              f"p99 {ms(percentile(times, 99))} ms")
    p50 = {name: percentile(page, 50) for name, page, _, _ in rows}
    floors = {name: percentile(floor, 50) for name, _, _, floor in rows}
    print(f"console list page at {n:,} effects: p50 first/middle/last "
          f"{ms(p50['first'])}/{ms(p50['middle'])}/{ms(p50['last'])} ms = "
          f"{min(ratios):.0f}-{max(ratios):.0f}x a bare RocksDB range scan of {PAGE} "
          f"({ms(floors['first'])}/{ms(floors['middle'])}/{ms(floors['last'])} ms)")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
