"""The naive worker process: retry-on-restart without effectlog, for contrast.

It calls the provider with the job's stable key and acknowledges the job afterwards; a job
that did not complete (the worker died, the call timed out) is simply run again by the
queue. It sees the same workload, the same crash points and the same provider faults as
the effectlog workers.

    python -m effectlog.cli.demo.naive --provider SPEC
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from effectlog.cli.demo.workload import NAIVE_POINT
from effectlog.keys import make_key, payload_hash
from effectlog.provider import Provider, ProviderError


def run_job(provider: Provider, job: dict[str, Any]) -> dict[str, Any]:
    """Run one delivery: call the provider, then acknowledge."""
    point = NAIVE_POINT.get(job.get("crash") or "")
    if point == "before_call":
        os.kill(os.getpid(), signal.SIGKILL)
    key = make_key(job["op"], job["kind"], job["target"])
    try:
        provider.execute(job["target"], payload_hash(job["payload"]), key, 0, job["payload"])
        if job.get("slow_s"):
            time.sleep(float(job["slow_s"]))
        if job.get("timeout"):
            return {"ack": False, "status": "timeout"}  # the queue will run it again
    except ProviderError as exc:
        return {"ack": False, "status": "error", "detail": str(exc)[:200]}
    if point == "after_call":
        os.kill(os.getpid(), signal.SIGKILL)
    return {"ack": True, "status": "succeeded"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="naive demo worker process")
    parser.add_argument("--provider", required=True)
    parser.add_argument("--id", default="naive")
    args = parser.parse_args(argv)
    from consumers.providers import load_provider

    provider = load_provider(args.provider)
    for line in sys.stdin:
        sys.stdout.write(json.dumps(run_job(provider, json.loads(line))) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
