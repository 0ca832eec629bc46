"""One chaos worker process: ``--threads`` threads performing effects on a sliding window of
``--keys`` keys until SIGTERM, through the judge of the serve members at ``--servers``.

Each perform prints one JSON line: the op, and its outcome (``called``: this thread called
the provider; ``replayed``: the recorded result came back; else the error's type). The provider
is the fake with ``dedupe=0``: it performs and counts every call it receives.

    python -m tests.chaos.worker_main --log URL --servers URL,URL --provider fake:///p.db?dedupe=0
        --id W [--threads 4] [--keys 40] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from typing import Any

from consumers.providers import load_provider
from effectlog.errors import EffectlogError
from effectlog.judge.client import ClusterJudge
from effectlog.log import open_log
from effectlog.provider import ProviderError
from effectlog.worker import Worker

KIND, TARGET = "payment.charge", "acct:chaos"
SLIDE_S = 1.5  # every SLIDE_S the window of keys moves on by a quarter: fresh keys, and replays
_print = threading.Lock()


def key_number(rng: random.Random, keys: int) -> int:
    base = int(time.time() / SLIDE_S) * max(1, keys // 4)
    return base + rng.randrange(keys)


def say(**fields: Any) -> None:
    with _print:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()


def work(worker: Worker, provider: Any, rng: random.Random, keys: int,
         stop: threading.Event) -> None:
    called: list[bool] = []

    def charge(call: Any) -> Any:
        called.append(True)
        return provider.execute(call.event.target, call.payload_hash, call.key,
                                call.fencing_epoch, call.payload)

    while not stop.is_set():
        n = key_number(rng, keys)
        called.clear()
        try:
            worker.perform(f"chaos-{n}", KIND, TARGET, {"n": n}, charge)
            outcome = "called" if called else "replayed"
        except (EffectlogError, ProviderError) as exc:
            outcome = ("called:" if called else "") + type(exc).__name__
        say(op=n, outcome=outcome)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--log", required=True)
    parser.add_argument("--servers", required=True)
    parser.add_argument("--provider", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log = open_log(args.log)
    judge = ClusterJudge(args.servers, timeout_s=5, wait_s=5, retry_for_s=8)
    provider = load_provider(args.provider)
    threads = []
    for t in range(args.threads):
        worker = Worker(log, f"{args.id}-t{t}", judge=judge)
        rng = random.Random(args.seed * 1000 + t)
        thread = threading.Thread(target=work, args=(worker, provider, rng, args.keys, stop),
                                  daemon=True)
        thread.start()
        threads.append(thread)
    while not stop.wait(0.2):
        pass
    for thread in threads:
        thread.join(20)
    judge.close()
    log.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
